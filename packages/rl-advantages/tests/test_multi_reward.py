"""GDPO's group-decoupled advantage (``gdpo``): a float64 loop reference on seeded batches,
hand cases, hypothesis properties, errors and the registry name. (An estimator of rewards has
no gradient to check.)"""

from __future__ import annotations

import math

import pytest
import rl_advantages as ra
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rl_testing import tolerance

F64 = torch.float64


def ref_gdpo(
    rewards: list[list[float]], g: int, weights: list[float], eps: float, mask: list[bool]
) -> list[float]:
    """Reward by reward, group by group: (r - mean) / (unbiased std + eps), weighted sum."""
    out = [0.0] * len(rewards)
    for k, w in enumerate(weights):
        for start in range(0, len(rewards), g):
            idx = [i for i in range(start, start + g) if mask[i]]
            vals = [rewards[i][k] for i in idx]
            if len(vals) < 2 or max(vals) == min(vals):
                continue
            mean = math.fsum(vals) / len(vals)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
            for i in idx:
                out[i] += w * (rewards[i][k] - mean) / (std + eps)
    return out


@pytest.mark.parametrize("group_size", [2, 4, 5])
@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_reference(group_size: int, seed: int) -> None:
    g = torch.Generator().manual_seed(100 + seed * 10 + group_size)
    n, r = group_size * 3, 1 + seed % 3
    rewards = torch.rand(n, r, generator=g, dtype=F64)
    rewards[:, 0] = (rewards[:, 0] < 0.5).to(F64)  # a binary reward next to continuous ones
    weights = (torch.rand(r, generator=g, dtype=F64) * 2).tolist()
    mask = torch.rand(n, generator=g) < 0.85 if seed % 2 else torch.ones(n, dtype=torch.bool)
    got = ra.gdpo(rewards, group_size, weights=weights, mask=mask)
    expected = ref_gdpo(rewards.tolist(), group_size, weights, 1e-6, mask.tolist())
    tolerance.assert_close(
        got, torch.tensor(expected, dtype=F64), reduction=group_size, stages=3, scale=10.0
    )


def test_hand_case_keeps_the_weak_reward() -> None:
    # group of 4; accuracy [1, 1, 0, 0], format [1, 0, 1, 0]: GRPO on the sum [2, 1, 1, 0] gives
    # samples 2 and 3 the same advantage; GDPO separates them by the format reward
    acc = [1.0, 1.0, 0.0, 0.0]
    fmt = [1.0, 0.0, 1.0, 0.0]
    rewards = torch.tensor([acc, fmt], dtype=F64).T
    s = math.sqrt(1 / 3)  # unbiased std of [1, 1, 0, 0]
    z = 0.5 / s
    got = ra.gdpo(rewards, 4, eps=0.0)
    assert got.tolist() == pytest.approx([2 * z, 0.0, 0.0, -2 * z])
    summed = ra.group_relative(rewards.sum(1), 4, eps=0.0)
    assert float(summed[1]) == pytest.approx(float(summed[2]))
    weighted = ra.gdpo(rewards, 4, weights=[1.0, 0.25], eps=0.0)
    assert weighted.tolist() == pytest.approx([1.25 * z, 0.75 * z, -0.75 * z, -1.25 * z])


