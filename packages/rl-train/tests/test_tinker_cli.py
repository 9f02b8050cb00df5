"""``rl-train tinker-server``: the command serves a model to the SDK; bad setups exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import tinker
from rl_train.cli import main
from tinker import types
from tinker_testlib import KEY, free_port, write_tiny

#: Hang guard for the server process to answer (it imports torch and loads the model first).
START_GUARD_S = 300


def test_missing_key_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert main(["tinker-server", "--model", "nowhere"]) == 2
    assert "needs --api-key or TINKER_API_KEY" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter imports torch and the model stack: ~20 s on 2 cores
def test_the_command_serves_the_sdk(tmp_path: Path) -> None:
    model_dir = write_tiny(tmp_path / "model")
    port = free_port()
    env = {**os.environ, "TINKER_TELEMETRY": "0", "TINKER_API_KEY": KEY}
    command = [sys.executable, "-m", "rl_train", "tinker-server", "--model", str(model_dir)]
    command += ["--port", str(port), "--checkpoint-dir", str(tmp_path / "checkpoints")]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_GUARD_S  # a hang guard, not a speed check
        while True:
            assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
            try:
                if httpx.get(f"{url}/api/v1/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server never answered"
            time.sleep(0.2)
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        client = service.create_lora_training_client(base_model=str(model_dir), rank=2).result()
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([3, 5, 7]),
            loss_fn_inputs={"target_tokens": [5, 7, 9], "weights": [1.0, 1.0, 1.0]},
        )
        out = client.forward_backward([datum], "cross_entropy").result()
        assert out.metrics["loss:sum"] > 0
        service.close("success").result()
    finally:
        server.terminate()
        server.wait(timeout=60)
