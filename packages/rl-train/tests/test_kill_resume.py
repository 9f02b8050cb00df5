"""SIGKILL between checkpoints, then ``train.resume=true``: the same steps and metrics history."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rl_train import MetricsLogger

ARGS = ["train.steps=60", "train.evaluation_interval=10", "train.checkpoint_steps=20",
        "data.n_train=80", "data.n_test=8", "data.prompts_per_step=4", "agent.group_size=4"]  # fmt: skip


def rl_train() -> str:
    exe = shutil.which("rl-train", path=str(Path(sys.executable).parent))
    assert exe is not None
    return exe


@pytest.mark.slow  # three training processes, about 80 s: `nox -s slow`
def test_sigkill_then_resume_repeats_the_uninterrupted_history(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full = tmp_path / "full"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: grpo\nmodel:\n  name: tiny\n")
    done = subprocess.run([rl_train(), "run", str(cfg), *ARGS, f"train.run_dir={full}", "--quiet"],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]

    cut = tmp_path / "cut"
    proc = subprocess.Popen([rl_train(), "run", str(cfg), *ARGS, f"train.run_dir={cut}", "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    pointer = cut / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 120
    while not pointer.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = json.loads(pointer.read_text())["step"]
    assert killed_at in (20, 40), killed_at  # killed mid-run, after a checkpoint
    resumed = subprocess.run([rl_train(), "run", str(cfg), *ARGS, f"train.run_dir={cut}",
                              "train.resume=true", "--quiet"],
                             env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = MetricsLogger.read(full / "metrics.jsonl")
    b = MetricsLogger.read(cut / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, 61))
    for x, y in zip(a, b, strict=True):
        x.pop("step_time"), y.pop("step_time")
        assert x == y, (x["step"], x, y)
