"""Noticing that the client of a request closed its connection while the request is served.

The rollout server answers over HTTP/1.0: a client sends one request and waits for its answer
on the same connection, sending nothing more. A connection that becomes readable before the
answer is sent has therefore been closed by the client (the read returns no bytes).
:class:`ClientWatch` polls for that in a thread of its own and sets :attr:`ClientWatch.left`;
the server runs generations under :func:`rl_rollout.cancel.cancelled_when` with that event.
A client that only closes its sending side (a half-close) and still reads looks the same and
counts as gone, as nginx counts it; serve such clients with ``cancel_on_disconnect=False``.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["ClientWatch"]


class ClientWatch:
    """Sets :attr:`left` once the peer of ``connection`` closes it (a context manager).

    The watching thread waits in ``select`` on the connection and on a socket pair of its own,
    written on leaving the context, so it costs no polling and leaving returns at once.

    Args:
        connection: The request's socket (the handler's ``connection``).
        on_left: Called (in the watching thread) when the client is found gone.
        enabled: False: watch nothing (:attr:`left` is never set).
    """

    def __init__(
        self,
        connection: socket.socket,
        on_left: Callable[[], None] | None = None,
        *,
        enabled: bool = True,
    ) -> None:
        self.connection = connection
        self.on_left = on_left
        self.enabled = enabled
        self.left = threading.Event()
        """Set once the client closed the connection."""
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._thread = threading.Thread(target=self._watch, name="rl-rollout-client-watch")
        self._thread.daemon = True

    def _watch(self) -> None:
        assert self._wake is not None
        wake = self._wake[0]
        while True:
            try:
                readable, _, _ = select.select([self.connection, wake], [], [])
                if wake in readable:  # the request is answered: stop watching
                    return
                data = self.connection.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError, TimeoutError):
                continue
            except (OSError, ValueError):  # reset by the peer, or closed under us: gone
                self._leave()
                return
            if not data:  # end of stream: the client closed its side
                self._leave()
            return  # closed, or bytes of another request: nothing more to watch for

    def _leave(self) -> None:
        self.left.set()
        if self.on_left is not None:
            self.on_left()

    def __enter__(self) -> ClientWatch:
        if self.enabled:
            self._wake = socket.socketpair()
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._wake is None:
            return
        self._wake[1].send(b"x")
        self._thread.join()
        for end in self._wake:
            end.close()
        self._wake = None
