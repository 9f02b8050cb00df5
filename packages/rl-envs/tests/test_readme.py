"""The README's Python examples run as written."""

from pathlib import Path

from rl_testing.docs import run_python_blocks


def test_readme_python_blocks_run() -> None:
    namespace = run_python_blocks(Path(__file__).parents[1] / "README.md")
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert namespace["rewards"][:, 0].tolist() == [1.0] * 4
    assert namespace["batch"].turn_rewards.shape == (6, 4)
