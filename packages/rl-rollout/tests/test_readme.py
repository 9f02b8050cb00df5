"""The README's example runs as written (docs that cannot rot)."""

from pathlib import Path

import rl_rollout
from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    result = namespace["result"]
    assert isinstance(result, rl_rollout.RolloutResult)
    assert result.group_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert result.logprobs is not None
    assert bool((result.logprobs[result.completion_mask] <= 0).all())
