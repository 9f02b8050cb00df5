"""LoRA training on a rollout server: adapter-only weight sync, synchronous and asynchronous.

A real ``rl-rollout-server`` process (hf engine) serves the base model from its own directory
and runs in another working directory: nothing but HTTP connects it to the trainer, whose
run directory it cannot see. The trainer sends it the actor adapter's tensors after each
update; the runs must equal the local ones bit for bit where the local run is the same
computation (synchronous, and asynchronous at staleness 0).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rl_testing.serving import raised_by
from rl_train.config import AsyncConfig, RunConfig
from rl_train.demo import DemoConfig
from rl_train.run import train
from run_rows import SMALL, metric_rows, sync_part

#: Seconds after which a run that must fail within its own (sub-second) timeouts counts as
#: hung: a hang guard, far beyond the timeouts configured here, never a speed limit.
HANG_GUARD_S = 300.0


def _lora_config(demo: DemoConfig, model_dir: Path, run_dir: Path) -> RunConfig:
    """The demo's run on the tiny model saved at ``model_dir``, trained as a LoRA adapter."""
    from rl_train.tiny import TINY_AGENT

    config = demo.run_config(run_dir)
    config.model.name = str(model_dir)  # not "tiny": that name always fine-tunes fully
    config.model.lora_r, config.model.lora_alpha = 4, 8
    config.agent = {**TINY_AGENT, **config.agent, "lr": 0.01}
    return config


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The LoRA demo's base: the tiny model with the final norm's weight LoRA needs."""
    from rl_train.tiny import TINY_LORA_NORM_WEIGHT, tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("trainer-model")
    tok = tiny_tokenizer()
    tiny_model(len(tok), seed=0, norm_weight=TINY_LORA_NORM_WEIGHT).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[str]:
    """A server process with its own copy of the base model and its own working directory."""
    import shutil

    home = tmp_path_factory.mktemp("server-home")
    shutil.copytree(model_dir, home / "model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rl_rollout", "--engine", "hf", "--model", "model",
           "--port", str(port), "--max-model-len", "64"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(_threads())}
    proc = subprocess.Popen(
        cmd, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while not seen or f"http://127.0.0.1:{port}" not in seen[-1]:
            line = proc.stdout.readline()
            assert line, f"rollout server exited before serving: {''.join(seen)}"
            seen.append(line)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


DEMO = DemoConfig(steps=4, evaluation_interval=2, **SMALL)


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> list[dict[str, float]]:
    """The local synchronous LoRA run both server runs must equal."""
    run_dir = tmp_path_factory.mktemp("local")
    train(_lora_config(DEMO, model_dir, run_dir), verbose=False)
    return metric_rows(run_dir)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def test_async_staleness_0_on_the_server_is_the_local_run_bit_for_bit(
    tmp_path: Path, model_dir: Path, server: str, local_rows: list[dict[str, float]]
) -> None:
    config = _lora_config(DEMO, model_dir, tmp_path / "async")
    config.async_ = AsyncConfig(max_staleness=0, engine_url=server)
    train(config, verbose=False)
    local, asyn = local_rows, metric_rows(tmp_path / "async")
    assert [r["step"] for r in asyn] == [1, 2, 3, 4]
    assert sync_part(asyn) == local  # every learn metric, reward and evaluation, exactly
    assert local[-1]["loss"] != local[0]["loss"]


def test_sync_on_the_server_is_the_local_run_bit_for_bit(
    tmp_path: Path, model_dir: Path, server: str, local_rows: list[dict[str, float]]
) -> None:
    """``engine_url``: ``get_action`` samples on the server, the adapter is pushed after each
    update; the run is the local one (the same merged weights, the same seeds)."""
    config = _lora_config(DEMO, model_dir, tmp_path / "remote")
    config.engine_url = server
    train(config, verbose=False)
    local, remote = local_rows, metric_rows(tmp_path / "remote")
    assert [r["step"] for r in remote] == [1, 2, 3, 4]
    assert remote == local  # every learn metric, reward and evaluation, exactly


def test_a_sync_moves_the_adapter_bytes_plus_a_small_header(
    tmp_path: Path, model_dir: Path, server: str
) -> None:
    import struct

    from rl_algos.server_sync import actor_adapter
    from rl_rollout.lora_sync import LoraAdapter, adapter_to_bytes
    from rl_train.builder import build

    config = _lora_config(DemoConfig(**SMALL), model_dir, tmp_path / "r")
    config.engine_url = server
    built = build(config, distributed=False)
    engine = built.agent.engine
    sent = engine.push(7)
    tensors, peft_config = actor_adapter(built.agent.policy)
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    body = adapter_to_bytes(LoraAdapter("actor", 7, peft_config, tensors))
    (header,) = struct.unpack("<Q", body[:8])
    assert sent == len(body) == tensor_bytes + 8 + header  # safetensors: size, header, data
    assert header < 200 * len(tensors) + 4096  # names, shapes, offsets and the peft config
    model_bytes = sum(p.numel() * p.element_size() for p in built.model.parameters())
    assert tensor_bytes < model_bytes / 10  # the adapter, not the model
    actor = built.agent.actor_parameters()
    assert tensor_bytes == sum(p.numel() * p.element_size() for p in actor)
    prompts = built.env.reset()
    result = built.agent.get_action(prompts)
    assert result.rollout.input_ids.shape[0] == SMALL["prompts_per_step"] * SMALL["group_size"]
    assert engine.version == 7


def test_a_server_down_stops_the_sync_run_naming_it(tmp_path: Path, model_dir: Path) -> None:
    from rl_rollout import RolloutServerError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = _lora_config(DemoConfig(steps=2, **SMALL), model_dir, tmp_path / "down")
    config.engine_url = f"http://127.0.0.1:{port}"
    with pytest.raises(RolloutServerError, match=rf"cannot reach .*127\.0\.0\.1:{port}"):
        train(config, verbose=False)


#: 1.5x the median measured steps to greedy accuracy 0.9 (250; the docstring below).
LORA_BUDGET = 375


@pytest.mark.slow  # up to 3 x 375 LoRA GRPO steps with a worker and the server: `nox -s slow`
def test_lora_on_the_server_at_staleness_1_learns_the_demo(
    tmp_path: Path, model_dir: Path, server: str
) -> None:
    """Issue 45's learning acceptance: the LoRA demo setting (``rl_train.tiny.TINY_LORA_AGENT``
    on the base with ``TINY_LORA_NORM_WEIGHT``; rank 16, alpha 32, all linear layers) at
    ``max_staleness: 1`` on the server reaches greedy accuracy 0.9, as the local asynchronous
    run does. The worker samples a batch ahead with the previous adapter; each push carries the
    policy version, checked against every sample the server returns.

    The learning table's rule (tests_integration/learning_table.py): one of seeds 0, 1, 2, tried
    in turn, reaches 0.9 within 1.5x the median of the measured steps. Measured on an AVX2 CPU
    (docs/tutorials/async.md): 250, 175 and 275 steps, on the server and locally alike (the
    same learn metrics and evaluations, row by row); median 250, budget 375. Another CPU's
    kernels (``ATEN_CPU_CAPABILITY=default``) change the trajectories, not what is learned.
    """
    from rl_train.tiny import TINY_LORA_AGENT

    curves = {}
    for seed in (0, 1, 2):
        run_dir = tmp_path / f"seed{seed}"
        config = DemoConfig(steps=LORA_BUDGET, seed=seed).run_config(run_dir)
        config.model.name = str(model_dir)  # rank 16, alpha 32, all-linear: ModelConfig's defaults
        config.agent = {**TINY_LORA_AGENT, **config.agent, "clip_against_sampler": True}
        config.async_ = AsyncConfig(max_staleness=1, engine_url=server, timeout_s=300)
        train(config, verbose=False)
        rows = metric_rows(run_dir)
        assert max(r["async_staleness_max"] for r in rows) == 1  # stale batches were used
        curves[seed] = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
        if any(accuracy >= 0.9 for _, accuracy in curves[seed]):
            return
    pytest.fail(f"no seed reached greedy accuracy 0.9 within {LORA_BUDGET} steps: {curves}")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["engine_url=localhost:8000"], r"engine_url must look like 'http://host:port'"),
        (["engine_url=http://h:1", "async.max_staleness=0"], r"with async: set async.engine_url"),
        (["engine_url=http://h:1", "engine=vllm"], r"the server runs the engine"),
        (["engine_url=http://h:1", "deepspeed_config=ds.json"], r"not DeepSpeed"),
        (["engine_url=http://h:1", "engine_timeout=0"], r"engine_timeout must be > 0"),
    ],
)
def test_engine_url_is_checked_when_the_config_is_read(overrides: list[str], match: str) -> None:
    from rl_train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


@pytest.mark.slow  # two trainer processes (torchrun, gloo), twice: `nox -s slow`
def test_under_ddp_the_first_process_pushes_and_the_run_is_the_local_one(
    tmp_path: Path, model_dir: Path, server: str
) -> None:
    """``rl-train run`` under torchrun with 2 processes: both sample on the one server, the
    first pushes the adapter and both wait for it; the metrics equal the local DDP run's."""
    import yaml
    from rl_train.tiny import TINY_AGENT

    cfg = tmp_path / "c.yaml"
    agent = {**TINY_AGENT, "lr": 0.01, "group_size": 4}
    model = {"name": str(model_dir), "lora_r": 4, "lora_alpha": 8}
    cfg.write_text(yaml.safe_dump({"algo": "grpo", "model": model, "agent": agent}))
    common = ["train.steps=4", "train.evaluation_interval=2", "train.checkpoint_steps=4",
              "data.n_train=64", "data.n_test=8", "data.prompts_per_step=2"]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    for name, extra in (("local", []), ("remote", [f"engine_url={server}"])):
        with socket.socket() as s:  # torchrun's --master_port 0 hangs: pick a free port
            s.bind(("127.0.0.1", 0))
            master = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(master), "-m", "rl_train",
               "run", str(cfg), *common, *extra, f"train.run_dir={tmp_path / name}",
               "--quiet"]  # fmt: skip
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    local, remote = metric_rows(tmp_path / "local"), metric_rows(tmp_path / "remote")
    assert [r["step"] for r in remote] == [1, 2, 3, 4]
    assert remote == local


