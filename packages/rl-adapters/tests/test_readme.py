"""The README's example runs as written (docs that cannot rot)."""

from pathlib import Path

import torch
from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    assert namespace["state"] == {"step": 1}
    fresh, policy, plain = namespace["fresh"], namespace["policy"], namespace["plain"]
    ids, mask = namespace["ids"], namespace["mask"]
    with torch.no_grad():
        expected = policy.logits(ids, mask)  # type: ignore[attr-defined]
        # bit-exact: load returns the saved weights, run through the same kernels
        torch.testing.assert_close(fresh.logits(ids, mask), expected, rtol=0, atol=0)  # type: ignore[attr-defined]
        torch.testing.assert_close(plain(input_ids=ids, attention_mask=mask).logits, expected)  # type: ignore[operator]
