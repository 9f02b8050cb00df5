"""MaxRL's advantage (``max_rl``): a float64 loop reference on seeded batches, hand cases,
hypothesis properties and the registry name. (An estimator of rewards has no gradient to check.)"""

from __future__ import annotations

import math

import pytest
import rl_advantages as ra
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_testing import tolerance

F64 = torch.float64


def ref_max_rl(
    rewards: list[float], group_size: int, mask: list[bool] | None = None
) -> list[float]:
    """Group by group, member by member, in Python floats."""
    mask = [True] * len(rewards) if mask is None else mask
    out = [0.0] * len(rewards)
    for start in range(0, len(rewards), group_size):
        idx = [i for i in range(start, start + group_size) if mask[i]]
        if len(idx) < 2:
            continue
        mean = math.fsum(rewards[i] for i in idx) / len(idx)
        if mean <= 0:
            continue
        for i in idx:
            out[i] = (rewards[i] - mean) / mean
    return out


def close(got: torch.Tensor, expected: list[float], group_size: int) -> None:
    tolerance.assert_close(
        got, torch.tensor(expected, dtype=F64), reduction=group_size, stages=2, scale=10.0
    )


@pytest.mark.parametrize("group_size", [2, 4, 5])
@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_reference(group_size: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed * 10 + group_size)
    n = group_size * 4
    binary = seed % 2 == 0
    r = (
        (torch.rand(n, generator=g, dtype=F64) < 0.4).to(F64)
        if binary
        else torch.rand(n, generator=g, dtype=F64)
    )
    r[:group_size] = 0.0  # a group that never succeeds
    mask = None if seed < 3 else torch.rand(n, generator=g) < 0.8
    got = ra.max_rl(r, group_size, mask=mask)
    close(
        got, ref_max_rl(r.tolist(), group_size, None if mask is None else mask.tolist()), group_size
    )


def test_hand_cases() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=F64)
    # pass rate 1/4: the success weighs 1/p - 1 = 3; pass rate 1/2: +1 / -1; none: 0
    assert ra.max_rl(r, 4).tolist() == [3.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0] + [0.0] * 4
    # GRPO's unscaled centring divided by the mean: r - mean = 0.75 -> 0.75 / 0.25
    centred = ra.group_relative(r, 4, scale="none")
    assert ra.max_rl(r, 4)[:4].tolist() == (centred[:4] / 0.25).tolist()
    # a masked sample takes no part: [1, 0, (masked 1), 0] has mean 1/3
    m = torch.tensor([True, True, False, True])
    masked = ra.max_rl(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=F64), 4, mask=m)
    assert masked.tolist() == pytest.approx([2.0, -1.0, 0.0, -1.0])
    # a negative group mean carries no signal
    assert ra.max_rl(torch.tensor([-1.0, 0.5], dtype=F64), 2).tolist() == [0.0, 0.0]


def test_registered() -> None:
    assert ra.get_estimator("max_rl") is ra.max_rl
    assert "max_rl" in ra.available_estimators()


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="rewards"):
        ra.max_rl(torch.tensor([1.0, float("nan")], dtype=F64), 2)
    with pytest.raises(ValueError, match="group"):
        ra.max_rl(torch.ones(3, dtype=F64), 2)
    assert ra.max_rl(
        torch.tensor([1.0, float("nan")], dtype=F64), 2, nonfinite="mask"
    ).tolist() == [0.0, 0.0]


REWARD = st.floats(0.0, 1.0)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.sampled_from([0.0, 1.0]), min_size=3, max_size=3), min_size=1, max_size=4
    ),
)
def test_binary_rewards_weigh_successes_by_inverse_pass_rate(groups: list[list[float]]) -> None:
    """Binary rewards: a success gets 1/p - 1, a failure -1 (p the group's pass rate, 0 < p < 1),
    and each group's advantages sum to zero."""
    r = torch.tensor([x for grp in groups for x in grp], dtype=F64)
    adv = ra.max_rl(r, 3).view(-1, 3)
    for grp, a in zip(groups, adv, strict=True):
        p = sum(grp) / 3
        if p in (0.0, 1.0):
            assert a.tolist() == [0.0] * 3
            continue
        expected = [1 / p - 1 if x else -1.0 for x in grp]
        assert a.tolist() == pytest.approx(expected)
        assert float(a.sum()) == pytest.approx(0.0, abs=1e-12)


#: Zero or a reward whose scaled copies stay normal floats: a subnormal keeps too few significant
#: bits for the ratio to the group mean to survive scaling (5e-324 * 3 and 5e-324 halve to 1e-323
#: and 0, turning advantages of 0.5 into 1).
NORMAL_REWARD = st.one_of(st.just(0.0), st.floats(1e-6, 1.0))


@settings(max_examples=60, deadline=None)
@given(rewards=st.lists(NORMAL_REWARD, min_size=4, max_size=4), scale=st.floats(0.1, 10.0))
def test_scale_invariant(rewards: list[float], scale: float) -> None:
    """Dividing by the mean makes the advantages invariant to a positive reward scale."""
    r = torch.tensor(rewards, dtype=F64)
    tolerance.assert_close(
        ra.max_rl(scale * r, 2), ra.max_rl(r, 2), reduction=2, stages=3, scale=1e3
    )
