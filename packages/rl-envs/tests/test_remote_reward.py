"""The remote reward: a real server process scores as a local call does; down, silent and failing
servers give a clear error within the time budget.

No test asserts how fast a call is (speed is for benchmarks): what was retried is counted on the
server's side, and which path gave up (refused, no reply within the timeout) is read from the
error. The only upper bound on elapsed time is a hang guard far beyond any budget configured here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rl_envs.remote_reward import (
    RemoteReward,
    RewardRequest,
    RewardServer,
    RewardServerError,
    is_batched_reward,
    score_request,
)

#: The reward module the server process imports (per sample, batched, and a failing one).
REWARDS = textwrap.dedent(
    '''
    def per_sample(completion, answer, question):
        """1 for the answer, 0.25 per shared leading character otherwise."""
        if completion.strip() == str(answer):
            return 1.0
        shared = 0
        for a, b in zip(completion, str(answer)):
            if a != b:
                break
            shared += 1
        return 0.25 * shared + 0.01 * len(question)

    def text(x):
        return x if isinstance(x, str) else x[-1]["content"]  # TRL's messages: the last one

    def batched(prompts, completions, completion_ids=None, **kwargs):
        """TRL style: length ratio, times a column; None for empty completions."""
        prompts, completions = [text(p) for p in prompts], [text(c) for c in completions]
        weights = kwargs.get("weight", [1.0] * len(completions))
        ids = completion_ids or [[0] * len(c) for c in completions]
        return [
            None if not c else w * len(c) / (1 + len(p)) + 0.001 * len(i)
            for p, c, i, w in zip(prompts, completions, ids, weights)
        ]

    def broken(completion, answer, question):
        raise ZeroDivisionError("the reward model fell over")
    '''
)

PROMPTS = ["2+2=", "what is 3+4?", "name a colour", "x"]
COMPLETIONS = ["4", "7 or so", "", "xyz"]
ANSWERS = ["4", "7", "red", "x"]


def _load(tmp: Path) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile(REWARDS, str(tmp / "remote_rewards.py"), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewards")
    (path / "remote_rewards.py").write_text(REWARDS)
    return path


def _start(module_dir: Path, name: str) -> tuple[subprocess.Popen[str], str]:
    """``python -m rl_envs.remote_reward`` serving ``remote_rewards:<name>`` on a free port."""
    command = [sys.executable, "-m", "rl_envs.remote_reward"]
    proc = subprocess.Popen(
        [*command, "--reward", f"remote_rewards:{name}", "--port", "0"],
        cwd=module_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(module_dir)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise AssertionError(f"the server did not start: {line}{proc.stdout.read()}")
    return proc, line.strip().rsplit(" ", 1)[-1]


@pytest.fixture(scope="module")
def servers(module_dir: Path) -> Iterator[dict[str, str]]:
    procs = {name: _start(module_dir, name) for name in ("per_sample", "batched", "broken")}
    try:
        yield {name: url for name, (_, url) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=10)


def test_server_process_equals_local_calls(servers: dict[str, str], tmp_path: Path) -> None:
    local = _load(tmp_path)
    per_sample, batched = local["per_sample"], local["batched"]
    remote = RemoteReward(servers["per_sample"], timeout=10)
    assert remote.health() == {"status": "ok", "reward": "per_sample", "batched": False}
    expected = [per_sample(c, a, p) for c, a, p in zip(COMPLETIONS, ANSWERS, PROMPTS, strict=True)]  # type: ignore[operator]
    assert len(set(expected)) > 2  # the rewards differ between samples: a real comparison
    # one request for the batch, and one per sample (as ReasoningGym calls it)
    assert remote.score(PROMPTS, COMPLETIONS, answer=ANSWERS) == expected
    assert remote(completions=COMPLETIONS, prompts=PROMPTS, answer=ANSWERS) == expected
    assert [
        remote(c, a, p) for c, a, p in zip(COMPLETIONS, ANSWERS, PROMPTS, strict=True)
    ] == expected

    remote_b = RemoteReward(servers["batched"], timeout=10)
    assert remote_b.health()["batched"] is True
    ids = [[1, 2], [3], [], [4, 5, 6]]
    weight = [1.0, 2.0, 3.0, 0.5]
    want = batched(PROMPTS, COMPLETIONS, ids, weight=weight)  # type: ignore[operator]
    assert want[2] is None and len({w for w in want if w is not None}) == 3
    got = remote_b(prompts=PROMPTS, completions=COMPLETIONS, completion_ids=ids, weight=weight)
    assert got == want
    assert remote_b.score(PROMPTS, COMPLETIONS) == batched(PROMPTS, COMPLETIONS)  # type: ignore[operator]
    # TRL's conversational form: lists of messages travel as JSON, untouched
    chat_prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    chat = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    want_chat = batched(chat_prompts, chat)  # type: ignore[operator]
    assert want_chat == batched(PROMPTS, COMPLETIONS)  # type: ignore[operator]
    assert remote_b.score(chat_prompts, chat) == want_chat


def test_reward_function_error_is_reported_not_retried(servers: dict[str, str]) -> None:
    remote = RemoteReward(servers["broken"], timeout=10, retries=5, backoff=0.01)
    with pytest.raises(RewardServerError, match="ZeroDivisionError the reward model fell over"):
        remote("4", "4", "2+2=")
    # not retried: the server's reward function was called once (a retry would call it again)
    calls: list[str] = []

    def broken(completion: str, answer: str, question: str) -> float:
        calls.append(completion)
        raise ZeroDivisionError("the reward model fell over")

    with (
        RewardServer(broken) as server,
        pytest.raises(RewardServerError, match="ZeroDivisionError the reward model fell over"),
    ):
        RemoteReward(server.url, timeout=10, retries=5, backoff=0.01)("4", "4", "2+2=")
    assert calls == ["4"]
    # a bad request is the caller's error: ValueError naming what is missing
    with pytest.raises(ValueError, match="needs an `answer` column"):
        RemoteReward(servers["per_sample"], timeout=10).score(["p"], ["c"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_down_server_is_refused_not_waited_for_with_the_fix() -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    remote = RemoteReward(url, timeout=30, retries=2, backoff=0.05)
    with pytest.raises(RewardServerError) as info:
        remote("4", "4", "2+2=")
    message = str(info.value)
    assert url in message and "cannot connect" in message and "3 attempts" in message
    assert "rl-train reward-server --reward module:function" in message
    # refused at once, every retry spent: the refusal path, not the 30 s timeout's ("no reply")
    assert "down or failing" in message and "timeout" not in message


@contextlib.contextmanager
def _socket_server(handle: Callable[[socket.socket, int, threading.Event], None]) -> Iterator[str]:
    """A real socket server on a free local port; yields its URL.

    Each accepted connection goes to ``handle(conn, index, stop)`` on its own thread (``index``
    counts the connections from 0; ``stop`` is set when the server shuts down, and every
    thread is joined then).
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    workers: list[threading.Thread] = []

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            worker = threading.Thread(target=handle, args=(conn, len(workers), stop), daemon=True)
            workers.append(worker)
            worker.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join()
        for worker in workers:
            worker.join()
        listener.close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A real socket server that accepts connections, reads, and never answers."""
    held: list[socket.socket] = []
    try:
        with _socket_server(lambda conn, index, stop: held.append(conn)) as url:
            yield url
    finally:
        for conn in held:
            conn.close()


def test_silent_server_fails_within_the_timeout(silent_server: str) -> None:
    remote = RemoteReward(silent_server, timeout=1.5, retries=3, backoff=0.1)
    start = time.monotonic()
    with pytest.raises(RewardServerError) as info:
        remote.score(["p"], ["c"], answer=["a"])
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "no reply" in message and "timeout=1.5 s" in message and silent_server in message
    # the budget, retries included, ended the call: fewer attempts than the 1 + 3 retries allow
    attempts = re.search(r"; (\d+) attempts? in ", message)
    assert attempts is not None and 1 <= int(attempts[1]) <= 3, message
    assert elapsed >= 1.4  # the whole budget was waited


@pytest.fixture
def trickling_server() -> Iterator[tuple[str, dict[int, int]]]:
    """A real socket server that sends the headers of a reply, then its body a byte at a time,
    waiting on an Event between bytes (each read gets a byte long before any timeout).

    Yields the URL and, per connection, the bytes of the body it sent.
    """
    body = b'{"status": "ok"' + b" " * 100 + b"}"  # sent in >= 6 s: 0.05 s a byte at least
    sent: dict[int, int] = {}

    def trickle(conn: socket.socket, index: int, stop: threading.Event) -> None:
        sent[index] = 0
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
            )
            for byte in body:
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:  # the client gave up and closed
                    return
                sent[index] += 1

    with _socket_server(trickle) as url:
        yield url, sent


def test_a_trickling_reply_is_cut_off_at_the_call_deadline(
    trickling_server: tuple[str, dict[int, int]],
) -> None:
    url, sent = trickling_server
    remote = RemoteReward(url, timeout=1.0, retries=3, backoff=0.01)
    with pytest.raises(RewardServerError) as info:
        remote.health()
    message = str(info.value)
    assert (
        f"the reward server at {url}/health did not reply in full within timeout=1.0 s" in message
    )
    assert "(the reply was not complete; 1 attempt in " in message
    # the deadline ended the call (no time left for the 3 retries), the body mid-way
    assert len(sent) == 1 and 0 < sent[0] < 116


def test_retry_reaches_a_server_that_starts_late() -> None:
    port = _free_port()
    server = RewardServer(lambda completion, answer, question: 0.5, port=port)
    timer = threading.Timer(0.3, server.start)
    timer.start()
    try:
        remote = RemoteReward(f"http://127.0.0.1:{port}", timeout=20, retries=8, backoff=0.1)
        assert remote("a", "b", "c") == 0.5  # the first attempts are refused, a retry lands
    finally:
        timer.join()
        server.close()


def test_in_process_server_and_errors() -> None:
    def bad_count(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
        return [1.0]

    with (
        RewardServer(bad_count) as server,
        pytest.raises(RewardServerError, match="returned 1 rewards for 2 samples"),
    ):
        RemoteReward(server.url).score(["a", "b"], ["c", "d"])
    with RewardServer(lambda completion, answer, question: math.nan) as server:
        with pytest.raises(RewardServerError, match="must be finite"):
            RemoteReward(server.url)("c", "a", "q")
        # a foreign route is a 404 from the server, not a hang
        with pytest.raises(RewardServerError, match="HTTP 404"):
            RemoteReward(server.url)._call("/nope", b"{}")


def test_request_validation_and_detection() -> None:
    with pytest.raises(ValueError, match="`prompts` has 1 entries for 2 completions"):
        RewardRequest(["p"], ["a", "b"])
    with pytest.raises(ValueError, match="column 'answer' must be a list of 2 values"):
        RewardRequest(["p", "q"], ["a", "b"], columns={"answer": ["x"]})
    with pytest.raises(ValueError, match="clashes"):
        RewardRequest(["p"], ["a"], columns={"completions": ["x"]})
    req = RewardRequest(["p"], ["a"], [[1, 2]], {"answer": [3]})
    assert RewardRequest.from_json(json.loads(json.dumps(req.to_json()))) == req

    def trl(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
        return [float(len(c)) for c in completions]

    def agile(completion: str, answer: str, question: str) -> float:
        return 1.0

    def named_only(prompts: list[str], completions: list[str]) -> list[float]:
        return [float(len(p) + len(c)) for p, c in zip(prompts, completions, strict=True)]

    assert is_batched_reward(trl) and not is_batched_reward(agile) and not is_batched_reward(len)
    assert is_batched_reward(named_only) and is_batched_reward(lambda **kw: [])
    # without **kwargs a batched reward gets only what it names (no completion_ids, no columns)
    request = RewardRequest(["ab", ""], ["c", "de"], [[1], [2]], {"answer": [1, 2]})
    assert score_request(named_only, request) == [3.0, 2.0]
    assert is_batched_reward(RemoteReward("http://h:1"))  # a client is itself a batched reward
    assert score_request(trl, RewardRequest(["", ""], ["ab", "c"])) == [2.0, 1.0]
    with pytest.raises(ValueError, match="cannot be sent as JSON"):
        RemoteReward("http://h:1").score(["p"], ["c"], answer=[object()])
    for bad in ("localhost:80", "https://h:1", "http://h"):
        with pytest.raises(ValueError, match="http://host:port"):
            RemoteReward(bad)
    with pytest.raises(ValueError, match="`retries` must be an integer >= 0"):
        RemoteReward("http://h:1", retries=-1)
    with pytest.raises(ValueError, match="`timeout` must be > 0"):
        RemoteReward("http://h:1", timeout=0)
