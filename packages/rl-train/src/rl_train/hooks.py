"""Typed hooks of :func:`rl_train.loop.train_loop`: evaluation, evolution, metrics, checkpoints.

A hook sees the :class:`LoopState` and each step's metrics row, in the order the hooks are
given. The loop calls :meth:`Hook.on_start` once, :meth:`Hook.after_step` after every step,
:meth:`Hook.close` always (even after an exception) and :meth:`Hook.on_end` after a run that
finished. The usual order is: :class:`Evaluation` (adds ``fitness`` and ``eval_fn``'s values),
:class:`Evolution` (selection + mutation on evaluation steps), :class:`MetricsLog` (means over
processes, CSV/JSONL/TensorBoard, the user's ``log_fn``, the reward curve at the end),
:class:`ProgressBar` or :class:`PrintProgress`, :class:`EarlyStop`, :class:`Checkpoint`
(after :class:`EarlyStop`, so that a run that stops early saves its last step),
:class:`SaveElite`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm  # type: ignore[import-untyped]

from rl_train.checkpoint import save_checkpoint
from rl_train.collective import global_mean, is_main_process
from rl_train.metrics import MetricsLogger, NullLogger, plot_reward_curve
from rl_train.sources import Source

__all__ = [
    "Checkpoint",
    "EarlyStop",
    "Evaluation",
    "Evolution",
    "Hook",
    "LoopState",
    "MetricsLog",
    "PrintProgress",
    "ProgressBar",
    "SaveElite",
    "check_checkpoint_steps",
]


@dataclass
class LoopState:
    """The training loop's state, shared with the hooks."""

    agents: list[Any]
    """The population (evolution replaces it)."""
    total: int
    """Steps the run ends at."""
    start: int = 0
    """The step the run started (or resumed) from."""
    step: int = 0
    """Steps done."""
    best: float = -float("inf")
    """The best fitness seen so far."""
    evaluated: bool = False
    """Whether the agents were evaluated at this step."""
    stop: bool = False
    """Set by a hook to end the run after this step."""
    history: list[dict[str, float]] = field(default_factory=list)
    """Every step's metrics row, in order."""


class Hook:
    """Base class: every method does nothing."""

    def on_start(self, state: LoopState) -> None:
        """Before the first step."""

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """After step ``state.step``; ``row`` may be changed in place."""

    def close(self, state: LoopState) -> None:
        """At the end, also after an exception."""

    def on_end(self, state: LoopState) -> None:
        """At the end of a run that finished."""


class Evaluation(Hook):
    """Every ``interval`` steps and after the last: fitness and extra evaluation values.

    Args:
        interval: Steps between evaluations (None: after the last step only).
        fitness: ``agents -> best fitness`` (logged as ``fitness``), or None.
        extra: ``agent -> {name: value}`` for the first agent, logged with the row, or None.
    """

    def __init__(
        self,
        interval: int | None,
        fitness: Callable[[Sequence[Any]], float] | None = None,
        extra: Callable[[Any], dict[str, float]] | None = None,
    ) -> None:
        self.interval = interval
        self.fitness = fitness
        self.extra = extra

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Evaluate on evaluation steps."""
        due = bool(self.interval) and state.step % (self.interval or 1) == 0
        state.evaluated = due or state.step == state.total
        if not state.evaluated:
            return
        if self.fitness is not None:
            row["fitness"] = self.fitness(state.agents)
            state.best = max(state.best, row["fitness"])
        if self.extra is not None:
            row.update(self.extra(state.agents[0]))


class Evolution(Hook):
    """Tournament selection then mutation, on evaluation steps that are multiples of ``every``.

    Args:
        every: Steps between evolution rounds.
        tournament: Selection with ``select(pop) -> (elite, pop)``.
        mutation: Mutation with ``mutation(pop) -> pop``.
    """

    def __init__(self, every: int, tournament: Any, mutation: Any) -> None:
        self.every = every
        self.tournament = tournament
        self.mutation = mutation

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Replace the population after an evaluation."""
        del row
        if state.evaluated and state.step % self.every == 0:
            _, agents = self.tournament.select(state.agents)
            state.agents = list(self.mutation.mutation(agents))


