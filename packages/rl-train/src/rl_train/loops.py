"""The entry-point loops: thin compositions of a source and hooks for ``train_loop``.

``finetune_llm_reasoning`` and ``finetune_llm_multiturn`` keep AgileRL's signatures;
``offline_learning_loop`` trains on logged data. Each builds a
:class:`~rl_train.sources.Source` and a list of :mod:`rl_train.hooks` and calls
:func:`rl_train.loop.train_loop`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rl_algos import LLMAlgorithm

from rl_train.async_loop import AsyncReasoningSource
from rl_train.checkpoint import Resumed, latest_checkpoint
from rl_train.checkpoint import resume as resume_from
from rl_train.config import AsyncConfig
from rl_train.evaluation import greedy_return, population_fitness
from rl_train.hooks import (
    Checkpoint,
    EarlyStop,
    Evaluation,
    Evolution,
    Hook,
    MetricsLog,
    PrintProgress,
    ProgressBar,
    SaveElite,
    check_checkpoint_steps,
)
from rl_train.loop import train_loop
from rl_train.metrics import open_logger
from rl_train.offline import OfflineDataset
from rl_train.rollout_worker import RolloutPieces
from rl_train.sources import MultiTurnSource, OfflineSource, ReasoningSource, Source
from rl_train.trackers import ReportTo

__all__ = [
    "finetune_llm_multiturn",
    "finetune_llm_reasoning",
    "latest_checkpoint",
    "offline_learning_loop",
]


def finetune_llm_reasoning(
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
    resume: bool | Resumed = False,
    eval_loop: int = 1,
    eval_fn: Callable[[LLMAlgorithm], dict[str, float]] | None = None,
    tensorboard: bool = True,
    plot: bool = True,
    log_fn: Callable[[dict[str, float]], None] | None = None,
    save_fn: Callable[[Path], None] | None = None,
    async_config: AsyncConfig | None = None,
    rollout_factory: Callable[[], RolloutPieces] | None = None,
    report_to: ReportTo = None,
    project: str = "rl-train",
) -> list[LLMAlgorithm]:
    """Train ``pop`` on a :class:`rl_envs.ReasoningGym` (AgileRL's loop, same arguments).

    Each step, every agent gets the next batch: ``get_action`` -> ``env.step`` -> ``learn``
    (with the sampling log-probs, so the rollout-mismatch correction applies), then
    ``set_reference_policy(env.num_epochs)`` (the reference follows the actor once per
    dataset pass). Every ``evaluation_interval`` steps each agent is tested on the test split
    (``agent.test(env, eval_loop)``, greedy; plus ``eval_fn(agent)`` if given); training stops
    early once the best test reward reaches ``max_reward``. With ``evo_steps``, ``tournament``
    and ``mutation`` the population evolves (``tournament.select(pop)`` then
    ``mutation.mutation(pop)``).

    Metrics go to the console (a tqdm bar with reward, KL and step time), ``run_dir``'s
    ``metrics.csv`` / ``metrics.jsonl`` and TensorBoard; a reward-curve PNG is written at the
    end. Every ``checkpoint_steps`` steps, and at the last step (also one that ``max_reward``
    stopped at), the agents, the loop step and the environment's iteration state are saved
    under ``run_dir/checkpoints`` (atomic; refused when a trainable parameter is NaN or inf);
    ``resume=True`` continues from the latest one with the same batches, seeds and metrics
    history (with no checkpoint, from step 1).

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
        checkpoint_steps: Steps between checkpoints, the last step saved too (None: none).
        checkpoint_path: Default of ``run_dir``.
        run_dir: Where metrics, checkpoints and the curve go (default ``checkpoint_path`` or
            ``runs/reasoning``).
        resume: Continue from the latest checkpoint in ``run_dir``; or the
            :class:`~rl_train.checkpoint.Resumed` that :func:`rl_train.checkpoint.resume`
            returned for ``pop`` (continue from it without loading it again).
        eval_loop: Test batches per evaluation.
        eval_fn: Extra evaluation ``agent -> {name: value}`` logged with the metrics.
        tensorboard: Also write TensorBoard events.
        plot: Write ``reward_curve.png`` at the end.
        log_fn: Called with each step's metrics row (trlX's hook).
        save_fn: Called with each checkpoint directory after it is written.
        async_config: Generate in a rollout worker process while training
            (:class:`~rl_train.config.AsyncConfig`; one agent, not PPO/ILQL); ``env`` then
            serves only the evaluations. None: the synchronous loop.
        rollout_factory: With ``async_config``: a picklable function building the worker's
            agent and environment like ``pop[0]`` and ``env``
            (:class:`~rl_train.rollout_worker.RolloutPieces`), e.g.
            ``functools.partial(rl_train.builder.rollout_pieces, run_config)``; under DDP each
            process's factory must build that process's shard of the data (``rollout_pieces``'
            ``shard``).
        report_to: Trackers as in TRL: ``tensorboard``, ``wandb``, ``mlflow``, ``trackio``,
            ``clearml`` (a name or a list), ``"none"`` or ``"all"``, and objects with
            ``log(step, metrics)`` and ``close()`` of your own (:mod:`rl_train.trackers`);
            replaces ``tensorboard`` and ``wb``. None: ``tensorboard`` and ``wb`` decide.
        project: The trackers' project (W&B project, MLflow experiment, trackio or ClearML
            project).

    Returns:
        The trained population.
    """
    del init_hp, wandb_api_key, accelerator
    if async_config is not None and rollout_factory is None:
        raise ValueError(
            "`async_config` needs `rollout_factory`: a picklable function that builds the "
            "rollout worker's agent and environment (RolloutPieces), e.g. "
            "functools.partial(rl_train.builder.rollout_pieces, run_config)"
        )
    if not pop:
        raise ValueError("`pop` is empty: pass at least one agent")
    if evaluation_interval < 1:
        raise ValueError(f"`evaluation_interval` must be >= 1, got {evaluation_interval}")
    check_checkpoint_steps(checkpoint_steps)
    evolution = _evolution(evo_steps, tournament, mutation)
    steps_per_epoch = max(1, len(env) // len(pop))
    total = max_steps if max_steps is not None else steps_per_epoch * (num_epochs or 1)
    if total < 1:
        raise ValueError(f"`max_steps` must be >= 1, got {total}")
    run = Path(run_dir or checkpoint_path or "runs/reasoning")
    agents = list(pop)
    source: Source = (
        ReasoningSource(env)
        if async_config is None or rollout_factory is None
        else AsyncReasoningSource(rollout_factory, async_config)
    )
    evaluation = Evaluation(
        evaluation_interval,
        fitness=functools.partial(population_fitness, env=env, loop=eval_loop),
        extra=eval_fn,
    )
    return _train_population(
        agents, source, run, evaluation, evolution, steps=total, title="reward", kl=True,
        resume=resume, tensorboard=tensorboard, wb=wb, report_to=report_to, project=project,
        log_fn=log_fn, plot=plot, verbose=verbose, checkpoint_steps=checkpoint_steps,
        save_fn=save_fn, max_reward=max_reward, save_elite=save_elite, elite_path=elite_path,
    )  # fmt: skip


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
    resume: bool | Resumed = False,
    checkpoint_steps: int | None = None,
    checkpoint_path: str | None = None,
    max_reward: float | None = None,
    save_elite: bool | None = None,
    elite_path: str | None = None,
    evo_steps: int | None = None,
    tournament: Any = None,
    mutation: Any = None,
    wb: bool = False,
    verbose: bool = True,
    tensorboard: bool = True,
    plot: bool = True,
    eval_episodes: int = 4,
    log_fn: Callable[[dict[str, float]], None] | None = None,
    save_fn: Callable[[Path], None] | None = None,
    async_config: AsyncConfig | None = None,
    rollout_factory: Callable[[], RolloutPieces] | None = None,
    report_to: ReportTo = None,
    project: str = "rl-train",
    env_config: dict[str, Any] | None = None,
    init_hp: dict[str, Any] | None = None,
    wandb_api_key: str | None = None,
    accelerator: Any = None,
) -> list[LLMAlgorithm]:
    """Train ``pop`` on a multi-turn environment (AgileRL's loop, same arguments).

    Each step runs ``batch_size`` tasks x ``group_size`` copies (default: the agent's
    ``group_size`` if it has one, else 1) of ``env_factory()`` (a
    :class:`rl_envs.TokenObservationWrapper`) to the end with the agent's sampling, then calls
    ``learn`` with per-turn rewards [N, K], ``turn_ids`` and the sampling log-probs. Every
    ``evaluation_interval`` steps the mean episode return of greedy play on ``eval_episodes``
    fresh seeds is logged as ``fitness``; training stops early once it reaches
    ``max_reward``. Checkpoints, resuming, the elite and evolution work as in
    :func:`finetune_llm_reasoning`; step ``s``'s episodes are drawn from a seed of ``s``, so a
    resumed run plays the episodes the uninterrupted one would have.

    Args:
        pop: The agents.
        max_turns: The wrapper's ``max_turns`` (checked).
        env_factory: Builds one ``TokenObservationWrapper``.
        max_steps: Steps to train.
        evaluation_interval: Steps between evaluations.
        batch_size: Tasks per step.
        group_size: Copies per task (default: the agent's ``group_size`` or 1).
        seed: Seed of the tasks.
        run_dir: Where metrics, checkpoints and the curve go (default ``checkpoint_path`` or
            ``runs/multiturn``).
        resume: Continue from the latest checkpoint in ``run_dir``; or the
            :class:`~rl_train.checkpoint.Resumed` that :func:`rl_train.checkpoint.resume`
            returned for ``pop`` (continue from it without loading it again).
        checkpoint_steps: Steps between checkpoints, the last step saved too (None: none).
        checkpoint_path: Default of ``run_dir``.
        max_reward: Stop once the evaluation's mean return reaches this.
        save_elite: Save the fittest agent at the end.
        elite_path: Where to save it (default ``run_dir/elite``).
        evo_steps: Steps between evolution rounds.
        tournament: Selection with ``select(pop) -> (elite, pop)``.
        mutation: Mutation with ``mutation(pop) -> pop``.
        wb: Log to Weights & Biases (needs ``wandb``).
        verbose: Show the progress bar.
        tensorboard: Also write TensorBoard events.
        plot: Write ``reward_curve.png`` at the end.
        eval_episodes: Episodes per evaluation.
        log_fn: Called with each step's metrics row (trlX's hook).
        save_fn: Called with each checkpoint directory after it is written.
        async_config: Play the episodes in a rollout worker process while training
            (:class:`~rl_train.config.AsyncConfig`; one agent, not PPO/ILQL); ``env_factory``
            must then be picklable (a module-level function or ``functools.partial`` of one).
            None: the synchronous loop.
        rollout_factory: With ``async_config``: a picklable function building the worker's
            agent like ``pop[0]`` (:class:`~rl_train.rollout_worker.RolloutPieces` with
            ``env=None``).
        report_to: Trackers, as in :func:`finetune_llm_reasoning` (None: ``tensorboard``
            and ``wb`` decide).
        project: The trackers' project.
        env_config: Accepted for AgileRL compatibility (unused: ``env_factory`` builds the
            environments).
        init_hp: Accepted for AgileRL compatibility (unused: the agents carry their
            hyperparameters).
        wandb_api_key: Accepted for AgileRL compatibility (use ``wandb login``).
        accelerator: Accepted for AgileRL compatibility (agents carry their own).

    Returns:
        The trained population.
    """
    del env_config, init_hp, wandb_api_key, accelerator
    if async_config is not None and rollout_factory is None:
        raise ValueError(
            "`async_config` needs `rollout_factory`: a picklable function that builds the "
            "rollout worker's agent (RolloutPieces(agent)) like pop[0]"
        )
    if not pop:
        raise ValueError("`pop` is empty: pass at least one agent")
    if evaluation_interval < 1:
        raise ValueError(f"`evaluation_interval` must be >= 1, got {evaluation_interval}")
    check_checkpoint_steps(checkpoint_steps)
    evolution = _evolution(evo_steps, tournament, mutation)
    run = Path(run_dir or checkpoint_path or "runs/multiturn")
    agents = list(pop)
    episodes = MultiTurnSource(
        env_factory, max_turns, batch_size=batch_size, group_size=group_size, seed=seed
    )
    source: Source = (
        episodes
        if async_config is None or rollout_factory is None
        else AsyncReasoningSource(rollout_factory, async_config, episodes=episodes)
    )

    def fitness(agents: Sequence[Any]) -> float:
        return max(greedy_return(a, env_factory, eval_episodes, seed=10**6) for a in agents)

    return _train_population(
        agents, source, run, Evaluation(evaluation_interval, fitness=fitness), evolution,
        steps=max_steps, title="episode return", kl=False, resume=resume,
        tensorboard=tensorboard, wb=wb, report_to=report_to, project=project, log_fn=log_fn,
        plot=plot, verbose=verbose, checkpoint_steps=checkpoint_steps, save_fn=save_fn,
        max_reward=max_reward, save_elite=save_elite, elite_path=elite_path,
    )  # fmt: skip


def offline_learning_loop(
    agent: Any,
    dataset: OfflineDataset,
    *,
    steps: int,
    batch_size: int | None = None,
    seed: int = 0,
    evaluation_interval: int | None = None,
    eval_fn: Callable[[Any], dict[str, float]] | None = None,
    run_dir: str | Path | None = None,
    checkpoint_steps: int | None = None,
    log_fn: Callable[[dict[str, float]], None] | None = None,
    save_fn: Callable[[Path], None] | None = None,
    tensorboard: bool = False,
    verbose: bool = False,
    report_to: ReportTo = None,
    project: str = "rl-train",
    plot: bool = False,
) -> list[dict[str, float]]:
    """Train ``agent`` (an :class:`rl_algos.ILQL`) on ``dataset`` for ``steps`` steps.

    Each step is ``agent.learn`` on the next ``batch_size`` rows (default the agent's) of a
    seeded shuffle of the dataset, reshuffled every pass (a pass's last rows that do not fill a
    batch are skipped, like the last partial batch of ``ReasoningGym``'s training split).
    Every ``evaluation_interval`` steps (and after the last) ``eval_fn(agent)`` is added to the
    step's row. Rows go to ``run_dir``'s ``metrics.jsonl`` / ``metrics.csv`` when ``run_dir``
    is given, and to ``log_fn``; every ``checkpoint_steps`` steps and at the last step the agent
    is saved to ``run_dir/checkpoints/step_<n>/agent_0`` (the layout ``rl-train eval`` reads).
    With ``plot``, ``run_dir/reward_curve.png`` shows the evaluations (or the loss, without
    ``eval_fn``) against the step.

    Args:
        agent: The agent.
        dataset: The logged data (:func:`rl_train.offline.make_experience`).
        steps: Optimizer steps.
        batch_size: Rows per step, at most the dataset's (default ``agent.batch_size``, capped at
            the dataset's rows).
        seed: Seed of the shuffles.
        evaluation_interval: Steps between ``eval_fn`` calls (None: after the last only).
        eval_fn: ``agent -> {name: value}`` logged with the row.
        run_dir: Where metrics and checkpoints go (None: nowhere).
        checkpoint_steps: Steps between checkpoints, the last step saved too (needs
            ``run_dir``; None: none).
        log_fn: Called with each row (``{"step": n, ...}``).
        save_fn: Called with each checkpoint directory.
        tensorboard: Also write TensorBoard events.
        verbose: Print the loss every 25 steps.
        report_to: Trackers, as in :func:`finetune_llm_reasoning` (needs ``run_dir``; None:
            ``tensorboard`` decides).
        project: The trackers' project.
        plot: Write ``run_dir/reward_curve.png`` at the end (needs ``run_dir``).

    Returns:
        The metrics rows, one per step.
    """
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}")
    check_checkpoint_steps(checkpoint_steps)
    source = OfflineSource(dataset, batch_size, seed)
    logger = (
        open_logger(run_dir, tensorboard=tensorboard, report_to=report_to, project=project)
        if run_dir is not None
        else None
    )
    curve = Path(run_dir) / "reward_curve.png" if plot and run_dir is not None else None
    hooks: list[Hook] = [
        Evaluation(evaluation_interval, extra=eval_fn),
        MetricsLog(logger, log_fn, curve, "offline training on logged data", train_reward=False),
    ]
    if verbose:
        hooks.append(PrintProgress(25))
    if run_dir is not None:
        hooks.append(Checkpoint(Path(run_dir), checkpoint_steps, source, save_fn))
    return train_loop([agent], source, steps=steps, hooks=hooks).history


def _evolution(evo_steps: int | None, tournament: Any, mutation: Any) -> Evolution | None:
    """The evolution hook, or None, by AgileRL's rules for the three arguments.

    ``tournament`` and ``mutation`` without ``evo_steps`` is an error; ``evo_steps`` without
    both of them warns that nothing will evolve.
    """
    both = tournament is not None and mutation is not None
    if evo_steps is not None and evo_steps < 1:
        raise ValueError(f"`evo_steps` must be >= 1 (steps between evolutions), got {evo_steps}")
    if both and evo_steps is None:
        raise ValueError(
            "`tournament` and `mutation` need `evo_steps`, the steps between evolution rounds"
        )
    if evo_steps is not None and not both:
        warnings.warn(
            "`evo_steps` is set but `tournament` or `mutation` is None: the population will not "
            "evolve",
            UserWarning,
            stacklevel=3,
        )
        return None
    return Evolution(evo_steps, tournament, mutation) if evo_steps is not None else None


def _train_population(
    agents: list[LLMAlgorithm],
    source: Source,
    run: Path,
    evaluation: Evaluation,
    evolution: Evolution | None,
    *,
    steps: int,
    title: str,
    kl: bool,
    resume: bool | Resumed,
    tensorboard: bool,
    wb: bool,
    report_to: ReportTo,
    project: str,
    log_fn: Callable[[dict[str, float]], None] | None,
    plot: bool,
    verbose: bool,
    checkpoint_steps: int | None,
    save_fn: Callable[[Path], None] | None,
    max_reward: float | None,
    save_elite: bool | None,
    elite_path: str | Path | None,
) -> list[LLMAlgorithm]:
    """What both online loops share: the logger, resuming from ``run``, the hooks, the loop."""
    logger = open_logger(
        run,
        tensorboard=tensorboard,
        wandb_project=project if wb else None,
        resume=bool(resume),
        report_to=report_to,
        project=project,
    )
    resumed = (
        resume if isinstance(resume, Resumed) else resume_from(run, agents) if resume else None
    )
    if resume:  # no checkpoint: step 1 again, and the rows of the run before it go
        logger.truncate(resumed.step if resumed is not None else 0)
    hooks: list[Hook] = [evaluation, *([evolution] if evolution is not None else [])]
    hooks += [
        MetricsLog(logger, log_fn, run / "reward_curve.png" if plot else None, title),
        ProgressBar(verbose, kl=kl),
        EarlyStop(max_reward),
        Checkpoint(run, checkpoint_steps, source, save_fn),  # after EarlyStop: saves its stop
    ]
    if save_elite:
        hooks.append(SaveElite(elite_path or run / "elite"))
    state = train_loop(
        agents,
        source,
        steps=steps,
        hooks=hooks,
        start=resumed.step if resumed is not None else 0,
        source_state=resumed.source_state if resumed is not None else None,
    )
    return state.agents
