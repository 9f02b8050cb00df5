"""Adapter-only weight sync: the wire form, the merge, the server route and its failures.

A real HFEngine serves a tiny model behind a real RolloutServer in this process; the down and
silent servers are real sockets (closed, or accepting and never answering).
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from rl_rollout import HFEngine, RemoteEngine, RolloutServer, RolloutServerError, SamplingParams
from rl_rollout._arrival import ArrivalOrderLock
from rl_rollout.lora_sync import LoraAdapter, adapter_from_bytes, adapter_to_bytes, merged_weights
from rl_testing.serving import raised_by
from rl_testing.tolerance import assert_close
from rollout_testlib import tiny
from test_engine import assert_same_result

#: Seconds after which a call that must fail within its own (sub-second) timeouts counts as
#: hung: a hang guard, far beyond the timeouts configured here, never a speed limit.
HANG_GUARD_S = 120.0

TARGETS = ("q_proj", "v_proj", "down_proj")
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=5, n=2, seed=7, return_logprobs=True)


def _adapter(model: torch.nn.Module, r: int = 4, seed: int = 0, version: int = 1) -> LoraAdapter:
    """A random rank-``r`` adapter on ``TARGETS`` of ``model``, in peft's saved form."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
            out_f, in_f = module.weight.shape
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(r, in_f, generator=gen)
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(out_f, r, generator=gen)
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": set(TARGETS)}
    return LoraAdapter("actor", version, config, tensors)


@pytest.fixture
def served() -> Iterator[tuple[HFEngine, RemoteEngine, torch.nn.Module]]:
    model, tok = tiny("qwen2", seed=3)
    reference, _ = tiny("qwen2", seed=3)  # the same base weights, never touched
    engine = HFEngine(model, tok)
    with RolloutServer(engine) as server:
        yield engine, RemoteEngine(server.url, timeout=60.0, connect_timeout=5.0), reference


def test_the_payload_is_the_tensors_plus_a_small_header() -> None:
    model, _ = tiny("qwen2", seed=0)
    adapter = _adapter(model)
    body = adapter_to_bytes(adapter)
    (header,) = struct.unpack("<Q", body[:8])
    assert len(body) == adapter.tensor_bytes + 8 + header  # safetensors: size, JSON, data
    assert header < 200 * len(adapter.tensors) + 1024  # names, shapes, offsets and the config
    back = adapter_from_bytes(body)
    assert (back.name, back.version) == ("actor", 1)
    assert back.config["r"] == 4 and sorted(back.config["target_modules"]) == sorted(TARGETS)
    for key, tensor in adapter.tensors.items():
        assert torch.equal(back.tensors[key], tensor), key  # bit-exact: bytes on the wire
    with pytest.raises(ValueError, match="not an adapter of format"):
        adapter_from_bytes(json.dumps({}).encode().rjust(16))
    with pytest.raises(ValueError, match=r"the adapter payload's tensors are unreadable"):
        adapter_from_bytes(body[: len(body) - 1])  # cut short: an upload that ended early


