"""Cancelling a generation whose caller is gone: the rollout server's client-disconnect check.

A client of the rollout server that gives up (its ``timeout`` passed, the trainer was killed,
an agent framework cancelled the request) closes its connection, and an engine that went on
sampling for it would hold the server's one engine for nothing while the next requests wait.
The server runs each generation inside :func:`cancelled_when` with an event its watcher sets
when the client's connection closes; the Hugging Face engine calls :func:`raise_if_cancelled`
before it samples each token (the lean loop and ``generate`` alike), so the generation stops
within one decoding step with :class:`GenerationCancelledError`. The event is held in a context
variable, so only the generation of the thread (the request) that set it is affected.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["GenerationCancelledError", "cancelled_when", "is_cancelled", "raise_if_cancelled"]

_EVENT: ContextVar[threading.Event | None] = ContextVar("rl_rollout_cancel", default=None)


class GenerationCancelledError(RuntimeError):
    """The generation was stopped because its caller left (:func:`cancelled_when`)."""


@contextlib.contextmanager
def cancelled_when(event: threading.Event) -> Iterator[threading.Event]:
    """Inside, a generation of this thread stops at its next token once ``event`` is set."""
    token = _EVENT.set(event)
    try:
        yield event
    finally:
        _EVENT.reset(token)


def is_cancelled() -> bool:
    """Whether the event of the enclosing :func:`cancelled_when` is set (False outside one)."""
    event = _EVENT.get()
    return event is not None and event.is_set()


def raise_if_cancelled() -> None:
    """Raise :class:`GenerationCancelledError` when :func:`is_cancelled`.

    Raises:
        GenerationCancelledError: the enclosing :func:`cancelled_when`'s event is set.
    """
    if is_cancelled():
        raise GenerationCancelledError("the generation was cancelled: its caller left")