def test_registered_and_one_reward_is_grpo() -> None:
    assert ra.get_estimator("gdpo") is ra.gdpo
    r = torch.tensor([0.3, 1.0, 0.0, 0.5, 0.5, 2.0], dtype=F64)
    # bit-exact: one reward column runs group_relative itself, times a weight of 1.0
    assert torch.equal(ra.gdpo(r[:, None], 3), ra.group_relative(r, 3))


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"rewards": torch.ones(4, dtype=F64)}, "rewards"),
        ({"rewards": torch.ones(4, 0, dtype=F64)}, "R = 0"),
        ({"rewards": torch.ones(4, 2, dtype=F64), "weights": [1.0]}, "weights"),
        ({"rewards": torch.ones(4, 2, dtype=F64), "weights": [1.0, float("nan")]}, "weights"),
        ({"rewards": torch.tensor([[1.0], [float("nan")]], dtype=F64)}, "rewards"),
    ],
)
def test_bad_inputs_are_named(kwargs: dict[str, object], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        ra.gdpo(group_size=2, **kwargs)  # type: ignore[arg-type]


def test_nonfinite_mask_drops_the_sample_for_every_reward() -> None:
    r = torch.tensor([[1.0, 0.0], [0.0, float("inf")], [0.0, 1.0], [1.0, 0.0]], dtype=F64)
    got = ra.gdpo(r, 2, nonfinite="mask")
    assert got[:2].tolist() == [0.0, 0.0]
    # bit-exact: the masked group is dropped, the other runs the same ops on the same rows
    assert torch.equal(got[2:], ra.gdpo(r[2:], 2))


# rewards on a grid: a group is either degenerate or spread (eps = 0 divides by its std)
COLUMN = st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.8, 1.0]), min_size=4, max_size=4)


@settings(max_examples=60, deadline=None)
@given(a=COLUMN, b=COLUMN, wa=st.floats(-2.0, 2.0), wb=st.floats(-2.0, 2.0), c=st.floats(0.1, 10))
def test_linear_in_weights_and_blind_to_a_reward_scale(
    a: list[float], b: list[float], wa: float, wb: float, c: float
) -> None:
    """The sum of per-reward advantages: linear in the weights, each reward's own positive scale
    and shift does not matter (eps = 0)."""
    r = torch.tensor([a, b], dtype=F64).T
    got = ra.gdpo(r, 2, weights=[wa, wb], eps=0.0)
    parts = wa * ra.group_relative(r[:, 0], 2, eps=0.0) + wb * ra.group_relative(
        r[:, 1], 2, eps=0.0
    )
    tolerance.assert_close(got, parts, reduction=2, stages=2, scale=10.0)
    rescaled = torch.stack([c * r[:, 0] + 3.0, r[:, 1]], 1)
    tolerance.assert_close(
        ra.gdpo(rescaled, 2, weights=[wa, wb], eps=0.0), got, reduction=2, stages=3, scale=1e3
    )


@settings(max_examples=60, deadline=None)
@given(a=COLUMN, b=COLUMN, unbiased=st.booleans())
# the sums are equal with the Bessel-corrected group std and not with the population one
@example(a=[0.0, 0.1, 0.1, 1.0], b=[1.0, 0.1, 0.1, 0.0], unbiased=False)
def test_batch_scale_with_eps_zero_is_never_nan(a: list[float], b: list[float], unbiased: bool):
    """eps = 0 divides by the batch std only where it is positive: a batch whose sums are all
    equal (every group degenerate) gives 0, as ``group_relative`` and ``whiten`` do."""
    r = torch.tensor([a, b], dtype=F64).T
    got = ra.gdpo(r, 2, eps=0.0, unbiased=unbiased, batch_scale=True)
    assert torch.isfinite(got).all()
    total = ra.gdpo(r, 2, eps=0.0, unbiased=unbiased)  # the sums that batch_scale standardises
    if bool((total == total[0]).all()):
        assert got.tolist() == [0.0] * 4


def ref_trl_normalize_then_sum(
    rewards: list[list[float]], g: int, weights: list[float]
) -> list[float]:
    """TRL 1.16.0's ``multi_objective_aggregation="normalize_then_sum"``, transcribed in float64
    (``_generate_and_score_completions``): per reward and group ``(r - mean) / (std + 1e-4)``
    (``nanstd``: Bessel-corrected), the weighted sum, then ``(s - mean) / (std + 1e-4)`` over the
    batch."""
    n, eps = len(rewards), 1e-4

    def std(vals: list[float]) -> float:
        mean = math.fsum(vals) / len(vals)
        return math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1))

    total = [0.0] * n
    for k, w in enumerate(weights):
        for start in range(0, n, g):
            vals = [rewards[i][k] for i in range(start, start + g)]
            mean = math.fsum(vals) / g
            for i in range(start, start + g):
                total[i] += w * (rewards[i][k] - mean) / (std(vals) + eps)
    mean = math.fsum(total) / n
    return [(t - mean) / (std(total) + eps) for t in total]


