"""A lock granted in arrival order, for the rollout server's one engine.

``threading.Lock`` grants a released lock to any waiter, so two weight syncs queued behind a
long generation can be applied in the opposite order to the one they arrived in: a sync the
trainer gave up on (its timeout passed, its handler still waiting) landing after the newer one
would leave the server generating with stale weights. :class:`ArrivalOrderLock` serves its
waiters first come, first served (a ticket lock).
"""

from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["ArrivalOrderLock"]


class ArrivalOrderLock:
    """A non-reentrant lock whose waiters acquire it in the order they asked for it."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next_ticket = 0  # the ticket the next caller draws
        self._serving = 0  # the ticket that may hold the lock now

    @property
    def waiting(self) -> int:
        """Callers that asked for the lock and do not hold it yet (the holder excluded)."""
        with self._cond:
            return max(0, self._next_ticket - self._serving - 1)

    @property
    def locked(self) -> bool:
        """Whether someone holds the lock."""
        with self._cond:
            return self._next_ticket > self._serving

    def acquire(self) -> None:
        """Block until every earlier caller has held and released the lock, then hold it."""
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def release(self) -> None:
        """Hand the lock to the next caller in arrival order."""
        with self._cond:
            if self._next_ticket == self._serving:
                raise RuntimeError("release of an ArrivalOrderLock that is not held")
            self._serving += 1
            self._cond.notify_all()

    def __enter__(self) -> ArrivalOrderLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
