"""rl-losses' DPPO (``dppo_tv``, ``dppo_kl``), DRO (``dro``) and Tinker's
``importance_sampling`` and ``cross_entropy`` reach ``GRPO(loss_type=...)`` through the rl-losses
registry alone (no rl-algos code names them): each trains a step on the plain path and on the
fused one (``use_liger_loss=True``, rl-kernels' ``fused_policy_loss``), with its options given
through ``loss_kwargs``."""

from __future__ import annotations

import algos_testlib as tl
import pytest
import torch

OPTIONS = {
    "dppo_tv": {"delta_low": 0.05, "delta_high": 0.08},
    "dppo_kl": {"delta_low": 0.01},
    "dro": {"beta": 0.5},
    # Tinker's names (rl-losses registers them as fixed-argument objectives)
    "importance_sampling": {},
    "cross_entropy": {},
}


def _actor(agent: object) -> dict[str, torch.Tensor]:
    params = agent.policy.named_parameters()  # type: ignore[attr-defined]
    return {n: p.detach().clone() for n, p in params if p.requires_grad}


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_grpo_loss_type_trains(name: str, fused: bool) -> None:
    agent = tl.make_agent(
        "GRPO", loss_type=name, loss_kwargs=OPTIONS[name], beta=0.0, use_liger_loss=fused
    )
    assert agent.loss_type == name
    before = _actor(agent)
    metrics = agent.learn(tl.make_batch().experiences())
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # bit-exact: any change at all shows the update moved a weight
    assert any(not torch.equal(p, before[n]) for n, p in _actor(agent).items())


def test_grpo_advantage_estimator_max_rl() -> None:
    """rl-advantages' ``max_rl`` reaches ``GRPO(advantage_estimator=...)`` through its registry:
    the agent trains a step with it."""
    agent = tl.make_agent("GRPO", advantage_estimator="max_rl", beta=0.0)
    before = _actor(agent)
    metrics = agent.learn(tl.make_batch().experiences())
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # bit-exact: any change at all shows the update moved a weight
    assert any(not torch.equal(p, before[n]) for n, p in _actor(agent).items())


@pytest.mark.parametrize(
    ("keyword", "name", "reason"),
    [
        ("loss_type", "stable_reinforce", "formula is not published"),
        ("advantage_estimator", "gdpo", "call rl_advantages.gdpo"),
        ("advantage_estimator", "optimal_token_baseline", "sum_pi_squared"),
    ],
)
def test_names_an_agent_cannot_run_are_refused_at_build(
    keyword: str, name: str, reason: str
) -> None:
    """Tinker's ``stable_reinforce`` (no published formula), GDPO (needs [N, R] rewards) and
    the optimal token baseline (needs the vocabulary's squared probabilities) are refused when
    the agent is built, naming the option and the reason, not at the first learn()."""
    with pytest.raises(ValueError, match=f"`{keyword}` '{name}'") as info:
        tl.make_agent("GRPO", **{keyword: name})
    assert reason in str(info.value)
