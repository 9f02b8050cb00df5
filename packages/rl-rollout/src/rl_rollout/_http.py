"""The rollout client's HTTP transport: one request and its whole reply within a deadline.

:func:`exchange` sends a request on an open ``http.client`` connection and reads the reply
one socket read at a time, each bounded by the time left, so a reply that trickles in byte
by byte, or a server that stalls mid-body, ends at the deadline instead of hanging.
:class:`~rl_rollout.RemoteEngine` turns what it raises into a ``RolloutServerError`` naming
the URL and the call.
"""

from __future__ import annotations

import http.client
import time

__all__ = ["exchange"]


def exchange(
    conn: http.client.HTTPConnection,
    path: str,
    body: bytes | None,
    content_type: str,
    timeout: float,
    replied: list[bool],
) -> tuple[int, bytes]:
    """Send the request and read the whole reply on the connected ``conn`` within ``timeout``.

    Each socket operation gets the time left, so a reply trickling in byte by byte ends at
    the deadline too. ``replied`` gets an entry once the status line and headers are in.

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

    sock.settimeout(time_left())
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
    sock.settimeout(time_left())
    response = conn.getresponse()
    replied.append(True)
    try:
        chunks = []
        while True:  # one socket read at a time, each within the time left
            sock.settimeout(time_left())
            chunk = response.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        if response.length:  # the server closed before the Content-Length was read
            raise http.client.IncompleteRead(b"".join(chunks), response.length)
        return response.status, b"".join(chunks)
    finally:
        response.close()
