"""The one training loop: a source feeds the agents, hooks do everything else.

Every entry point (``finetune_llm_reasoning``, ``finetune_llm_multiturn``,
``offline_learning_loop``, ``rl-train run`` / ``demo``, the trlX-style trainers) composes a
:class:`~rl_train.sources.Source` and a list of :class:`~rl_train.hooks.Hook` and calls
:func:`train_loop`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from rl_train.hooks import Hook, LoopState
from rl_train.sources import Source, StepOutput

__all__ = ["step_row", "train_loop"]


def step_row(
    outputs: Sequence[StepOutput], keys: tuple[str, ...] | None, seconds: float
) -> dict[str, float]:
    """One step's metrics row: the population's mean of each metric, reward and time.

    Args:
        outputs: One :class:`StepOutput` per agent.
        keys: The metrics to keep (None: every metric any agent returned).
        seconds: The step's wall time.

    Returns:
        ``{metric: mean over the agents that report it, "mean_reward": mean reward (when the
        source has rewards), "step_time": seconds}``.
    """
    metrics = [o.metrics for o in outputs]
    names = keys if keys is not None else tuple(dict.fromkeys(k for m in metrics for k in m))
    row = {}
    for k in names:
        reported = [float(m[k]) for m in metrics if k in m]
        if reported:  # an agent that took no step (every group filtered) reports no loss
            row[k] = sum(reported) / len(reported)
    rewards = [o.rewards for o in outputs if o.rewards is not None]
    if rewards:
        row["mean_reward"] = float(torch.stack([r.float().mean() for r in rewards]).mean())
    row["step_time"] = seconds
    return row


def train_loop(
    agents: Sequence[Any],
    source: Source,
    *,
    steps: int,
    hooks: Sequence[Hook] = (),
    start: int = 0,
    source_state: dict[str, Any] | None = None,
) -> LoopState:
    """Train ``agents`` on ``source`` from step ``start`` to ``steps``.

    Each step every agent gets a batch from the source and learns from it
    (:meth:`Source.step`); the row of means (:func:`step_row`) then goes through the hooks in
    order. A hook may replace the population (evolution) or stop the run.

    Args:
        agents: The population (one or more agents).
        source: Where batches come from.
        steps: The step to stop at.
        hooks: Evaluation, evolution, logging, checkpoints... (see :mod:`rl_train.hooks`).
        start: Steps already done (a resumed run).
        source_state: The source's saved state (a resumed run), or None.

    Returns:
        The final :class:`LoopState` (``state.agents`` is the trained population).

    Raises:
        ValueError: An empty population or ``steps < 1``.
    """
    if not agents:
        raise ValueError("`pop` is empty: pass at least one agent")
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}")
    state = LoopState(agents=list(agents), total=steps, start=start, step=start)
    source.start(state.agents, source_state)
    for hook in hooks:
        hook.on_start(state)
    try:
        while state.step < steps and not state.stop:
            t0 = time.perf_counter()
            outputs = [source.step(a, k, state.step) for k, a in enumerate(state.agents)]
            row = step_row(outputs, source.metric_keys, time.perf_counter() - t0)
            state.step += 1
            state.evaluated = False
            for hook in hooks:
                hook.after_step(state, row)
            state.history.append(row)
    finally:
        close = getattr(source, "close", None)  # a source with a process (async) stops it
        if callable(close):
            close()
        for hook in hooks:
            hook.close(state)
    for hook in hooks:
        hook.on_end(state)
    return state
