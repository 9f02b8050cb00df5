"""The README's example runs as written (docs that cannot rot)."""

from pathlib import Path

import rl_kernels
from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    out = namespace["out"]
    assert isinstance(out, rl_kernels.FusedPolicyLossOutput)
    hidden = namespace["hidden"]
    assert hidden.grad is not None  # type: ignore[attr-defined]
    assert out.metrics()["ratio_mean"] == 1.0  # old_logprobs were the current log-probs