def test_a_truncated_adapter_upload_is_refused_and_leaves_the_served_one(
    served: tuple[HFEngine, RemoteEngine, torch.nn.Module],
) -> None:
    """The client dies mid-upload: a 400 naming the bytes, and the served version stays."""
    _, remote, reference = served
    good = _adapter(reference, version=1)
    remote.load_adapter(good.name, good.tensors, good.config, good.version)
    expected = remote.generate(["ab"], PARAMS)
    body = adapter_to_bytes(_adapter(reference, seed=1, version=2))
    host, port = remote.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60.0) as conn:
        conn.sendall(f"POST /load_adapter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                     "\r\n\r\n".encode() + body[: len(body) // 2])  # fmt: skip
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 400"), reply
    assert f"ended after {len(body) // 2} of its {len(body)} bytes".encode() in reply, reply
    result = remote.generate(["ab"], PARAMS)
    assert result.weight_version == 1
    assert_same_result(result, expected)


def test_the_merge_is_w_plus_s_b_a() -> None:
    """Against a float64 reference; and bit for bit the float32 expression peft evaluates."""
    model, _ = tiny("qwen2", seed=0)
    adapter = _adapter(model, r=4)
    merged = merged_weights(model, adapter)
    modules = dict(model.named_modules())
    assert sorted(merged) == sorted({k.split(".lora_")[0][len("base_model.model.") :]
                                     for k in adapter.tensors})  # fmt: skip
    for name, weight in merged.items():
        a = adapter.tensors[f"base_model.model.{name}.lora_A.weight"]
        b = adapter.tensors[f"base_model.model.{name}.lora_B.weight"]
        w = modules[name].weight.detach()
        # bit-exact: the float32 ops of peft's get_delta_weight (s = lora_alpha / r = 8 / 4)
        assert torch.equal(weight, w + (b @ a) * 2.0)
        expected = w.double() + 2.0 * b.double() @ a.double()
        assert_close(weight, expected, reduction=4, stages=2)


def test_a_served_adapter_samples_as_the_merged_model(
    served: tuple[HFEngine, RemoteEngine, torch.nn.Module],
) -> None:
    engine, remote, reference = served
    prompts = ["hello", "ab"]
    before = remote.generate(prompts, PARAMS)
    assert before.weight_version is None  # no adapter yet
    adapter = _adapter(reference, version=3)
    remote.load_adapter(adapter.name, adapter.tensors, adapter.config, adapter.version)
    assert remote.last_sync["bytes"] == len(adapter_to_bytes(adapter))
    assert remote.last_sync["tensor_bytes"] == adapter.tensor_bytes
    after = remote.generate(prompts, PARAMS)
    assert after.weight_version == 3
    # the same sampling from a local model whose weights are the merged ones
    merged = merged_weights(reference, adapter)
    modules = dict(reference.named_modules())
    with torch.no_grad():
        for name, weight in merged.items():
            modules[name].weight.copy_(weight)
    assert_same_result(after, HFEngine(reference, engine.tokenizer).generate(prompts, PARAMS))
    # the next version replaces this one (merged from the original base weights)
    second = _adapter(reference, seed=1, version=4)
    remote.load_adapter(second.name, second.tensors, second.config, second.version)
    assert remote.generate(prompts, PARAMS).weight_version == 4
    base, _ = tiny("qwen2", seed=3)
    for name, weight in merged_weights(base, second).items():  # bit-exact: the same merge
        assert torch.equal(dict(engine.model.named_modules())[name].weight, weight), name
    # a full-weight sync drops the adapter: the originals are back, then overwritten
    name, param = next(iter(base.named_parameters()))
    remote.update_weights([(name, param.detach())])
    assert remote.generate(prompts, PARAMS).weight_version is None
    assert_same_result(remote.generate(prompts, PARAMS), before)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("rank", r"wrong rank"),
        ("module", r"targets module 'model\.layers\.0\.nope'.*unknown target module"),
        ("dora", r"`use_dora` = True is not supported"),
        ("int", r"tensor '\S+\.lora_[AB]\.weight' is torch\.int64: LoRA tensors must be floating"),
        ("nan", r"tensor '\S+\.lora_A\.weight' has values that are not finite \(NaN or inf\)"),
    ],
)
def test_a_refused_adapter_names_the_server_and_leaves_the_served_one(
    served: tuple[HFEngine, RemoteEngine, torch.nn.Module], change: str, match: str
) -> None:
    _, remote, reference = served
    good = _adapter(reference, version=1)
    remote.load_adapter(good.name, good.tensors, good.config, good.version)
    expected = remote.generate(["ab"], PARAMS)
    tensors, config = dict(good.tensors), dict(good.config)
    if change == "rank":
        config["r"] = 8
    elif change == "module":
        tensors["base_model.model.model.layers.0.nope.lora_A.weight"] = torch.zeros(4, 4)
        tensors["base_model.model.model.layers.0.nope.lora_B.weight"] = torch.zeros(4, 4)
    elif change == "int":
        tensors = {k: (t * 10).long() for k, t in tensors.items()}
    elif change == "nan":
        key = next(k for k in tensors if k.endswith("lora_A.weight"))
        tensors[key] = torch.full_like(tensors[key], float("nan"))
    else:
        config["use_dora"] = True
    with pytest.raises(ValueError, match=match) as info:
        remote.load_adapter("actor", tensors, config, 2)
    assert re.search(rf"rollout server at {remote.base_url} refused adapter 'actor' version 2",
                     str(info.value))  # fmt: skip
    result = remote.generate(["ab"], PARAMS)  # nothing half-loaded: version 1 still serves
    assert result.weight_version == 1
    assert_same_result(result, expected)


