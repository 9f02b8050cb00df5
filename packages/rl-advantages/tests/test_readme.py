"""The README's examples run as written (docs that cannot rot)."""

import re
from pathlib import Path

import torch

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "README has no python example"
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    # The GRPO line of the example: group (1, 0, 0, 1) has mean 0.5 and unbiased std
    # sqrt(1/3), so its advantages are +-0.5 / 0.5774 = +-0.8660.
    adv = namespace["adv"]
    assert isinstance(adv, torch.Tensor)
    torch.testing.assert_close(
        adv[:4], torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254])
    )