@pytest.mark.parametrize("seed", range(4))
def test_batch_scale_is_trls_normalize_then_sum(seed: int) -> None:
    """``eps=1e-4, batch_scale=True`` is TRL's GDPO, also with degenerate groups (each group's
    normalised rewards sum to 0, so the batch mean is 0 and such a group stays at 0)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (12, 3), generator=g).to(F64) / 2
    rewards[4:8, 1] = 0.5  # one degenerate (group, reward)
    rewards[8:12] = 1.0  # one group degenerate in every reward
    weights = [1.0, 0.5, 2.0]
    got = ra.gdpo(rewards, 4, weights=weights, eps=1e-4, batch_scale=True)
    expected = torch.tensor(ref_trl_normalize_then_sum(rewards.tolist(), 4, weights), dtype=F64)
    tolerance.assert_close(got, expected, reduction=12, stages=4, scale=10.0)
    assert float(got[:8].abs().max()) > 0.1  # not all zero: the comparison has content


def test_batch_scale_hand_case_and_mask() -> None:
    """Two groups of two, one reward: the group step gives +-a, a = 1/sqrt(2) (unbiased std of
    a pair); the batch step divides [a, -a, a, -a] by its unbiased std sqrt(4 a^2 / 3). A masked
    sample is 0 and leaves the statistics (its group, of one valid sample, gives 0)."""
    r = torch.tensor([[1.0], [0.0], [3.0], [2.0]], dtype=F64)
    a = 1 / math.sqrt(2)
    assert ra.gdpo(r, 2, eps=0.0).tolist() == pytest.approx([a, -a, a, -a])
    scaled = ra.gdpo(r, 2, eps=0.0, batch_scale=True)
    assert scaled.tolist() == pytest.approx([math.sqrt(3) / 2, -math.sqrt(3) / 2] * 2)
    mask = torch.tensor([True, True, True, False])
    masked = ra.gdpo(r, 2, eps=0.0, mask=mask, batch_scale=True)
    # valid sums [a, -a, 0]: mean 0, unbiased std a
    assert masked.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])
    one = torch.tensor([True, False, False, False])
    assert ra.gdpo(r, 2, mask=one, batch_scale=True).tolist() == [0.0] * 4  # no statistics


def test_batch_scale_eps_zero_on_a_constant_batch() -> None:
    # every group degenerate in every reward: the sums are all 0, their std 0 -> 0, not 0/0
    got = ra.gdpo(torch.ones(4, 2, dtype=F64), 2, eps=0.0, batch_scale=True)
    assert got.tolist() == [0.0] * 4


def test_integer_and_float_masks() -> None:
    """A 0/1 integer or float mask is the bool mask (with ``batch_scale`` and ``nonfinite``)."""
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [3.0, 1.0], [2.0, float("inf")]], dtype=F64)
    m = torch.tensor([True, True, True, False])
    # pair 0: column 0 [1, 0] gives +-a (unbiased std sqrt(1/2)), column 1 is degenerate (0);
    # pair 1 has one valid member: 0. Valid sums [a, -a, 0]: mean 0, unbiased std a.
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    z = a / (a + 1e-6)
    want = ra.gdpo(r, 2, mask=m, batch_scale=True, nonfinite="mask")
    tolerance.assert_close(want, torch.tensor([z, -z, 0.0, 0.0], dtype=F64), reduction=3, stages=4)
    for other in (m.long(), m.double()):
        got = ra.gdpo(r, 2, mask=other, batch_scale=True, nonfinite="mask")
        # bit-exact: the 0/1 mask becomes the same bool mask at entry
        assert torch.equal(got, want)
    got = ra.gdpo(r, 2, mask=torch.tensor([1, 1, 1, 0]), nonfinite="mask")
    tolerance.assert_close(got, torch.tensor([a, -a, 0.0, 0.0], dtype=F64), reduction=2, stages=2)
