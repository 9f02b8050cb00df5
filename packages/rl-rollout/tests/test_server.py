"""Server mode: a real HFEngine behind RolloutServer, driven through RemoteEngine.

Nothing is faked: the server runs the tiny model in a thread of this process; the timeout and
refused-connection cases use real sockets that never answer / are closed.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator

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
    assert remote.health() == {"status": "ok", "engine": "HFEngine"}


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