def test_a_server_that_stalls_on_the_adapter_stops_the_run_naming_both(
    tmp_path: Path, model_dir: Path
) -> None:
    """A server that answers ``/health`` but never ``/load_adapter`` (a stuck load): each try
    ends at ``engine_timeout``, then the run stops naming the server and the adapter."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rl_rollout import RolloutServerError

    release = threading.Event()

    class Stalls(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            body = json.dumps({"status": "ok", "engine": "HFEngine"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            release.wait(HANG_GUARD_S)  # never answers while the test runs

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Stalls)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    config = _lora_config(DemoConfig(steps=2, **SMALL), model_dir, tmp_path / "stall")
    config.engine_url, config.engine_timeout = url, 0.5
    try:
        error = raised_by(lambda: train(config, verbose=False), HANG_GUARD_S)
        assert isinstance(error, RolloutServerError), error
        message = str(error)
        assert "adapter 'actor' version 0" in message and f"server at {url} failed" in message
        assert "no reply from" in message and "within 0.5 s" in message
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()


def test_a_server_with_another_base_refuses_the_adapter_naming_both(
    tmp_path: Path, model_dir: Path
) -> None:
    """A server whose model has one layer where the trainer's has two: the first push is
    refused (unknown target module) and the run stops with the server's URL and the adapter."""
    from rl_rollout import HFEngine, RolloutServer
    from rl_train.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    other = tiny_model(len(tok), seed=0)
    other.model.layers = other.model.layers[:1]  # another base: the second layer is missing
    config = _lora_config(DemoConfig(steps=2, **SMALL), model_dir, tmp_path / "other")
    with RolloutServer(HFEngine(other, tok)) as served:
        config.engine_url = served.url
        with pytest.raises(ValueError, match="unknown target module") as info:
            train(config, verbose=False)
    message = str(info.value)
    assert f"rollout server at {served.url} refused adapter 'actor' version 0" in message
    assert "model.layers.1." in message


