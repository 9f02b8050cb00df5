"""Server mode: a real HFEngine behind RolloutServer, driven through RemoteEngine.

Nothing is faked: the server runs the tiny model in a thread of this process; the timeout and
refused-connection cases use real sockets that never answer / are closed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from rl_rollout import (
    Engine,
    HFEngine,
    RemoteEngine,
    RolloutServer,
    RolloutServerError,
    SamplingParams,
)
from rl_rollout._wire import params_from_json, params_to_json, result_from_json, result_to_json
from rl_testing.serving import raised_by
from rollout_testlib import EOS, chars_only_mask, tiny
from safetensors.torch import save as save_safetensors
from test_engine import assert_same_result

#: Seconds after which a call that must fail within its own (sub-second) timeout counts as hung:
#: a hang guard, far beyond the timeouts configured here, never a speed limit.
HANG_GUARD_S = 120.0


@pytest.fixture
def served() -> Iterator[tuple[HFEngine, RemoteEngine]]:
    model, tok = tiny("qwen2", seed=3)
    engine = HFEngine(model, tok)
    with RolloutServer(engine) as server:
        yield engine, RemoteEngine(server.url, timeout=60.0, connect_timeout=5.0)


def test_remote_is_an_engine(served: tuple[HFEngine, RemoteEngine]) -> None:
    _, remote = served
    for name in Engine.__dict__:  # every method of the Protocol rl-algos programs against
        if not name.startswith("_"):
            assert callable(getattr(remote, name, None)), name
    assert remote.health() == {"status": "ok", "engine": "HFEngine", "record_routes": False}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=11, return_logprobs=True),
        SamplingParams(
            temperature=0.7,
            top_k=5,
            top_p=0.9,
            max_new_tokens=5,
            n=2,
            seed=2,
            stop=("a",),
            return_logprobs=True,
        ),
        SamplingParams.eval_preset(max_new_tokens=4),
    ],
)
def test_remote_generate_equals_local(
    served: tuple[HFEngine, RemoteEngine], params: SamplingParams
) -> None:
    local, remote = served
    prompts = ["hello", "ab", "what is 2+3?"]
    assert_same_result(remote.generate(prompts, params), local.generate(prompts, params))


def test_remote_logit_mask_travels(served: tuple[HFEngine, RemoteEngine]) -> None:
    local, remote = served
    mask = chars_only_mask(local.model.config.vocab_size)
    params = SamplingParams(max_new_tokens=7, seed=5, logit_mask=mask, return_logprobs=True)
    result = remote.generate(["xy"], params)
    assert_same_result(result, local.generate(["xy"], params))
    assert result.finish_reasons == ["length"]  # EOS is masked out
    assert not torch.isin(result.completion_ids, torch.tensor([EOS])).any()


def test_remote_update_weights_reaches_the_served_model(
    served: tuple[HFEngine, RemoteEngine],
) -> None:
    local, remote = served
    name, param = next(iter(local.model.named_parameters()))
    new = torch.randn_like(param)
    remote.update_weights([(name, new)])
    # bit-exact: the wire carries the tensor's bytes
    assert torch.equal(dict(local.model.named_parameters())[name].detach(), new)


def test_remote_errors_carry_the_server_message(served: tuple[HFEngine, RemoteEngine]) -> None:
    local, remote = served
    with pytest.raises(ValueError, match="`prompts` is empty"):
        remote.generate([], SamplingParams())
    with pytest.raises(ValueError, match=r"prompt 0 has \d+ tokens, more than max_model_len"):
        remote.generate(["x" * (local.max_model_len + 1)], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="which the model lacks"):
        remote.update_weights([("no.such.weight", torch.zeros(2))])
    with pytest.raises(ValueError, match="`named_tensors` is empty"):
        remote.update_weights([])
    with pytest.raises(NotImplementedError, match="load_lora"):
        remote.load_lora("policy", "/nonexistent")
    with pytest.raises(ValueError, match="`logits_processor` cannot be sent"):
        remote.generate(["a"], SamplingParams(logits_processor=lambda ids, s: s))
    remote.sleep()  # HFEngine: no-ops, but the routes answer
    remote.wake_up(["weights"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("stop", "zzzz"), ("stop", [""]), ("stop", ["a", 3]), ("stop_token_ids", 2),
     ("stop_token_ids", [-1]), ("max_new_tokens", 2.5), ("n", 2.0), ("seed", "abc"),
     ("temperature", "0.7")],
)  # fmt: skip
def test_bad_params_give_the_same_error_over_the_wire(
    served: tuple[HFEngine, RemoteEngine], field: str, value: object
) -> None:
    _, remote = served
    with pytest.raises(ValueError, match=f"`{field}`") as local:
        SamplingParams(**{field: tuple(value) if isinstance(value, list) else value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"`{field}`") as decoded:
        params_from_json({field: value})
    assert str(decoded.value) == str(local.value)
    body = json.dumps({"prompts": ["ab"], "params": {field: value}}).encode()
    with pytest.raises(ValueError, match=f"`{field}`") as answered:  # the server's 400
        remote._request("/generate", body, timeout=60.0)
    assert str(answered.value) == f"generate failed on the server: {local.value}"


def test_prompt_shapes_and_ids_are_checked_on_the_server(
    served: tuple[HFEngine, RemoteEngine],
) -> None:
    _, remote = served
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match=re.escape("wrap a single prompt: ['hello']")):
        remote.generate("hello", params)
    with pytest.raises(
        ValueError, match=re.escape("a single prompt's ids must be wrapped: [[1, 2, 3]]")
    ):
        remote.generate([1, 2, 3], params)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"prompt 0 has token id 100000 \(position 1\)"):
        remote.generate([[5, 10**5]], params)
    conn = http.client.HTTPConnection(remote._host, remote._port, timeout=60.0)
    try:  # the HTTP answer itself: 400 with the message
        conn.request("POST", "/generate", body=json.dumps({"prompts": "hello", "params": {}}))
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 400
    assert answer["error"] == "ValueError"
    assert (
        "`prompts` must be a list of prompts; wrap a single prompt: ['hello']" in answer["message"]
    )


def test_unknown_route_is_404(served: tuple[HFEngine, RemoteEngine]) -> None:
    _, remote = served
    with pytest.raises(RolloutServerError, match="no route /nope"):
        remote._request("/nope", b"{}", timeout=5.0)


def test_refused_connection_says_how_to_start_the_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteEngine(f"http://127.0.0.1:{port}", connect_timeout=2.0)
    with pytest.raises(RolloutServerError, match=r"cannot reach .*rl-rollout-server"):
        remote.generate(["a"], SamplingParams())


def test_silent_server_times_out_instead_of_hanging() -> None:
    """A server that accepts and never answers (a stuck weight sync) -> error, not a hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    remote = RemoteEngine(f"http://127.0.0.1:{port}", timeout=0.5, weight_sync_timeout=0.5)
    try:
        error = raised_by(lambda: remote.update_weights([("w", torch.zeros(3))]), HANG_GUARD_S)
        # the read timed out after the configured 0.5 s (the message names the socket's timeout)
        assert isinstance(error, RolloutServerError), repr(error)
        assert re.search(r"no reply from .*/update_weights within 0.5 s", str(error)), error
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


