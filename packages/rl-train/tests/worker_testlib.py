"""Rollout-worker factories for the asynchronous loop's fault tests (picklable: module level).

The worker process is spawned: it imports this module by name (``conftest.py`` puts the tests
folder on ``sys.path``, which the spawned interpreter inherits).
"""

from __future__ import annotations

import threading
from typing import Any


def stalled_factory() -> Any:
    """A worker that never gets past building its pieces: it blocks for good."""
    threading.Event().wait()


class _FailingEnv:
    """The worker's ``ReasoningGym``, whose reward step raises from the ``after + 1``-th call on."""

    def __init__(self, env: Any, after: int) -> None:
        self.env = env
        self.after = after
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def step(self, completion_ids: Any) -> Any:
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError(f"injected reward failure at batch {self.calls}")
        return self.env.step(completion_ids)


def failing_factory(config: Any, after: int) -> Any:
    """``rl_train.builder.rollout_pieces(config)`` whose environment fails after ``after`` batches."""
    from rl_train.builder import rollout_pieces

    pieces = rollout_pieces(config)
    return type(pieces)(pieces.agent, _FailingEnv(pieces.env, after))