def test_a_clone_samples_on_the_server_with_its_own_adapter(
    tmp_path: Path, model_dir: Path
) -> None:
    """Evolution clones agents: a clone keeps the server and sends its own adapter under its
    own name before it samples, so neither agent samples with the other's adapter."""
    import torch
    from rl_algos.server_sync import ServerEngine
    from rl_rollout import HFEngine, RolloutServer
    from rl_train.builder import build
    from rl_train.experience import collect, learn_from
    from transformers import AutoModelForCausalLM, AutoTokenizer

    server_model = AutoModelForCausalLM.from_pretrained(model_dir)
    with RolloutServer(HFEngine(server_model, AutoTokenizer.from_pretrained(model_dir))) as served:
        config = _lora_config(DemoConfig(**SMALL), model_dir, tmp_path / "r")
        config.engine_url = served.url
        built = build(config, distributed=False)
        agent, env = built.agent, built.env
        twin = agent.clone(index=1)
        assert isinstance(twin.engine, ServerEngine) and twin.engine.remote is agent.engine.remote
        prompts = env.reset()
        for _ in range(2):  # the agent learns, the clone does not: their adapters differ
            experience, prompts = collect(agent, env, prompts)
            learn_from(agent, experience)
        on_server, rngs = {}, {}
        for who in (twin, agent, twin):
            rngs[id(who)] = (who._rng.getstate(), who._torch_rng.get_state())
            on_server[who.engine.adapter_name] = who.get_action(prompts).rollout
            assert (served.engine.adapter, served.engine.weight_version) == (
                who.engine.adapter_name,
                who.engine.version,
            )
        assert set(on_server) == {"actor", "actor-1"}
        for who in (agent, twin):  # the same rows as generating with its own weights here
            who.engine = who.make_engine(who.policy)
            who.config.merge_lora_for_generation = True  # as the server: W + s B A
            who._rng.setstate(rngs[id(who)][0])  # the seeds of its last sample on the server
            who._torch_rng.set_state(rngs[id(who)][1])
            local = who.get_action(prompts).rollout
            mine = on_server["actor" if who is agent else "actor-1"]
            # bit-exact: the server merges W + s B A in peft's order, the same seeds sample
            assert torch.equal(local.input_ids, mine.input_ids)
            assert torch.equal(local.sampling_logprobs, mine.sampling_logprobs)  # bit-exact
        # bit-exact: any difference at all shows the two adapters were not the same
        assert not torch.equal(
            on_server["actor"].sampling_logprobs, on_server["actor-1"].sampling_logprobs
        )
