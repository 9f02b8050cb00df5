"""The README's examples run as written (docs that cannot rot)."""

from pathlib import Path

import rl_losses
from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    policy = namespace["policy"]
    assert isinstance(policy, rl_losses.PolicyLossOutput)
    assert policy.loss.requires_grad
    assert set(policy.metrics()) == {
        "loss", "clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max",
    }  # fmt: skip
