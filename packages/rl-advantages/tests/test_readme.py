"""The README's examples run as written (docs that cannot rot)."""

from pathlib import Path

import torch
from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    # The GRPO line of the example: group (1, 0, 0, 1) has mean 0.5 and unbiased std
    # sqrt(1/3), so its advantages are +-0.5 / 0.5774 = +-0.8660.
    adv = namespace["adv"]
    assert isinstance(adv, torch.Tensor)
    expected = torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254])
    torch.testing.assert_close(adv[:4], expected)
