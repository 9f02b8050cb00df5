from pathlib import Path

import rl_kernels
from rl_testing.packaging import assert_package_metadata


def test_metadata_matches_pyproject() -> None:
    assert_package_metadata(rl_kernels, Path(__file__).parents[1] / "pyproject.toml")
