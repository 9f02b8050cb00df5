from pathlib import Path

import rl_rollout
from rl_testing.packaging import assert_package_metadata


def test_metadata_matches_pyproject() -> None:
    assert_package_metadata(rl_rollout, Path(__file__).parents[1] / "pyproject.toml")
