from pathlib import Path

import rl_losses
from rl_testing.packaging import assert_package_metadata


def test_metadata_matches_pyproject() -> None:
    assert_package_metadata(rl_losses, Path(__file__).parents[1] / "pyproject.toml")


# Every policy objective rl_losses.policy exported before SAPO, GMPO, Clip-Cov and KL-Cov moved
# to rl_losses.policy_variants (to keep policy.py under the 600-line limit).
POLICY_NAMES = [
    "cispo_loss",
    "clip_cov_loss",
    "clipped_surrogate",
    "gmpo_loss",
    "gspo_loss",
    "kl_cov_loss",
    "reinforce_loss",
    "sapo_loss",
]
MOVED = ["clip_cov_loss", "gmpo_loss", "kl_cov_loss", "sapo_loss"]
# rl_losses.policy_sequence (issue 23): built on gspo_loss, so not re-exported by
# rl_losses.policy (that would be an import cycle); exported by rl_losses
SEQUENCE = ["luspo_loss", "vespo_loss"]


def test_policy_module_still_exports_every_objective() -> None:
    import rl_losses.policy
    import rl_losses.policy_sequence
    import rl_losses.policy_variants
    from rl_losses.policy import (  # noqa: F401  (the import itself is the check)
        cispo_loss,
        clip_cov_loss,
        clipped_surrogate,
        gmpo_loss,
        gspo_loss,
        kl_cov_loss,
        reinforce_loss,
        sapo_loss,
    )

    assert sorted(rl_losses.policy.__all__) == POLICY_NAMES
    assert sorted(rl_losses.policy_variants.__all__) == MOVED
    assert sorted(rl_losses.policy_sequence.__all__) == SEQUENCE
    for name in POLICY_NAMES:
        fn = getattr(rl_losses.policy, name)
        assert getattr(rl_losses, name) is fn, name
        assert name in rl_losses.__all__, name
        registered = "ppo" if name == "clipped_surrogate" else name.removesuffix("_loss")
        assert rl_losses.get_policy_loss(registered) is fn, name
    for name in MOVED:
        moved = getattr(rl_losses.policy_variants, name)
        assert moved is getattr(rl_losses.policy, name), name
        assert moved.__module__ == "rl_losses.policy_variants", name
    for name in SEQUENCE:
        fn = getattr(rl_losses.policy_sequence, name)
        assert getattr(rl_losses, name) is fn and name in rl_losses.__all__, name
        assert rl_losses.get_policy_loss(name.removesuffix("_loss")) is fn, name
