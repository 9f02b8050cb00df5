"""The seeds' training loops: ``finetune_llm_reasoning`` and ``finetune_llm_multiturn``."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rl_algos import LLMAlgorithm
from rl_algos.distributed import is_main_process, world_size
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from rl_train.metrics import MetricsLogger, plot_reward_curve

__all__ = ["finetune_llm_multiturn", "finetune_llm_reasoning", "latest_checkpoint"]

LATEST = "latest.json"


# -- several processes (torchrun / accelerate launch) ------------------------------------------
# Every process trains on its shard; only process 0 writes metrics, curves and checkpoint
# pointers, and the metrics it logs are means over processes.


def _distributed() -> bool:
    return world_size() > 1


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()


def _global_mean(row: dict[str, float], device: torch.device) -> dict[str, float]:
    """``row``'s values averaged over processes (identical keys on every process)."""
    if not _distributed():
        return row
    keys = sorted(row)
    t = torch.tensor([float(row[k]) for k in keys], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    t /= world_size()
    return dict(zip(keys, t.tolist(), strict=True))


class _Silent:
    """The metrics logger of processes other than 0: keeps the history, writes nothing."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.history.append({"step": step, **metrics})

    def truncate(self, step: int) -> None:
        self.history = [r for r in self.history if r["step"] <= step]

    def close(self) -> None:
        pass


def _logger(run: Path, **kwargs: Any) -> MetricsLogger | _Silent:
    return MetricsLogger(run, **kwargs) if is_main_process() else _Silent()


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory of a run, or None."""
    pointer = Path(run_dir) / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = Path(run_dir) / "checkpoints" / json.loads(pointer.read_text())["name"]
    return path if path.is_dir() else None


def _save(
    run_dir: Path, step: int, pop: Sequence[LLMAlgorithm], env_state: dict[str, Any] | None
) -> Path:
    """``checkpoints/step_<n>/agent_<i>`` + ``loop.json``, then the ``latest.json`` pointer.

    The pointer is replaced atomically after everything else is on disk, so a kill at any
    moment leaves the previous checkpoint the latest complete one.
    """
    root = run_dir / "checkpoints"
    name = f"step_{step:08d}"
    target = root / name
    if is_main_process() and target.exists():
        shutil.rmtree(target)
    _barrier()
    for i, agent in enumerate(pop):
        agent.save_checkpoint(target / f"agent_{i}")  # every process: ZeRO-3 gathers
    if _distributed():  # each process's data shard has its own cursor and pending batch
        rank = torch.distributed.get_rank()
        (target / f"env_rank{rank}.json").write_text(json.dumps(env_state))
        _barrier()
    if is_main_process():
        (target / "loop.json").write_text(json.dumps({"step": step, "env": env_state}))
        tmp = root / (LATEST + ".tmp")
        tmp.write_text(json.dumps({"name": name, "step": step}))
        os.replace(tmp, root / LATEST)
    _barrier()
    return target


def _row(
    metrics: Sequence[dict[str, float]], rewards: Sequence[torch.Tensor], secs: float
) -> dict[str, float]:
    keys = (
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "clip_fraction",
        "approx_kl",
        "grad_norm",
        "value_loss",
    )
    row = {
        k: sum(m[k] for m in metrics if k in m) / len(metrics)
        for k in keys
        if any(k in m for m in metrics)
    }
    row["mean_reward"] = float(torch.stack([r.float().mean() for r in rewards]).mean())
    row["step_time"] = secs
    return row


def finetune_llm_reasoning(  # noqa: PLR0912, PLR0915 - the seeds' loop, kept in one piece
    pop: Sequence[LLMAlgorithm],
    env: Any,
    init_hp: dict[str, Any] | None = None,
    save_elite: bool | None = None,
    elite_path: str | None = None,
    wb: bool = False,
    evo_steps: int | None = None,
    tournament: Any = None,
    mutation: Any = None,
    wandb_api_key: str | None = None,
    evaluation_interval: int = 10,
    max_reward: float | None = None,
    verbose: bool = True,
    accelerator: Any = None,
    max_steps: int | None = None,
    num_epochs: int | None = None,
    checkpoint_steps: int | None = None,
    checkpoint_path: str | None = None,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    eval_loop: int = 1,
    eval_fn: Callable[[LLMAlgorithm], dict[str, float]] | None = None,
    tensorboard: bool = True,
    plot: bool = True,
    log_fn: Callable[[dict[str, float]], None] | None = None,
    save_fn: Callable[[Path], None] | None = None,
) -> list[LLMAlgorithm]:
    """Train ``pop`` on a :class:`rl_envs.ReasoningGym` (AgileRL's loop, same arguments).

    Each step, every agent gets the next batch: ``get_action`` -> ``env.step`` -> ``learn``,
    then ``set_reference_policy(env.num_epochs)`` (the reference follows the actor once per
    dataset pass). Every ``evaluation_interval`` steps each agent is tested on the test split
    (``agent.test(env, eval_loop)``, greedy; plus ``eval_fn(agent)`` if given); training stops
    early once the best test reward reaches ``max_reward``. With ``evo_steps``, ``tournament``
    and ``mutation`` the population evolves (``tournament.select(pop)`` then
    ``mutation.mutation(pop)``).

    Metrics go to the console (a tqdm bar with reward, KL and step time), ``run_dir``'s
    ``metrics.csv`` / ``metrics.jsonl`` and TensorBoard; a reward-curve PNG is written at the
    end. Every ``checkpoint_steps`` steps the agents, the loop step and the environment's
    iteration state are saved under ``run_dir/checkpoints`` (atomic); ``resume=True`` continues
    from the latest one with the same batches, seeds and metrics history.

    Args:
        pop: The agents (one or a population).
        env: A ``ReasoningGym``.
        init_hp: Accepted for AgileRL compatibility (unused).
        save_elite: Save the fittest agent at the end.
        elite_path: Where to save it (default ``run_dir/elite``).
        wb: Log to Weights & Biases (needs ``wandb``).
        evo_steps: Steps between evolution rounds.
        tournament: Selection with ``select(pop) -> (elite, pop)``.
        mutation: Mutation with ``mutation(pop) -> pop``.
        wandb_api_key: Accepted for AgileRL compatibility (use ``wandb login``).
        evaluation_interval: Steps between evaluations.
        max_reward: Stop once the best test reward reaches this.
        verbose: Show the progress bar.
        accelerator: Accepted for AgileRL compatibility (agents carry their own).
        max_steps: Steps to train; default ``num_epochs`` (or 1) passes over the data.
        num_epochs: Passes over the data when ``max_steps`` is None.
        checkpoint_steps: Steps between checkpoints (None: none).
        checkpoint_path: Default of ``run_dir``.
        run_dir: Where metrics, checkpoints and the curve go (default ``checkpoint_path`` or
            ``runs/reasoning``).
        resume: Continue from the latest checkpoint in ``run_dir``.
        eval_loop: Test batches per evaluation.
        eval_fn: Extra evaluation ``agent -> {name: value}`` logged with the metrics.
        tensorboard: Also write TensorBoard events.
        plot: Write ``reward_curve.png`` at the end.
        log_fn: Called with each step's metrics row (trlX's hook).
        save_fn: Called with each checkpoint directory after it is written.

    Returns:
        The trained population.
    """
    del init_hp, wandb_api_key, accelerator
    if not pop:
        raise ValueError("`pop` is empty: pass at least one agent")
    if evaluation_interval < 1:
        raise ValueError(f"`evaluation_interval` must be >= 1, got {evaluation_interval}")
    steps_per_epoch = max(1, len(env) // len(pop))
    total = max_steps if max_steps is not None else steps_per_epoch * (num_epochs or 1)
    if total < 1:
        raise ValueError(f"`max_steps` must be >= 1, got {total}")
    run = Path(run_dir or checkpoint_path or "runs/reasoning")
    agents = list(pop)
    logger = _logger(
        run, tensorboard=tensorboard, wandb_project="rl-train" if wb else None, resume=resume
    )
    start = 0
    prompts = None
    if resume and (ckpt := latest_checkpoint(run)) is not None:
        loop = json.loads((ckpt / "loop.json").read_text())
        for i, agent in enumerate(agents):
            agent.load_checkpoint(ckpt / f"agent_{i}")
        start = int(loop["step"])
        env_state = loop["env"]
        if _distributed():
            own = ckpt / f"env_rank{torch.distributed.get_rank()}.json"
            env_state = json.loads(own.read_text()) if own.is_file() else env_state
        if env_state is not None and hasattr(env, "load_state_dict"):
            env.load_state_dict(env_state)
            prompts = env.current_batch
        logger.truncate(start)
    if prompts is None:
        prompts = env.reset(reset_dataloaders=True)
    bar = tqdm(
        total=total,
        initial=start,
        disable=not (verbose and is_main_process()),
        desc="train",
        unit="step",
    )
    best = -float("inf")
    try:
        for step in range(start, total):
            t0 = time.perf_counter()
            metrics, rewards = [], []
            for agent in agents:
                completion_ids, action_masks = agent.get_action(prompts)
                prompts, r = env.step(completion_ids)
                metrics.append(agent.learn((completion_ids, action_masks, r)))
                agent.set_reference_policy(env.num_epochs)
                agent.scores.append(float(r.float().mean()))
                rewards.append(r)
            row = _row(metrics, rewards, time.perf_counter() - t0)
            done = step + 1
            if done % evaluation_interval == 0 or done == total:
                fitness = []
                for agent in agents:
                    agent.test(env, loop=eval_loop)
                    # selection must agree across processes: the fitness is the global mean
                    agent.fitness[-1] = _global_mean({"f": agent.fitness[-1]}, agent.device)["f"]
                    fitness.append(agent.fitness[-1])
                row["fitness"] = max(fitness)
                best = max(best, row["fitness"])
                if eval_fn is not None:
                    row.update(eval_fn(pop[0]))
                if (
                    evo_steps
                    and tournament is not None
                    and mutation is not None
                    and done % evo_steps == 0
                ):
                    _, agents = tournament.select(agents)
                    agents = mutation.mutation(agents)
            row = _global_mean(row, agents[0].device)
            logger.log(done, row)
            if log_fn is not None:
                log_fn({"step": done, **row})
            bar.update(1)
            bar.set_postfix(
                reward=f"{row['mean_reward']:.3f}",
                kl=f"{row.get('kl', 0.0):.4f}",
                s=f"{row['step_time']:.2f}",
            )
            if checkpoint_steps and done % checkpoint_steps == 0:
                state = env.state_dict() if hasattr(env, "state_dict") else None
                saved = _save(run, done, agents, state)
                if save_fn is not None:
                    save_fn(saved)
            if max_reward is not None and best >= max_reward:
                break
    finally:
        bar.close()
        logger.close()
    if save_elite:
        elite = max(agents, key=lambda a: a.fitness[-1] if a.fitness else -float("inf"))
        elite.save_checkpoint(elite_path or run / "elite")
    if plot and is_main_process():
        plot_reward_curve(logger.history, run / "reward_curve.png", title="reward")
    return agents


def finetune_llm_multiturn(
    pop: Sequence[LLMAlgorithm],
    max_turns: int,
    env_factory: Callable[[], Any],
    max_steps: int = 32768,
    evaluation_interval: int = 10,
    *,
    batch_size: int = 2,
    group_size: int | None = None,
    seed: int = 0,
    run_dir: str | Path | None = None,
    verbose: bool = True,
    tensorboard: bool = True,
    plot: bool = True,
    eval_episodes: int = 4,
    **ignored: Any,
) -> list[LLMAlgorithm]:
    """Train ``pop`` on a multi-turn environment (AgileRL's loop, same arguments).

    Each step runs ``batch_size`` tasks x ``group_size`` copies (default: the agent's
    ``group_size`` if it has one, else 1) of ``env_factory()`` (a
    :class:`rl_envs.TokenObservationWrapper`) to the end with the agent's sampling, then calls
    ``learn`` with per-turn rewards [N, K] and ``turn_ids``. Every ``evaluation_interval``
    steps the mean episode return of greedy play on ``eval_episodes`` fresh seeds is logged
    as ``fitness``.
    """
    del ignored
    from rl_envs import SyncMultiTurnVecEnv

    if not pop:
        raise ValueError("`pop` is empty: pass at least one agent")
    run = Path(run_dir or "runs/multiturn")
    logger = _logger(run, tensorboard=tensorboard)
    agents = list(pop)
    bar = tqdm(
        total=max_steps, disable=not (verbose and is_main_process()), desc="train", unit="step"
    )
    try:
        for step in range(max_steps):
            t0 = time.perf_counter()
            metrics, rewards = [], []
            for k, agent in enumerate(agents):
                G = group_size or int(getattr(agent, "group_size", 1))
                vec = SyncMultiTurnVecEnv(env_factory, batch_size=batch_size, group_size=G)

                def policy(
                    obs: list[dict[str, Any]], agent: LLMAlgorithm = agent
                ) -> list[torch.Tensor]:
                    result = agent.get_action(obs, training=True, repeat_prompts=False)
                    return [
                        c[0, o["input_ids"].shape[1] :]
                        for c, o in zip(result.completion_ids, obs, strict=True)
                    ]

                batch = vec.rollout(policy, seed=seed + step * len(agents) + k)
                if batch.turn_rewards.shape[1] != max_turns:
                    raise ValueError(
                        f"`max_turns`={max_turns} differs from the wrapper's "
                        f"{batch.turn_rewards.shape[1]}"
                    )
                experiences = (batch.input_ids, batch.action_mask[:, 1:], batch.turn_rewards)
                metrics.append(agent.learn(experiences, turn_ids=batch.turn_ids[:, 1:]))
                rewards.append(batch.returns)
            row = _row(metrics, rewards, time.perf_counter() - t0)
            if (step + 1) % evaluation_interval == 0 or step + 1 == max_steps:
                row["fitness"] = max(
                    _greedy_return(agent, env_factory, eval_episodes, seed=10**6)
                    for agent in agents
                )
            row = _global_mean(row, agents[0].device)
            logger.log(step + 1, row)
            bar.update(1)
            bar.set_postfix(reward=f"{row['mean_reward']:.3f}", s=f"{row['step_time']:.2f}")
    finally:
        bar.close()
        logger.close()
    if plot and is_main_process():
        plot_reward_curve(logger.history, run / "reward_curve.png", title="episode return")
    return agents


def _greedy_return(
    agent: LLMAlgorithm, env_factory: Callable[[], Any], episodes: int, seed: int
) -> float:
    from rl_envs import SyncMultiTurnVecEnv

    vec = SyncMultiTurnVecEnv(env_factory, batch_size=episodes, group_size=1)

    def policy(obs: list[dict[str, Any]]) -> list[torch.Tensor]:
        result = agent.get_action(obs, training=False)
        return [
            c[0, o["input_ids"].shape[1] :] for c, o in zip(result.completion_ids, obs, strict=True)
        ]

    return float(vec.rollout(policy, seed=seed).returns.mean())