class MetricsLog(Hook):
    """Means over processes, then the logger (CSV/JSONL/TensorBoard) and the user's ``log_fn``.

    Args:
        logger: A :class:`MetricsLogger` (or :class:`NullLogger` off process 0), or None.
        log_fn: Called with ``{"step": n, **row}`` (trlX's hook), or None.
        curve: Where the reward-curve PNG goes at the end (process 0), or None.
        title: The curve's title.
        train_reward: Plot the batches' mean reward (False: offline, logged rewards).
    """

    def __init__(
        self,
        logger: MetricsLogger | NullLogger | None,
        log_fn: Callable[[dict[str, float]], None] | None = None,
        curve: Path | None = None,
        title: str = "reward",
        train_reward: bool = True,
    ) -> None:
        if curve is not None and importlib.util.find_spec("matplotlib") is None:
            # before training, not after it: the curve is drawn at the end
            raise ValueError(
                "the reward curve needs matplotlib (a dependency of rl-train), which is not "
                "installed: pip install matplotlib, or pass plot=False"
            )
        self.logger = logger
        self.log_fn = log_fn
        self.curve = curve
        self.title = title
        self.train_reward = train_reward

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Average ``row`` over processes (in place) and log it."""
        row.update(global_mean(row, state.agents[0].device))
        if self.logger is not None:
            self.logger.log(state.step, row)
        if self.log_fn is not None:
            self.log_fn({"step": state.step, **row})

    def close(self, state: LoopState) -> None:
        """Flush and close the logger."""
        del state
        if self.logger is not None:
            self.logger.close()

    def on_end(self, state: LoopState) -> None:
        """Plot the logger's whole history (a resumed run's included)."""
        if self.curve is not None and self.logger is not None and is_main_process():
            plot_reward_curve(
                self.logger.history, self.curve, self.title, train_reward=self.train_reward
            )


class ProgressBar(Hook):
    """A tqdm bar on process 0 with the reward, the KL and the step time.

    The KL is shown with ``kl=True`` while an agent computes a KL term (``beta > 0``: the
    reference is scored); with ``beta = 0`` there is none to show.

    Asynchronous runs also show the consumed samples' staleness and the trainer's idle
    fraction.

    Args:
        enabled: Show it.
        kl: Also show the KL (when a KL term is computed).
    """

    def __init__(self, enabled: bool = True, kl: bool = True) -> None:
        self.enabled = enabled
        self.kl = kl
        self.bar: Any = None

    def on_start(self, state: LoopState) -> None:
        """Open the bar at the start step."""
        self.bar = tqdm(
            total=state.total,
            initial=state.start,
            disable=not (self.enabled and is_main_process()),
            desc="train",
            unit="step",
        )

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Advance with the step's numbers."""
        shown = {"reward": f"{row.get('mean_reward', 0.0):.3f}"}
        if self.kl and any(float(getattr(a, "beta", 0.0) or 0.0) > 0 for a in state.agents):
            shown["kl"] = f"{row.get('kl', 0.0):.4f}"
        if "async_staleness_mean" in row:  # the asynchronous loop: staleness, trainer idle
            shown["stale"] = f"{row['async_staleness_mean']:.1f}"
            shown["idle"] = f"{row['async_trainer_idle']:.2f}"
        shown["s"] = f"{row['step_time']:.2f}"
        self.bar.update(1)
        self.bar.set_postfix(**shown)

    def close(self, state: LoopState) -> None:
        """Close the bar."""
        del state
        if self.bar is not None:
            self.bar.close()


class PrintProgress(Hook):
    """A line with the loss every ``every`` steps and after the last.

    Args:
        every: Steps between lines.
    """

    def __init__(self, every: int = 25) -> None:
        self.every = every

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Print ``step n/total: loss x``."""
        if state.step % self.every == 0 or state.step == state.total:
            print(f"step {state.step}/{state.total}: loss {row['loss']:.4f}", flush=True)


def check_checkpoint_steps(every: int | None) -> None:
    """``checkpoint_steps`` is None (no checkpoints) or an integer >= 1.

    Raises:
        ValueError: Anything else (0, a negative number, a bool or a float).
    """
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(
            "`checkpoint_steps` must be None (no checkpoints) or an integer >= 1 (steps between "
            f"checkpoints), got {every!r}"
        )


class Checkpoint(Hook):
    """Every ``every`` steps and at the last step (also when a hook stops the run early): the
    agents and the source's state, atomically (collective).

    Args:
        run_dir: The run directory (``checkpoints/`` goes under it).
        every: Steps between checkpoints (None: none).
        source: The data source whose ``state_dict()`` is saved.
        save_fn: Called with each checkpoint directory after it is written, or None.

    Raises:
        ValueError: ``every`` is neither None nor an integer >= 1.
    """  # noqa: D205

    def __init__(
        self,
        run_dir: Path,
        every: int | None,
        source: Source,
        save_fn: Callable[[Path], None] | None = None,
    ) -> None:
        check_checkpoint_steps(every)
        self.run_dir = run_dir
        self.every = every
        self.source = source
        self.save_fn = save_fn

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Save on checkpoint steps, the last step and a step a hook stopped the run at."""
        del row
        if self.every is None:
            return
        last = state.step >= state.total or state.stop
        if state.step % self.every == 0 or last:
            saved = save_checkpoint(
                self.run_dir, state.step, state.agents, self.source.state_dict()
            )
            if self.save_fn is not None:
                self.save_fn(saved)


class EarlyStop(Hook):
    """Stop once the best fitness reaches ``max_reward`` (None: never).

    Args:
        max_reward: The fitness to reach.
    """

    def __init__(self, max_reward: float | None) -> None:
        self.max_reward = max_reward

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        """Set ``state.stop`` when the target is reached."""
        del row
        if self.max_reward is not None and state.best >= self.max_reward:
            state.stop = True


class SaveElite(Hook):
    """At the end, save the agent with the best latest fitness.

    Args:
        path: The checkpoint directory.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path

    def on_end(self, state: LoopState) -> None:
        """Save the fittest agent."""
        elite = max(state.agents, key=lambda a: a.fitness[-1] if a.fitness else -float("inf"))
        elite.save_checkpoint(self.path)
