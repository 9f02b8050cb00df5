"""Servers and calls in threads for the tests: a live ASGI app on loopback, a call that must fail.

Both wait with a hang guard: a server that never starts or a call that never returns fails the
test (after the guard's seconds, far beyond any timeout under test) instead of hanging it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["free_port", "raised_by", "serving"]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(app: Any, port: int | None = None, log_level: str = "critical") -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn (extra ``rl-testing[serve]``) on loopback in a thread.

    Yields the base URL ``http://127.0.0.1:PORT``; the server stops when the block ends.

    Raises:
        RuntimeError: the server thread ended before serving (a failed bind, a broken app).
    """
    import uvicorn

    port = free_port() if port is None else port
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the server on port {port} stopped before serving")
        thread.join(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def raised_by(call: Callable[[], object], hang_guard_s: float) -> BaseException:
    """What ``call`` raises, run in a thread joined with a hang guard of ``hang_guard_s``.

    Raises:
        AssertionError: the call is still running after the guard, or it returned.
    """
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(hang_guard_s)
    assert not thread.is_alive(), f"the call hung for {hang_guard_s:.0f} s"
    assert raised, "the call returned instead of failing"
    return raised[0]
