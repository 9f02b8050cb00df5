"""Futures with a queue: each request is queued and answered later by ``retrieve_future``.

The Tinker SDK posts an operation, gets ``{"request_id": ...}`` at once and polls
``/api/v1/retrieve_future`` until the result is there (``{"type": "try_again"}`` meanwhile), so
a client's calls overlap: it may submit the next ``forward_backward`` while the last runs. One
worker thread runs the queued operations in arrival order (the model is one resource), which
is also the order the SDK's per-client sequence numbers ask for. An operation that raises is
answered with Tinker's failure shape ``{"error": ..., "category": "user" | "server"}``, and the
worker goes on with the next one.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Done", "Failed", "FutureQueue", "Pending", "UserError"]

logger = logging.getLogger(__name__)


class UserError(ValueError):
    """A request the caller must fix (answered with ``category: "user"``)."""


@dataclass(frozen=True)
class Pending:
    """Not done yet."""


@dataclass(frozen=True)
class Done:
    """The operation's result: JSON-able (``dict``) or protobuf bytes."""

    value: dict[str, Any] | bytes


@dataclass(frozen=True)
class Failed:
    """The operation raised: Tinker's ``RequestFailedResponse`` fields."""

    error: str
    category: str


Outcome = Pending | Done | Failed


class FutureQueue:
    """A FIFO of operations run by one daemon worker thread; results kept until retrieved."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._results: dict[str, Outcome] = {}
        self._queue: queue.Queue[tuple[str, Callable[[], dict[str, Any] | bytes]] | None] = (
            queue.Queue()
        )
        self._worker = threading.Thread(target=self._run, name="tinker-worker", daemon=True)
        self._worker.start()

    def submit(self, operation: Callable[[], dict[str, Any] | bytes]) -> str:
        """Queue ``operation``; return its request id."""
        request_id = f"req-{next(self._ids)}"
        with self._lock:
            self._results[request_id] = Pending()
        self._queue.put((request_id, operation))
        return request_id

    def fail(self, error: str, category: str = "user") -> str:
        """A request id whose answer is already the failure ``error`` (refused at submission)."""
        request_id = f"req-{next(self._ids)}"
        with self._lock:
            self._results[request_id] = Failed(error, category)
        return request_id

    def get(self, request_id: str) -> Outcome | None:
        """The outcome of ``request_id`` (None: unknown); a final one is forgotten once read."""
        with self._lock:
            outcome = self._results.get(request_id)
            if isinstance(outcome, Done | Failed):
                del self._results[request_id]
            return outcome

    def close(self) -> None:
        """Stop the worker after the queued operations."""
        self._queue.put(None)
        self._worker.join(timeout=60)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            request_id, operation = item
            outcome: Outcome
            try:
                outcome = Done(operation())
            except UserError as exc:
                outcome = Failed(str(exc), "user")
            except Exception as exc:  # the worker must outlive any request
                logger.exception("tinker request %s failed", request_id)
                outcome = Failed(f"{type(exc).__name__}: {exc}", "server")
            with self._lock:
                self._results[request_id] = outcome
