"""The README's Python example runs as written (in a temporary directory)."""

from pathlib import Path

import pytest
from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    assert len(namespace["pop"]) == 1
    assert (tmp_path / "runs" / "readme" / "reward_curve.png").is_file()
