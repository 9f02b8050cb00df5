import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rl_train import __version__
from rl_train.cli import EXIT_NOT_BUILT, main


def test_demo_says_not_built_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == EXIT_NOT_BUILT
    err = capsys.readouterr().err
    assert "not built yet" in err
    assert "Nothing was trained" in err


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
    proc = subprocess.run([exe, "demo"], capture_output=True, text=True, check=False)
    assert proc.returncode == EXIT_NOT_BUILT
    assert "not built yet" in proc.stderr
