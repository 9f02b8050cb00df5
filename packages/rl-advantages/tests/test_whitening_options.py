"""Hypothesis properties of ``reinforce_plus_plus(unbiased=..., eps=...)`` (issue 23: OpenRLHF's
biased, eps-free whitening), against the float64 loop reference and the statistics' definition."""

from __future__ import annotations

import ref_advantages as reference
import rl_advantages as ra
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rl_testing.strategies import mask_batches, rewards
from rl_testing.tolerance import assert_close

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data(), st.booleans(), st.sampled_from([0.0, 1e-8, 0.5]))
def test_whitening_options_match_the_reference(
    data: st.DataObject, unbiased: bool, eps: float
) -> None:
    mask = data.draw(mask_batches(5, 7, allow_empty_rows=True))
    tr = data.draw(rewards(tuple(mask.shape)))
    got = ra.reinforce_plus_plus(tr, mask, unbiased=unbiased, eps=eps)
    exp = reference.ref_reinforce_plus_plus(tr, mask, 1.0, unbiased, eps)
    # the returns' scan over 7 steps, then the batch mean and std over up to 35 tokens; terms as
    # large as the returns (rewards up to 10, summed over 7 steps)
    scale = max(1.0, float(exp[1].abs().max()))
    n = max(1, mask.numel())
    assert_close(got.advantages, exp[0], reduction=n, stages=3, scale=scale, msg="advantages")
    assert_close(got.returns, exp[1], reduction=mask.shape[-1], scale=scale, msg="returns")


@SETTINGS
@given(st.data())
def test_biased_eps_free_whitening_has_zero_mean_and_unit_biased_variance(
    data: st.DataObject,
) -> None:
    mask = data.draw(mask_batches(5, 7, allow_empty_rows=True))
    tr = data.draw(rewards(tuple(mask.shape)))
    ret = ra.reinforce_plus_plus(tr, mask).returns[mask]
    assume(ret.numel() >= 2 and float(ret.var(unbiased=False)) > 1e-6)
    adv = ra.reinforce_plus_plus(tr, mask, unbiased=False, eps=0.0).advantages[mask]
    assert abs(float(adv.mean())) < 1e-9
    assert abs(float(adv.var(unbiased=False)) - 1.0) < 1e-9
