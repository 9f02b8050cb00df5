"""A client that leaves: the rollout server stops sampling for it and serves the next request.

Real sockets and a real HFEngine in the server's threads. A forward pre-hook on the model
counts the forwards and, where a test asks, holds one until the server has noticed the client
is gone (a rendezvous on the server's own state, never a sleep), so what is counted is exact:
the generation stops before the next token, a queued request whose client left samples nothing.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from rl_rollout import HFEngine, RemoteEngine, RolloutServer, SamplingParams
from rl_rollout.cancel import (
    GenerationCancelledError,
    cancelled_when,
    is_cancelled,
    raise_if_cancelled,
)
from rollout_testlib import tiny
from test_engine import assert_same_result

#: Seconds after which a wait on the server counts as hung: a hang guard, never a speed limit.
HANG_GUARD_S = 120.0

PROMPT = [1, 5, 6, 7]
#: Never an early EOS (the random model's EOS chance differs across transformers versions): the
#: held forward is always reached.
PARAMS = {"max_new_tokens": 40, "min_new_tokens": 40, "seed": 0}


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"hang guard: {what} not within {HANG_GUARD_S:.0f} s")
        time.sleep(0.005)


class Forwards:
    """Counts the model's forwards; ``hold_at`` holds that forward until ``release`` is set."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self.hold_at: int | None = None
        self.reached = threading.Event()
        self.release: Callable[[], bool] = lambda: True
        model.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        self.count += 1
        if self.count == self.hold_at:
            self.reached.set()
            _wait(self.release, "the release of the held forward")


def _send(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A raw HTTP/1.0 request whose answer is never read (the test closes the socket)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.0\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


@pytest.fixture
def engine() -> tuple[HFEngine, Forwards]:
    model, tok = tiny("qwen2", seed=3)
    return HFEngine(model, tok), Forwards(model)


ROUTES = {
    "/generate": {"prompts": [PROMPT], "params": PARAMS},
    "/v1/completions": {
        "model": "policy",
        "prompt": PROMPT,
        "max_tokens": 40,
        "min_tokens": 40,
        "seed": 0,
    },
}


@pytest.mark.parametrize("decode", ["lean", "generate"])
@pytest.mark.parametrize("path", list(ROUTES))
def test_a_generation_stops_at_the_next_token_once_its_client_leaves(
    engine: tuple[HFEngine, Forwards], decode: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    hf, forwards = engine
    hf.decode = decode
    forwards.hold_at = 3  # the prefill, two decoding steps; held until the client is gone
    forwards.release = is_cancelled  # read in the server's thread: its request's event
    with caplog.at_level(logging.INFO, "rl_rollout.server"), RolloutServer(hf) as server:
        sock = _send(server.url, path, ROUTES[path])
        assert forwards.reached.wait(HANG_GUARD_S), "the generation never started"
        sock.close()
        _wait(lambda: server.cancelled == 1, "the cancellation")
        # the held forward returned, and no token was sampled after it
        assert forwards.count == 3
        assert server.disconnects == 1
        # the server goes on serving, with the engine as it was
        forwards.hold_at = None
        params = SamplingParams(max_new_tokens=6, n=2, seed=5, return_logprobs=True)
        remote = RemoteEngine(server.url, timeout=60.0)
        assert_same_result(remote.generate([PROMPT], params), hf.generate([PROMPT], params))
    assert f"the client of POST {path} left: its generation was cancelled" in caplog.text


def test_a_queued_request_whose_client_left_samples_nothing(
    engine: tuple[HFEngine, Forwards],
) -> None:
    hf, forwards = engine
    forwards.hold_at = 2
    release = threading.Event()
    forwards.release = release.is_set
    with RolloutServer(hf) as server:
        remote = RemoteEngine(server.url, timeout=HANG_GUARD_S)
        first: list[Any] = []
        params = SamplingParams(max_new_tokens=5, min_new_tokens=5, seed=1)
        thread = threading.Thread(target=lambda: first.append(remote.generate([PROMPT], params)))
        thread.start()
        assert forwards.reached.wait(HANG_GUARD_S), "the first generation never started"
        sock = _send(server.url, "/generate", ROUTES["/generate"])
        _wait(lambda: server._lock.waiting == 1, "the second request to queue")
        sock.close()
        _wait(lambda: server.disconnects == 1, "the server to notice the client left")
        release.set()
        thread.join(HANG_GUARD_S)
        _wait(lambda: server.cancelled == 1, "the queued request's cancellation")
        count = forwards.count  # the first request's, and none of the cancelled one's
        assert first and first[0].completion_ids.shape == (1, 5)
        forwards.hold_at = None
        assert_same_result(remote.generate([PROMPT], params), hf.generate([PROMPT], params))
    assert forwards.count - count == 2 * count  # the same request twice more: as many each


def test_without_cancel_on_disconnect_the_generation_runs_to_its_end(
    engine: tuple[HFEngine, Forwards],
) -> None:
    hf, forwards = engine
    forwards.hold_at = 3
    gone = threading.Event()
    forwards.release = gone.is_set
    with RolloutServer(hf, cancel_on_disconnect=False) as server:
        sock = _send(server.url, "/generate", {"prompts": [PROMPT], "params": PARAMS})
        assert forwards.reached.wait(HANG_GUARD_S)
        sock.close()
        gone.set()
        _wait(lambda: server._lock.waiting == 0 and not server._lock.locked, "the generation")
        assert server.cancelled == 0 and server.disconnects == 0
    steps = forwards.count
    hf.generate([PROMPT], SamplingParams(**PARAMS))
    assert forwards.count - steps == steps  # every token was sampled, as for a present client


def test_the_event_cancels_only_inside_its_context_and_thread() -> None:
    event = threading.Event()
    event.set()
    raise_if_cancelled()  # outside any context: nothing to cancel
    seen: list[bool] = []
    with cancelled_when(event):
        thread = threading.Thread(target=lambda: seen.append(is_cancelled()))
        thread.start()
        thread.join()
        with pytest.raises(GenerationCancelledError, match="its caller left"):
            raise_if_cancelled()
    assert seen == [False]  # another thread (another request) is not cancelled
    assert not is_cancelled()
