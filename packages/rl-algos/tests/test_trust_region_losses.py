"""rl-losses' DPPO (``dppo_tv``, ``dppo_kl``), DRO (``dro``) and Tinker's
``importance_sampling`` and ``cross_entropy`` reach ``GRPO(loss_type=...)`` through the rl-losses
registry alone (no rl-algos code names them): each trains a step on the plain path and on the
fused one (``use_liger_loss=True``, rl-kernels' ``fused_policy_loss``), with its options given
through ``loss_kwargs``."""

from __future__ import annotations

from typing import Any

import algos_testlib as tl
import pytest
import rl_advantages
import rl_algos.batch
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
    [("loss_type", "stable_reinforce", "formula is not published")],
)
def test_names_an_agent_cannot_run_are_refused_at_build(
    keyword: str, name: str, reason: str
) -> None:
    """Tinker's ``stable_reinforce`` (no published formula) is refused when the agent is built,
    naming the option and the reason, not at the first learn(). (The optimal token baseline,
    once refused here, trains: test_token_baseline_agent.py.)"""
    with pytest.raises(ValueError, match=f"`{keyword}` '{name}'") as info:
        tl.make_agent("GRPO", **{keyword: name})
    assert reason in str(info.value)


# ----------------------------------------------------------------------------- GDPO (R rewards)

COMPONENTS = torch.tensor(
    [[1.0, 0.0], [0.0, 0.5], [1.0, 1.0], [0.0, 0.0], [1.0, 0.5], [0.0, 1.0]]
)  # [N, R]: two reward functions' scores of the 2 x 3 test batch
WEIGHTS = torch.tensor([1.0, 0.5])


def _scored() -> Any:
    """The test batch as ``learn()`` sees it, its rewards the weighted sum of two functions."""
    rollout = rl_algos.batch.as_rollout(tl.make_batch().experiences(), pad_token_id=tl.PAD_ID)
    rollout = rollout.with_rewards(COMPONENTS @ WEIGHTS, COMPONENTS, WEIGHTS)
    return rollout


def test_gdpo_normalises_each_reward_of_the_rollout() -> None:
    """``advantage_estimator="gdpo"``: the advantages are rl_advantages.gdpo of the rollout's
    [N, R] components with the environment's weights, on every action token."""
    from rl_advantages import gdpo
    from rl_algos.batch import Scores
    from rl_algos.estimators import GroupAdvantage, group_advantages

    batch = _scored().to_batch(tl.PAD_ID)
    est = group_advantages(GroupAdvantage("gdpo", tl.GROUP_SIZE), batch, Scores(None, None))
    expected = gdpo(COMPONENTS, tl.GROUP_SIZE, weights=WEIGHTS)[:, None].expand_as(batch.mask)
    # bit-exact: the same function on the same inputs, broadcast and masked
    assert torch.equal(est.advantages, torch.where(batch.mask, expected, 0.0))
    # the summed reward's group advantage differs: GDPO keeps each reward's signal
    summed = rl_advantages.group_relative(COMPONENTS @ WEIGHTS, tl.GROUP_SIZE)
    assert not torch.allclose(gdpo(COMPONENTS, tl.GROUP_SIZE, weights=WEIGHTS), summed)


def test_gdpo_agent_learns_from_components_and_names_what_is_missing() -> None:
    agent = tl.make_agent("GRPO", advantage_estimator="gdpo", beta=0.0)
    before = _actor(agent)
    metrics = agent.learn(_scored())
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # bit-exact: any change at all shows the update moved a weight
    assert any(not torch.equal(p, before[n]) for n, p in _actor(agent).items())
    with pytest.raises(ValueError, match=r"'gdpo'.*only their sum.*components=\[N, R\]"):
        agent.learn(tl.make_batch().experiences())


def test_rollout_reward_components_are_checked() -> None:
    rollout = rl_algos.batch.as_rollout(tl.make_batch().experiences(), pad_token_id=tl.PAD_ID)
    with pytest.raises(ValueError, match=r"`reward_components` has shape \(5, 2\)"):
        rollout.with_rewards(COMPONENTS @ WEIGHTS, COMPONENTS[:5], WEIGHTS)
    with pytest.raises(
        ValueError, match=r"`reward_weights` has shape \(3,\); expected \[R\] = \[2\]"
    ):
        rollout.with_rewards(COMPONENTS @ WEIGHTS, COMPONENTS, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="`reward_weights` has shape None"):
        rollout.with_rewards(COMPONENTS @ WEIGHTS, COMPONENTS)
    blocks = rollout.with_rewards(COMPONENTS @ WEIGHTS, COMPONENTS.view(2, 3, 2), WEIGHTS)
    assert torch.equal(blocks.reward_components, COMPONENTS)  # bit-exact: a reshape