@contextlib.contextmanager
def raw_server(reply: Callable[[socket.socket], None]) -> Iterator[str]:
    """A real socket server that reads each request and answers it with ``reply(conn)``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                while length and len(body) < int(length.group(1)):
                    body += conn.recv(65536)
                reply(conn)
            except OSError:  # the client gave up
                pass

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def answer(status: int, body: bytes) -> Callable[[socket.socket], None]:
    def reply(conn: socket.socket) -> None:
        conn.sendall(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )

    return reply


ONE_ROW = {"prompt_ids": [[5]], "prompt_mask": [[True]], "completion_ids": [[7, 8]],
           "completion_mask": [[True, True]], "finish_reasons": ["length"], "group_index": [0],
           "texts": ["xy"], "logprobs": None}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "body", "n", "match"),
    [
        (500, b"[1, 2]", 1, "HTTP 500 with JSON that is not an object"),
        (200, b"[1, 2]", 1, "HTTP 200 with JSON that is not an object"),
        (200, b'"x"', 1, "HTTP 200 with JSON that is not an object"),
        (200, b"{}", 1, "not a rollout result: a result needs the fields"),
        (200, json.dumps({**ONE_ROW, "completion_mask": [[True]]}).encode(), 1,
         r"`completion_ids` \(1, 2\) and `completion_mask` \(1, 1\)"),
        (200, json.dumps({**ONE_ROW, "finish_reasons": []}).encode(), 1,
         r"1 rows but \{'finish_reasons': 0\}"),
        (200, json.dumps({**ONE_ROW, "logprobs": [[0.0]], "logprobs_dtype": "torch.float32"})
         .encode(), 1, r"`logprobs` \(1, 1\) must have the shape"),
        (200, json.dumps(ONE_ROW).encode(), 2, r"1 rows for 1 prompts x n = 2"),
    ],
    ids=["500-list", "200-list", "200-string", "200-empty", "mask-shape", "finish-reasons",
         "logprobs-shape", "rows-not-prompts-x-n"],
)  # fmt: skip
def test_a_body_that_is_not_a_rollout_result_is_a_server_error(
    status: int, body: bytes, n: int, match: str
) -> None:
    with raw_server(answer(status, body)) as url:
        remote = RemoteEngine(url, timeout=60.0)
        with pytest.raises(RolloutServerError, match=match) as info:
            remote.generate([[5]], SamplingParams(max_new_tokens=2, n=n))
    assert url in str(info.value)
    assert "is this an rl-rollout server?" in str(info.value)


@pytest.mark.parametrize("call", ["health", "generate"])
def test_a_trickling_reply_ends_at_the_deadline(call: str) -> None:
    """Headers, then one byte at a time: each read comes quickly, the whole never in time."""
    release = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000\r\n\r\n")  # fmt: skip
        while not release.is_set():
            conn.sendall(b" ")
            release.wait(0.05)  # blocked between bytes until the test ends

    try:
        with raw_server(trickle) as url:
            remote = RemoteEngine(url, timeout=0.5)
            run = {
                "health": remote.health,
                "generate": lambda: remote.generate([[5]], SamplingParams(max_new_tokens=2)),
            }[call]
            error = raised_by(run, HANG_GUARD_S)
    finally:
        release.set()
    assert isinstance(error, RolloutServerError), repr(error)
    assert f"the reply from {url}/{call} did not finish within 0.5 s (`timeout`" in str(error)


def test_trickling_headers_end_at_the_deadline() -> None:
    """The status line, then one header byte at a time: the deadline covers the headers too."""
    release = threading.Event()

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while not release.is_set():
            conn.sendall(b"a")
            release.wait(0.05)  # blocked between bytes until the test ends

    try:
        with raw_server(trickle) as url:
            error = raised_by(RemoteEngine(url, timeout=0.5).health, HANG_GUARD_S)
    finally:
        release.set()
    assert isinstance(error, RolloutServerError), repr(error)
    assert f"no reply from {url}/health within 0.5 s (`timeout`)" in str(error)


def raw_post(
    url: str, path: str, head: bytes, body: bytes, *, died: bool = False
) -> tuple[int, dict[str, object]]:
    """Send ``head`` (request line and headers) and ``body`` and read the answer; ``died``: close
    the sending side first (a client that died mid-upload; the server reads end-of-stream)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60.0) as conn:
        conn.sendall(head.replace(b"PATH", path.encode()) + b"\r\n\r\n" + body)
        if died:
            conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_malformed_requests_to_the_native_routes_are_400_naming_the_field(
    served: tuple[HFEngine, RemoteEngine],
) -> None:
    local, remote = served
    head = b"POST PATH HTTP/1.1\r\nHost: x\r\nContent-Length: %d"
    weights = save_safetensors(
        {"model.norm.weight": torch.zeros_like(local.model.model.norm.weight)}
    )
    cases = [
        ("/generate", b"{not json", "the body of /generate is not valid JSON"),
        ("/generate", b"{}", "`prompts` is required in the body of /generate"),
        ("/load_lora", b"{}", "`name` is required in the body of /load_lora"),
        ("/traces/pop", b"{}", "`episode_id` is required in the body of /traces/pop"),
        ("/sleep", b'{"level": "x"}', "`level` must be an int"),
        ("/update_weights", b"garbage!garbage!", "the body of /update_weights is not a "
         "safetensors payload"),
    ]  # fmt: skip
    for path, body, match in cases:
        status, answer = raw_post(remote.base_url, path, head % len(body), body)
        assert status == 400, (path, answer)
        assert match in str(answer["message"]), (path, answer)
    # a truncated upload: half the body, then the client is gone
    before = dict(local.model.named_parameters())["model.norm.weight"].detach().clone()
    status, answer = raw_post(remote.base_url, "/update_weights", head % len(weights),
                              weights[: len(weights) // 2], died=True)  # fmt: skip
    assert status == 400, answer
    assert f"the request body ended after {len(weights) // 2} of its {len(weights)} bytes" in str(
        answer["message"]
    )
    after = dict(local.model.named_parameters())["model.norm.weight"]
    assert torch.equal(after, before)  # bit-exact: nothing was loaded
    assert remote.health()["status"] == "ok"  # and the server still serves


def test_closing_a_server_returns_whether_or_not_it_started() -> None:
    model, tok = tiny("qwen2", seed=3)
    for start in (False, True):
        server = RolloutServer(HFEngine(model, tok))
        if start:
            server.start()
        for _ in range(2):  # and twice
            thread = threading.Thread(target=server.close, daemon=True)
            thread.start()
            thread.join(HANG_GUARD_S)
            assert not thread.is_alive(), f"close() hung (started: {start})"
        remote = RemoteEngine(server.url, connect_timeout=5.0)
        error = raised_by(remote.health, HANG_GUARD_S)
        assert isinstance(error, RolloutServerError), repr(error)
        assert "cannot reach the rollout server" in str(error)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "localhost:8000"}, "`base_url` must look like"),
        ({"base_url": "http://localhost"}, "`base_url` must look like"),
        ({"base_url": "http://h:1", "timeout": 0}, "`timeout` must be > 0"),
        ({"base_url": "http://h:1", "connect_timeout": -1}, "`connect_timeout` must be > 0"),
    ],
)
def test_remote_engine_arguments_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RemoteEngine(**kwargs)  # type: ignore[arg-type]


