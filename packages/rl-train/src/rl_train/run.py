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
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rl_algos import get_preset

from rl_train.builder import Built, ProcessShard, build, rollout_pieces
from rl_train.checkpoint import LATEST, latest_checkpoint, resume, resume_point
from rl_train.collective import is_main_process
from rl_train.config import ConfigError, RunConfig, check_run_dir, to_dict
from rl_train.evaluation import greedy_accuracy
from rl_train.loops import finetune_llm_reasoning, offline_learning_loop
from rl_train.offline import OfflineDataset, load_offline_data, make_experience

__all__ = ["Summary", "evaluate", "fit", "prepare", "train"]


@dataclass(frozen=True)
class Summary:
    """What a run reports."""

    accuracy_before: float
    """Greedy test accuracy before training (a resumed run: at the checkpoint it resumed from;
    NaN when a resumed run had already finished and nothing was evaluated)."""
    accuracy_after: float
    """Greedy test accuracy after training (NaN when nothing was trained)."""
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
        ConfigError: ``train.run_dir`` already holds a run and ``train.resume`` is false, an
            offline algorithm without ``data.offline_path`` or with ``train.resume`` /
            ``train.max_reward``, or any build error.
    """
    check_run_dir(config.train)  # before the build: a reused directory answers at once
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
    3. greedy accuracy before training (``say`` reports it on process 0); a resumed run
       reports it at the checkpoint it resumes from, and one without a checkpoint says that it
       starts at step 1;
    4. the training loop (online: ``finetune_llm_reasoning``; offline: the logged data);
    5. greedy accuracy after training.

    A resumed run whose checkpoint is at ``train.steps`` (or later) says it already finished
    and returns without evaluating.

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
    assert env is not None  # built without an env: section
    t = config.train
    run_dir = Path(t.run_dir)
    main = is_main_process()
    report = say if main else _silent
    checkpoint = resume_point(config, report)
    if checkpoint is not None and checkpoint[1] >= t.steps:
        return Summary(math.nan, math.nan, str(run_dir.resolve()), main)
    dataset = None if get_preset(config.algo).online else _offline_dataset(built)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    resumed = None
    if checkpoint is not None:  # loaded once, with the optimizer: the loop continues from it
        resumed = resume(run_dir, [agent])
        step = checkpoint[1]
        before = greedy_accuracy(agent, env)
        report(f"resuming from step {step}; greedy accuracy at step {step}: {before:.2f}")
    else:
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
            resume=resumed if resumed is not None else t.resume,
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
            plot=True,
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

    With an ``env:`` section: the greedy mean return of ``env.eval_episodes`` fresh episodes
    (seeds from 10**6, as ``rl-train run`` reports before and after training) instead.

    Args:
        config: The run's configuration (model, data, agent).
        checkpoint: A checkpoint directory (``step_<n>``) or its ``agent_0`` directory, or a
            run directory or its ``checkpoints`` folder (their latest checkpoint).

    Returns:
        ``{"accuracy": ..., "test_reward": ...}``; with ``env:``, ``{"mean_return": ...}``.

    Raises:
        ConfigError: ``checkpoint`` is not a checkpoint, or was written by another algorithm's
            agent than ``config.algo``'s.
    """
    path = _agent_dir(Path(checkpoint))
    _check_agent_class(config, path, str(checkpoint))
    built = build(config, distributed=False)
    built.agent.load_checkpoint(path, load_optimizer=False)
    if built.env is None:  # an env: run's episodes
        from rl_train.env_run import greedy_episode_return

        return {"mean_return": greedy_episode_return(built)}
    return {
        "accuracy": greedy_accuracy(built.agent, built.env),
        "test_reward": float(built.agent.test(built.env)),
    }


def _agent_dir(path: Path) -> Path:
    """The ``agent_0`` directory a checkpoint argument names (a run directory: its latest)."""
    for run in (path, path.parent):  # a run directory, or its checkpoints/ folder
        if (run / "checkpoints" / LATEST).is_file() and path in (run, run / "checkpoints"):
            latest = latest_checkpoint(run)
            if latest is not None:
                path = latest
            break
    if (path / "agent_0").is_dir():
        path = path / "agent_0"
    if (path / "state.json").is_file():
        return path
    steps = sorted(
        p for base in (path, path / "checkpoints") if base.is_dir() for p in base.glob("step_*")
    )
    hint = f"; pass a step directory, e.g. {str(steps[-1])!r}" if steps else ""
    raise ConfigError(f"{str(path)!r} is not a checkpoint (no state.json){hint}")


def _check_agent_class(config: RunConfig, path: Path, shown: str) -> None:
    """The checkpoint's agent class (its ``state.json``) is the one ``config.algo`` builds."""
    from rl_algos.names import ALGORITHM_SPECS

    spec = ALGORITHM_SPECS.get(config.algo)
    saved = json.loads((path / "state.json").read_text())
    written = saved.get("class") if isinstance(saved, dict) else None
    if spec is None or written is None:
        return
    wanted = spec.agent.rpartition(":")[2]
    if written == wanted:
        return
    run_config = path.parent.parent.parent / "config.json"  # run/checkpoints/step_n/agent_0
    algo = saved.get("algo", written)
    if run_config.is_file():
        algo = json.loads(run_config.read_text()).get("algo", algo)
        fix = f"pass --config {str(run_config)!r} (the run's resolved config)"
    else:
        fix = f"pass --config with algo: {algo}"
    raise ConfigError(
        f"{shown!r} was written by a {written} agent (algo: {algo}), but the config's algo "
        f"{config.algo} builds a {wanted} agent: {fix}"
    )
