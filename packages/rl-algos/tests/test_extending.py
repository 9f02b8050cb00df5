"""Extending is one place: a policy loss and an advantage estimator registered in this test
module (no file of rl-algos, rl-losses or rl-advantages edited) train through ``GRPO``.

The registered functions are checked against what the agent must have computed: the estimator
sees the batch's [N] rewards and the group size; the loss sees the estimator's advantages
broadcast over the action tokens and the options given through ``loss_kwargs``; the step
equals one taken with the built-in clipped surrogate scaled by the same factor.
"""

from __future__ import annotations

import algos_testlib as tl
import pytest
import rl_advantages
import rl_losses
import torch
from rl_algos import GRPO

CALLS: dict[str, list[dict[str, object]]] = {"loss": [], "estimator": []}


@rl_advantages.register_estimator("test_extending_centred_x2")
def centred_x2(rewards: torch.Tensor, group_size: int, factor: float = 1.0) -> torch.Tensor:
    """Twice the reward minus its group mean, times ``factor``: [N] -> [N]."""
    CALLS["estimator"].append({"rewards": rewards.clone(), "group_size": group_size})
    grouped = rewards.view(-1, group_size)
    return (factor * 2.0 * (grouped - grouped.mean(1, keepdim=True))).reshape(-1)


@rl_losses.register_policy_loss("test_extending_scaled_ppo")
def scaled_ppo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: float,
    **kwargs: object,
) -> rl_losses.PolicyLossOutput:
    """``scale`` times PPO's clipped surrogate."""
    CALLS["loss"].append({"advantages": advantages.detach().clone(), "scale": scale, **kwargs})
    out = rl_losses.clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kwargs)  # type: ignore[arg-type]
    return rl_losses.PolicyLossOutput(
        loss=scale * out.loss,
        clip_frac_low=out.clip_frac_low,
        clip_frac_high=out.clip_frac_high,
        approx_kl=out.approx_kl,
        ratio_mean=out.ratio_mean,
        ratio_max=out.ratio_max,
    )


def _actor(agent: GRPO) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in agent.policy.named_parameters() if p.requires_grad}


def test_registered_loss_and_estimator_train_through_grpo() -> None:
    CALLS["loss"].clear()
    CALLS["estimator"].clear()
    batch = tl.make_batch()
    custom = tl.make_agent(
        "GRPO",
        loss_type="test_extending_scaled_ppo",
        loss_kwargs={"scale": 0.5},
        advantage_estimator="test_extending_centred_x2",
        advantage_estimator_kwargs={"factor": 1.0},
        beta=0.0,
    )
    before = _actor(custom)
    metrics = custom.learn(batch.experiences())
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # the estimator saw the [N] rewards and G; the loss its advantages on every action token
    (est,) = CALLS["estimator"]
    assert est["group_size"] == tl.GROUP_SIZE
    torch.testing.assert_close(est["rewards"], batch.rewards)
    expected = centred_x2(batch.rewards, tl.GROUP_SIZE)
    (call,) = CALLS["loss"]
    assert call["scale"] == 0.5
    assert call["aggregation"] == "seq_mean_token_mean"
    adv = call["advantages"]
    assert isinstance(adv, torch.Tensor)
    torch.testing.assert_close(adv[batch.masks], expected[:, None].expand_as(adv)[batch.masks])
    # bit-exact: did the step move the actor at all
    assert any(not torch.equal(p, before[n]) for n, p in _actor(custom).items())

    # against the built-in objective: the scaled loss is half of it, and with scale 1 the
    # registered loss takes exactly the built-in step
    builtin = tl.make_agent("GRPO", advantage_estimator="test_extending_centred_x2", beta=0.0)
    base_metrics = builtin.learn(batch.experiences())
    assert metrics["loss"] == pytest.approx(0.5 * base_metrics["loss"], rel=1e-5)
    same = tl.make_agent(
        "GRPO",
        loss_type="test_extending_scaled_ppo",
        loss_kwargs={"scale": 1.0},
        advantage_estimator="test_extending_centred_x2",
        beta=0.0,
    )
    same.learn(batch.experiences())
    for n, p in _actor(builtin).items():
        # bit-exact: both run rl_losses.clipped_surrogate (times 1.0, exact) on the same inputs
        assert torch.equal(_actor(same)[n], p), n


def test_unknown_names_are_refused_with_the_registry() -> None:
    with pytest.raises(ValueError, match="register_policy_loss"):
        tl.make_agent("GRPO", loss_type="no_such_loss")
    with pytest.raises(ValueError, match="register_estimator"):
        tl.make_agent("GRPO", advantage_estimator="no_such_estimator")


