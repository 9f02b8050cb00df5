import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rl_train import __version__
from rl_train.cli import EXIT_USAGE, main


def test_demo_trains_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's main command, shortened: accuracy rises, the run directory is complete."""
    assert main(["demo", "--steps", "260", "--run-dir", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    before = float(out.split("greedy accuracy before training:")[1].split()[0])
    after = float(out.split("greedy accuracy after training:")[1].split()[0])
    assert before <= 0.2  # near chance (10 possible answers, a random model rarely stops)
    assert after >= 0.9
    for name in ("metrics.csv", "metrics.jsonl", "reward_curve.png", "config.json"):
        assert (tmp_path / name).is_file(), name
    assert any((tmp_path / "tensorboard").iterdir())
    pointer = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert pointer["step"] == 260


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--task", "no_such_task"], "unknown task 'no_such_task'"),
        (["demo", "--steps", "0"], "--steps must be >= 1"),
    ],
)
def test_demo_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "demo" in capsys.readouterr().out


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["fly"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    exe = shutil.which("rl-train", path=str(Path(sys.executable).parent))
    assert exe is not None, "the rl-train console script is not installed next to the interpreter"
    proc = subprocess.run(
        [exe, "demo", "--task", "nope"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == EXIT_USAGE
    assert "unknown task 'nope'" in proc.stderr
