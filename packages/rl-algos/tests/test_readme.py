"""The README's Python example runs as written."""

import math
from pathlib import Path

from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    assert math.isfinite(namespace["metrics"]["loss"])
    assert [c.shape[0] for c in namespace["completion_ids"]] == [4, 4]