def test_wire_round_trips_exactly() -> None:
    mask = torch.zeros(20, dtype=torch.bool)
    mask[[3, 7, 9]] = True
    params = SamplingParams(temperature=0.3, top_k=4, top_p=0.5, min_p=0.1,
                            repetition_penalty=1.2, max_new_tokens=9, min_new_tokens=2,
                            stop=("ab", "c"), stop_token_ids=(5,), n=3, seed=7,
                            logit_mask=mask, return_logprobs=True)  # fmt: skip
    back = params_from_json(params_to_json(params))
    assert back.logit_mask is not None
    assert torch.equal(back.logit_mask, mask)  # bit-exact: a bool mask
    for field in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "stop",
                  "stop_token_ids", "n", "seed", "max_new_tokens", "min_new_tokens"):  # fmt: skip
        assert getattr(back, field) == getattr(params, field), field
    with pytest.raises(ValueError, match="unknown sampling parameters"):
        params_from_json({"temprature": 1.0})

    model, tok = tiny("llama", seed=1)
    result = HFEngine(model, tok).generate(
        ["ab", "c"], SamplingParams(n=2, max_new_tokens=5, seed=0, return_logprobs=True)
    )
    back_result = result_from_json(result_to_json(result))
    assert_same_result(back_result, result)
    assert back_result.logprobs is not None
    assert result.logprobs is not None
    assert torch.equal(back_result.logprobs, result.logprobs)  # bit-exact float32


def test_command_line_server_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``rl-rollout-server --engine hf`` in a real subprocess, then a remote generate."""
    import subprocess
    import sys

    from rl_testing.models import save_tiny, tiny_causal_lm

    model, tok = tiny_causal_lm("llama", seed=4)
    save_tiny(model, tok, tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rl_rollout", "--engine", "hf", "--model", str(tmp_path),
           "--tokenizer", str(tmp_path / "tokenizer"), "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        seen = []
        while not seen or f"http://127.0.0.1:{port}" not in seen[-1]:
            line = proc.stdout.readline()
            assert line, f"server exited before serving: {''.join(seen)}"
            seen.append(line)
        remote = RemoteEngine(f"http://127.0.0.1:{port}", timeout=60.0)
        params = SamplingParams(max_new_tokens=5, n=2, seed=9, return_logprobs=True)
        local = HFEngine(model, tok).generate(["abc"], params)
        assert_same_result(remote.generate(["abc"], params), local)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
