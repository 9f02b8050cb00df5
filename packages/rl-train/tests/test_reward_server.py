"""``data.reward_url``: a run scored by ``rl-train reward-server`` in another process equals the
same run scored in process; a down server stops the run with one clear line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rl_train.cli import main

REWARD = (
    "from pathlib import Path\n\n\n"
    "def reward(completion, answer, question):\n"
    "    with (Path(__file__).parent / 'calls.txt').open('a') as f:\n"
    "        f.write(str(os.getpid()) + '\\n')\n"
    "    return float(completion.strip() == answer) + 0.1 * len(completion)\n"
)
SERVE = ["--port", "0", "--reward", "remote_user_reward:reward"]
CONFIG = (
    "data:\n  n_train: 40\n  n_test: 8\n  prompts_per_step: 4\nagent:\n  group_size: 4\n"
    "train:\n  steps: 2\n  evaluation_interval: 2\n  checkpoint_steps: null\n"
)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "remote_user_reward.py").write_text("import os\n" + REWARD)
    (tmp_path / "c.yaml").write_text(CONFIG)
    return tmp_path


@pytest.fixture
def reward_server(user_dir: Path) -> Iterator[str]:
    """``rl-train reward-server`` (``python -m rl_train``) serving the user's module from its
    working directory, on a free port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_train", "reward-server", *SERVE],
        cwd=user_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        assert "http://" in line, line + proc.stdout.read()
        assert "remote_user_reward" not in sys.modules
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _rewards(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["mean_reward"] for r in rows if "mean_reward" in r]


def test_remote_run_equals_local_run(
    user_dir: Path, reward_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(user_dir / "c.yaml")
    local = user_dir / "local"
    code = main(["run", cfg, "imports=[remote_user_reward.py]",
                 "data.reward=remote_user_reward:reward", f"train.run_dir={local}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    calls = user_dir / "calls.txt"
    assert set(calls.read_text().split()) == {str(os.getpid())}  # scored in this process
    calls.unlink()
    remote = user_dir / "remote-run"
    code = main(["run", cfg, f"data.reward_url={reward_server}", f"train.run_dir={remote}",
                 "train.report_to=[tensorboard, trackio]", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    pids = set(calls.read_text().split())
    assert len(pids) == 1 and str(os.getpid()) not in pids  # scored by the server process
    assert len(calls.read_text().split()) >= 2 * 16  # 2 steps x 4 prompts x 4 samples
    rewards = _rewards(remote)
    assert len(rewards) == 2 and len(set(rewards)) > 0
    assert rewards == _rewards(local)  # the same run, bit for bit
    # report_to reached the loop: the trackio run holds the same rows
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("rl-train", "remote-run")
    assert [r["mean_reward"] for r in logs if "mean_reward" in r] == rewards


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_down_reward_server_stops_the_run_with_one_line(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    code = main(["run", str(user_dir / "c.yaml"), f"data.reward_url={url}",
                 "data.reward_retries=1", "data.reward_timeout=5",
                 f"train.run_dir={user_dir / 'run'}", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert f"the reward server at {url}/score is down" in err and "2 attempts" in err
    assert "rl-train reward-server" in err and "data.reward_url" in err


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("no_such_module_here:fn", "--reward 'no_such_module_here:fn' does not resolve"),
        ("os:sep", "--reward 'os:sep' is not callable"),
    ],
)
def test_reward_server_bad_reward_is_one_line_exit_2(
    reward: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rl_train.cli import EXIT_USAGE

    assert main(["reward-server", "--reward", reward, "--port", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
