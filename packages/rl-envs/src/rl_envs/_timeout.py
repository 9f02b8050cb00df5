"""Calls waited with a deadline: the opt-in ``reward_timeout``, ``step_timeout``, ``tool_timeout``.

Without a timeout a callable runs on the caller's thread, as a plain call (signal-based
verifiers such as ``math_verify`` need the main thread). With one it runs on a daemon worker
thread, one per calling thread and reused from call to call, and is waited at most ``timeout``
seconds; a call that does not return in time raises :class:`CallTimeoutError` and its worker is
abandoned (a Python thread cannot be stopped: it keeps running the stuck call, and the next call
gets a fresh worker). Daemon threads never hold up the interpreter's exit.
"""

from __future__ import annotations

import concurrent.futures
import math
import numbers
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

_Job = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class CallTimeoutError(Exception):
    """The call did not return within its timeout (callers raise their own error from it)."""


class EnvTimeoutError(TimeoutError):
    """An environment call or a tool call did not return within its timeout.

    Raised for an environment's ``reset`` or ``step`` (``step_timeout``) and a tool
    (``tool_timeout``); the message names it, the turn and the option to raise.
    """


def check_timeout(name: str, value: float | None) -> float | None:
    """``value`` as seconds, or None (no limit).

    Args:
        name: The argument's name, for the message.
        value: A finite number of seconds > 0, or None.

    Returns:
        ``float(value)``, or None.

    Raises:
        ValueError: Not None and not a finite number > 0 (the message names ``name``).
    """
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not value > 0
    ):
        raise ValueError(
            f"`{name}` must be a finite number of seconds > 0, or None for no limit; got {value!r}"
        )
    return float(value)


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the waiting thread, raised there
            future.set_exception(exc)
        else:
            future.set_result(result)


_LOCAL = threading.local()


def _worker() -> queue.SimpleQueue[_Job | None]:
    """The calling thread's worker (started on first use, again after a fork or a timeout)."""
    jobs: queue.SimpleQueue[_Job | None] | None = getattr(_LOCAL, "jobs", None)
    if jobs is None or getattr(_LOCAL, "pid", None) != os.getpid():
        jobs = queue.SimpleQueue()
        name = f"rl-envs-timeout-{threading.current_thread().name}"
        threading.Thread(target=_serve, args=(jobs,), name=name, daemon=True).start()
        _LOCAL.jobs, _LOCAL.pid = jobs, os.getpid()
    return jobs


def call(fn: Callable[..., Any], timeout: float | None, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, waited at most ``timeout`` seconds (None: a plain call).

    Args:
        fn: The callable.
        timeout: Seconds (:func:`check_timeout`), or None to call ``fn`` on this thread.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What ``fn`` returned (what it raised is raised here).

    Raises:
        CallTimeoutError: ``fn`` did not return within ``timeout``.
    """
    if timeout is None:
        return fn(*args, **kwargs)
    jobs = _worker()
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    jobs.put((future, fn, args, kwargs))
    done, _ = concurrent.futures.wait([future], timeout)
    if not done:
        future.cancel()
        jobs.put(None)  # the worker exits once the stuck call returns, if ever
        _LOCAL.jobs = None
        raise CallTimeoutError
    return future.result()