@rl_losses.register_policy_loss("test_extending_named_clip")
def named_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    **kwargs: object,
) -> rl_losses.PolicyLossOutput:
    """PPO's surrogate; records the clip bounds it was given."""
    CALLS["loss"].append({"clip_low": clip_low, "clip_high": clip_high})
    return rl_losses.clipped_surrogate(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        **kwargs,  # type: ignore[arg-type]
    )


def test_clip_coef_reaches_a_registered_loss_that_names_its_bounds() -> None:
    CALLS["loss"].clear()
    agent = tl.make_agent(
        "GRPO", loss_type="test_extending_named_clip", clip_coef=0.1, clip_coef_high=0.3
    )
    agent.learn(tl.make_batch().experiences())
    assert CALLS["loss"] == [{"clip_low": 0.1, "clip_high": 0.3}]


def test_options_that_cannot_be_honoured_are_refused_or_warned() -> None:
    with pytest.raises(ValueError, match="use_liger_loss"):
        tl.make_agent(
            "GRPO", loss_type="test_extending_scaled_ppo", loss_kwargs={"scale": 1.0},
            use_liger_loss=True,
        )  # fmt: skip
    with pytest.warns(UserWarning, match="GSPO is loss_type='gspo'"):
        assert tl.make_agent("GSPO", loss_type="cispo").loss_type == "gspo"


@rl_losses.register_policy_loss("test_extending_per_unit")
def per_unit(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: rl_losses.Aggregation,
    normalizer: float | None,
    max_length: int | None,
    is_weights: torch.Tensor | None,
    level: str = "token",
    pooling: str = "sum",
    turn_ids: torch.Tensor | None = None,
) -> rl_losses.PolicyLossOutput:
    """PPO's surrogate with each turn or sequence counted once: no ``unit_weight`` option."""
    return rl_losses.clipped_surrogate(
        logprobs, old_logprobs, advantages, mask, aggregation=aggregation,
        normalizer=normalizer, max_length=max_length, is_weights=is_weights,
        level=level, pooling=pooling, turn_ids=turn_ids,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("level", ["turn", "trajectory"])
def test_token_mean_at_a_unit_level_needs_a_loss_with_unit_weight(level: str) -> None:
    """``token_mean`` with turn or sequence ratios counts each unit's loss once per token
    (``unit_weight="tokens"``): a registered loss that cannot is refused when the agent is
    built, naming both options and the loss; the other aggregations and token ratios build."""
    kw = {"loss_type": "test_extending_per_unit", "importance_sampling_level": level}
    match = rf"loss_aggregation='token_mean'.*importance_sampling_level='{level}'.*"
    match += r"'test_extending_per_unit'.*`unit_weight`.*seq_mean_token_mean"
    with pytest.raises(ValueError, match=match):
        tl.make_agent("GRPO", loss_aggregation="token_mean", perturb_seed=None, **kw)
    tl.make_agent("GRPO", loss_aggregation="seq_mean_token_mean", perturb_seed=None, **kw)
    tl.make_agent(
        "GRPO", loss_type="test_extending_per_unit", loss_aggregation="token_mean",
        perturb_seed=None,
    )  # fmt: skip


def test_token_mean_with_turn_units_counted_once_is_refused() -> None:
    """``unit_weight="unit"`` asked for with ``token_mean`` and turn ratios would average over
    turns, which no normaliser of the agent counts: refused, saying what to pass."""
    with pytest.raises(ValueError, match=r"unit_weight='unit'.*pass unit_weight='tokens'"):
        tl.make_agent(
            "GRPO", importance_sampling_level="turn", loss_aggregation="token_mean",
            loss_kwargs={"unit_weight": "unit"}, perturb_seed=None,
        )  # fmt: skip


@rl_losses.register_policy_loss("test_extending_bare_tensor")
def bare_tensor(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **kwargs: object,
) -> torch.Tensor:
    """PPO's clipped surrogate as a bare scalar tensor: no diagnostics."""
    out = rl_losses.clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kwargs)  # type: ignore[arg-type]
    return out.loss


def test_a_loss_without_diagnostics_reports_none() -> None:
    """A registered loss that returns a bare tensor computed no clip fraction, approx KL or
    ratio: the metrics leave them out (no placeholder 0, 0 and 1); beta=0: no KL either."""
    agent = tl.make_agent("GRPO", loss_type="test_extending_bare_tensor", beta=0.0)
    metrics = agent.learn(tl.make_batch().experiences())
    shown = {"clip_fraction", "approx_kl", "ratio_mean", "kl", "mean_kl"}
    assert not shown & set(metrics), sorted(metrics)
    assert {"loss", "pg_loss", "entropy", "grad_norm"} <= set(metrics), sorted(metrics)
    builtin = tl.make_agent("GRPO", beta=0.0).learn(tl.make_batch().experiences())
    assert {"clip_fraction", "approx_kl", "ratio_mean"} <= set(builtin), sorted(builtin)