def test_a_down_server_fails_after_the_retries_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteEngine(f"http://127.0.0.1:{port}", connect_timeout=1.0, sync_retries=1)
    model, _ = tiny("qwen2", seed=0)
    adapter = _adapter(model)
    with pytest.raises(RolloutServerError) as info:
        remote.load_adapter(adapter.name, adapter.tensors, adapter.config, adapter.version)
    message = str(info.value)
    assert f"rollout server at http://127.0.0.1:{port} failed after 2 tries" in message
    assert "adapter 'actor' version 1" in message and "cannot reach" in message


def test_a_silent_server_times_out_instead_of_hanging() -> None:
    """A server that accepts and never answers: each try ends at the timeout, then an error."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        for _ in range(2):
            accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    remote = RemoteEngine(f"http://127.0.0.1:{port}", weight_sync_timeout=0.5, sync_retries=1)
    model, _ = tiny("qwen2", seed=0)
    adapter = _adapter(model)
    try:
        error = raised_by(
            lambda: remote.load_adapter(
                adapter.name, adapter.tensors, adapter.config, adapter.version
            ),
            HANG_GUARD_S,
        )
        assert isinstance(error, RolloutServerError), error
        assert re.search(r"adapter 'actor' version 1 \(\d+ bytes\) to the rollout server at "
                         rf"http://127\.0\.0\.1:{port} failed after 2 tries", str(error))  # fmt: skip
        assert "no reply from" in str(error) and "within 0.5 s" in str(error)
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds (a hang guard, never a speed limit)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"hung waiting for {what}")
        time.sleep(0.01)


def test_syncs_queued_behind_the_engine_apply_in_arrival_order() -> None:
    """Version 5 arrives before version 6 while the engine is busy: 6 is what is served.

    The engine is held (as a long generation holds it); a sync the trainer may have given up
    on (version 5) waits, then the newer one (6). Released, they apply in arrival order, so the
    server ends on the newer weights, never on the stale ones.
    """
    model, tok = tiny("qwen2", seed=3)
    reference, _ = tiny("qwen2", seed=3)
    engine = HFEngine(model, tok)
    with RolloutServer(engine) as server:
        remote = RemoteEngine(server.url, timeout=60.0, connect_timeout=5.0)
        _sync_in_order(server, remote, engine, reference)


def _sync_in_order(
    server: RolloutServer, remote: RemoteEngine, engine: HFEngine, reference: torch.nn.Module
) -> None:
    server_lock = server._lock
    adapters = [_adapter(reference, seed=s, version=v) for s, v in ((5, 5), (6, 6))]
    errors: list[BaseException] = []

    def send(adapter: LoraAdapter) -> None:
        try:
            remote.load_adapter(adapter.name, adapter.tensors, adapter.config, adapter.version)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = []
    server_lock.acquire()
    try:
        for queued, adapter in enumerate(adapters, start=1):
            threads.append(threading.Thread(target=send, args=(adapter,), daemon=True))
            threads[-1].start()
            _wait_for(lambda n=queued: server_lock.waiting == n, f"{queued} queued syncs")
    finally:
        server_lock.release()
    for thread in threads:
        thread.join(HANG_GUARD_S)
    assert not errors, errors
    assert remote.generate(["ab"], PARAMS).weight_version == 6
    engine_weights = dict(engine.model.named_modules())
    base, _ = tiny("qwen2", seed=3)
    for name, weight in merged_weights(base, adapters[1]).items():  # bit-exact: the same merge
        assert torch.equal(engine_weights[name].weight, weight), name


def test_the_arrival_order_lock_serves_waiters_first_come_first_served() -> None:
    lock = ArrivalOrderLock()
    order: list[int] = []
    lock.acquire()
    threads = []
    for i in range(6):

        def take(i: int = i) -> None:
            with lock:
                order.append(i)

        threads.append(threading.Thread(target=take, daemon=True))
        threads[-1].start()
        _wait_for(lambda n=i + 1: lock.waiting == n, f"{i + 1} waiters")
    lock.release()
    for thread in threads:
        thread.join(HANG_GUARD_S)
    assert order == list(range(6))
    assert not lock.locked
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
