"""``rl-train run`` / ``rl-train eval`` as recipes: numbered phases, each a library call.

:func:`prepare` builds (:func:`rl_train.builder.build`), :func:`fit` trains and reports,
:func:`train` is both; :func:`evaluate` scores a checkpoint. Online algorithms train with
:func:`rl_train.finetune_llm_reasoning` on the configured task or dataset; offline ones
(``ilql``) learn from ``data.offline_path`` alone with
:func:`rl_train.offline_learning_loop`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rl_algos import get_preset

from rl_train.builder import Built, ProcessShard, build, rollout_pieces
from rl_train.collective import is_main_process
from rl_train.config import ConfigError, RunConfig, to_dict
from rl_train.evaluation import greedy_accuracy
from rl_train.loops import finetune_llm_reasoning, offline_learning_loop
from rl_train.offline import OfflineDataset, load_offline_data, make_experience

__all__ = ["Summary", "evaluate", "fit", "prepare", "train"]


@dataclass(frozen=True)
class Summary:
    """What a run reports."""

    accuracy_before: float
    """Greedy test accuracy before training."""
    accuracy_after: float
    """Greedy test accuracy after training."""
    run_dir: str
    """The run directory (absolute)."""
    main_process: bool
    """Whether this process is process 0 (the one that reports)."""


def _shard(built: Built) -> ProcessShard | None:
    """This process's data shard under a launcher (its async rollout worker samples it)."""
    acc = built.accelerator
    if acc is None or int(acc.num_processes) == 1:
        return None
    return ProcessShard(int(acc.process_index), int(acc.num_processes))


def _silent(_: str) -> None:
    """A ``say`` that prints nothing."""


def prepare(config: RunConfig) -> Built:
    """Phase 1: check the data an offline algorithm needs, then build everything.

    Args:
        config: The run configuration.

    Returns:
        The built pieces (no accelerator for offline algorithms).

    Raises:
        ConfigError: An offline algorithm without ``data.offline_path`` or with
            ``train.resume`` / ``train.max_reward``, or any build error.
    """
    online = get_preset(config.algo).online
    if not online and config.data.offline_path is None:
        raise ConfigError(
            f"algo: {config.algo} learns offline: set data.offline_path to a JSONL file of "
            '{"sample": ..., "reward": ...} lines (see examples/ilql_tiny.yaml)'
        )
    if not online:  # offline_learning_loop has no cursor to resume from, no early stop
        for key in ("resume", "max_reward"):
            if getattr(config.train, key) not in (False, None):
                raise ConfigError(
                    f"train.{key} is not supported for the offline algo: {config.algo}: "
                    f"remove it (each run trains for train.steps from the start)"
                )
    return build(config, distributed=online)


def _offline_dataset(built: Built) -> OfflineDataset:
    """The logged data of ``data.offline_path``, tokenised (errors become ConfigError)."""
    assert built.config.data.offline_path is not None
    try:
        samples, rewards = load_offline_data(built.config.data.offline_path)
        return make_experience(
            samples, rewards, built.tokenizer, max_length=built.agent.max_model_len or 2048
        )
    except ValueError as exc:
        message = str(exc)
        raise ConfigError(
            message if message.startswith("data.offline_path") else f"data.offline_path: {exc}"
        ) from exc


def fit(built: Built, *, verbose: bool = True, say: Callable[[str], None] = _silent) -> Summary:
    """Phases 2-5: write the run directory, evaluate, train, evaluate again.

    2. ``run_dir/config.json`` (process 0);
    3. greedy accuracy before training (``say`` reports it on process 0);
    4. the training loop (online: ``finetune_llm_reasoning``; offline: the logged data);
    5. greedy accuracy after training.

    Args:
        built: What :func:`prepare` built.
        verbose: Show progress.
        say: Where the report lines go (e.g. ``print``).

    Returns:
        The :class:`Summary`.
    """
    if built.config.env is not None:  # episodes of an OpenEnv / verifiers environment
        from rl_train.env_run import fit_episodes

        before, after = fit_episodes(built, verbose=verbose, say=say)
        run = Path(built.config.train.run_dir).resolve()
        return Summary(before, after, str(run), is_main_process())
    config, agent, env = built.config, built.agent, built.env
    t = config.train
    run_dir = Path(t.run_dir)
    main = is_main_process()
    report = say if main else _silent
    dataset = None if get_preset(config.algo).online else _offline_dataset(built)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    before = greedy_accuracy(agent, env)
    report(f"greedy accuracy before training: {before:.2f}")

    def accuracy(a: object) -> dict[str, float]:
        return {"eval_accuracy": greedy_accuracy(a, env)}

    if dataset is None:
        finetune_llm_reasoning(
            [agent],
            env,
            max_steps=t.steps,
            evaluation_interval=t.evaluation_interval,
            checkpoint_steps=t.checkpoint_steps,
            max_reward=t.max_reward,
            run_dir=run_dir,
            resume=t.resume,
            verbose=verbose,
            eval_fn=accuracy,
            async_config=config.async_,
            rollout_factory=functools.partial(rollout_pieces, config, _shard(built)),
            report_to=t.report_to,
            project=t.project,
        )
    else:
        offline_learning_loop(
            agent,
            dataset,
            steps=t.steps,
            seed=t.seed,
            evaluation_interval=t.evaluation_interval,
            eval_fn=accuracy,
            run_dir=run_dir,
            checkpoint_steps=t.checkpoint_steps,
            verbose=verbose,
            report_to=t.report_to,
            project=t.project,
        )
    after = greedy_accuracy(agent, env)
    report(f"greedy accuracy after training:  {after:.2f}")
    return Summary(before, after, str(run_dir.resolve()), main)


def train(
    config: RunConfig, *, verbose: bool = True, say: Callable[[str], None] = _silent
) -> Summary:
    """Build and train (:func:`prepare` then :func:`fit`).

    Args:
        config: The run configuration.
        verbose: Show progress.
        say: Where the report lines go.

    Returns:
        The :class:`Summary`.
    """
    return fit(prepare(config), verbose=verbose, say=say)


def evaluate(config: RunConfig, checkpoint: str | Path) -> dict[str, float]:
    """Greedy accuracy and mean test reward of a checkpoint on the configured data.

    Args:
        config: The run's configuration (model, data, agent).
        checkpoint: A checkpoint directory, or its ``agent_0`` directory.

    Returns:
        ``{"accuracy": ..., "test_reward": ...}``.

    Raises:
        ConfigError: ``checkpoint`` is not a checkpoint.
    """
    path = Path(checkpoint)
    if (path / "agent_0").is_dir():
        path = path / "agent_0"
    if not (path / "state.json").is_file():
        raise ConfigError(f"{str(checkpoint)!r} is not a checkpoint (no state.json)")
    built = build(config, distributed=False)
    built.agent.load_checkpoint(path, load_optimizer=False)
    return {
        "accuracy": greedy_accuracy(built.agent, built.env),
        "test_reward": float(built.agent.test(built.env)),
    }
