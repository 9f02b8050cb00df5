"""The rollout client's HTTP transport: one request and its whole reply within a deadline.

:func:`exchange` sends a request on an open ``http.client`` connection and reads the reply,
status line and headers included, one socket read at a time, each bounded by the time left, so
a reply that trickles in byte by byte, or a server that stalls mid-headers or mid-body, ends at
the deadline instead of hanging. :class:`~rl_rollout.RemoteEngine` turns what it raises into a
``RolloutServerError`` naming the URL and the call.
"""

from __future__ import annotations

import http.client
import io
import socket
import time
from collections.abc import Callable
from typing import Any

__all__ = ["exchange"]


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read given the time left (``time_left`` raises past it)."""

    def __init__(self, sock: socket.socket, time_left: Callable[[], float]) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # keeps the socket open, as a file does
        self._time_left = time_left

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._time_left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


def exchange(
    conn: http.client.HTTPConnection,
    path: str,
    body: bytes | None,
    content_type: str,
    timeout: float,
    replied: list[bool],
) -> tuple[int, bytes]:
    """Send the request and read the whole reply on the connected ``conn`` within ``timeout``.

    Each socket operation gets the time left, so a reply trickling in byte by byte (its headers
    or its body) ends at the deadline too. ``replied`` gets an entry once the status line and
    headers are in.

    Returns:
        The HTTP status and the body.

    Raises:
        TimeoutError: the deadline passed.
        http.client.IncompleteRead: the server closed before sending its Content-Length.
    """
    sock = conn.sock  # kept: the connection lets go of it once a response owns it
    assert sock is not None
    deadline = time.monotonic() + timeout

    def time_left() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the {timeout} s deadline passed")
        return left

    class Response(http.client.HTTPResponse):
        """Reads the status line, the headers and the body through the deadline."""

        def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            self.fp.close()  # the plain file object: its reads are bounded one by one only
            self.fp = io.BufferedReader(_DeadlineReader(sock, time_left))

    conn.response_class = Response
    sock.settimeout(time_left())
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    response = conn.getresponse()
    replied.append(True)
    try:
        chunks = []
        while True:  # one socket read at a time, each within the time left
            chunk = response.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        if response.length:  # the server closed before the Content-Length was read
            raise http.client.IncompleteRead(b"".join(chunks), response.length)
        return response.status, b"".join(chunks)
    finally:
        response.close()
