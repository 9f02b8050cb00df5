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


def test_sigterm_stops_cleanly_with_one_line_and_the_run_resumes(tmp_path: Path) -> None:
    """SIGTERM (a scheduler's preemption, ``docker stop``, ``timeout``) mid-run: the run stops
    through its cleanup (TensorBoard holds every row it logged), says in one line where to
    resume from, exits 143; the resumed run finishes with every step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def tensorboard_steps(run: Path) -> list[int]:
        events = EventAccumulator(str(run / "tensorboard"))
        events.Reload()
        return [e.step for e in events.Scalars("loss")]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: grpo\nmodel:\n  name: tiny\n")
    run = tmp_path / "run"
    args = [rl_train(), "run", str(cfg), *ARGS, "train.steps=200", "train.checkpoint_steps=5",
            f"train.run_dir={run}", "--quiet"]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    pointer = run / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 120  # a hang guard for the start
    while not pointer.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    saved = json.loads(pointer.read_text())["step"]
    assert err.strip() == (
        f"rl-train: stopped by SIGTERM; the last checkpoint is step {saved} in "
        f"{run / 'checkpoints'}: continue with train.resume=true"
    ), err[-2000:]
    logged = [r["step"] for r in MetricsLogger.read(run / "metrics.jsonl")]
    assert logged[:saved] == list(range(1, saved + 1))
    assert tensorboard_steps(run) == logged  # closed on the way out: nothing left unflushed

    end = saved + 3
    resumed = subprocess.run([*args[:-1], f"train.steps={end}", "train.resume=true", "--quiet"],
                             env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in MetricsLogger.read(run / "metrics.jsonl")] == list(range(1, end + 1))
    assert tensorboard_steps(run) == list(range(1, end + 1))
