"""verl's optimal token baseline (``optimal_token_baseline``): a float64 loop reference on seeded
batches (padded, holed and empty rows), hand cases, hypothesis properties and the registry name.
(An estimator of rewards has no gradient to check.)"""

from __future__ import annotations

import math

import pytest
import rl_advantages as ra
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_testing import tolerance
from rl_testing.seeded import make_mask

F64 = torch.float64


def ref_otb(r, m, lp, spi, g, rho=None, zero_tail=True, eps=1e-8):  # type: ignore[no-untyped-def]
    """Row by row, step by step, in Python floats."""
    n, t = len(r), len(r[0])
    ret = [[math.fsum(r[i][s] for s in range(j, t) if m[i][s]) for j in range(t)] for i in range(n)]
    cum = []
    for i in range(n):
        acc, row = 0.0, []
        for j in range(t):
            w = 1 - 2 * math.exp(lp[i][j]) + spi[i][j]
            if rho is not None:
                w *= rho[i][j] ** 2
            acc += w if m[i][j] else 0.0
            row.append(acc)
        cum.append(row)
    adv = [[0.0] * t for _ in range(n)]
    for start in range(0, n, g):
        rows = range(start, start + g)
        lengths = {i: sum(m[i]) for i in rows}
        ordered = sorted(lengths.values())
        lone = [i for i in rows if lengths[i] == ordered[-1]]
        for j in range(t):
            num = math.fsum(ret[i][j] * cum[i][j] for i in rows if m[i][j])
            den = math.fsum(cum[i][j] for i in rows if m[i][j]) + eps
            for i in rows:
                base = num / den
                tail = zero_tail and len(lone) == 1 and ordered[-1] > ordered[-2]
                if tail and i == lone[0] and j >= ordered[-2]:
                    base = 0.0
                adv[i][j] = ret[i][j] - base if m[i][j] else 0.0
    return adv, ret


def _inputs(seed: int, g: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    n, t = 3 * g, 6
    m = make_mask(gen, n, t)
    r = torch.randn(n, t, generator=gen, dtype=F64)
    lp = -torch.rand(n, t, generator=gen, dtype=F64) * 3
    p = torch.exp(lp)
    spi = p**2 + torch.rand(n, t, generator=gen, dtype=F64) * (1 - p) ** 2
    rho = torch.exp(0.3 * torch.randn(n, t, generator=gen, dtype=F64))
    return r, m, lp, spi, rho


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("group_size", [2, 3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_agrees_with_reference(seed: int, group_size: int, with_is: bool, zero_tail: bool) -> None:
    r, m, lp, spi, rho = _inputs(seed * 7 + group_size, group_size)
    w = rho if with_is else None
    got = ra.optimal_token_baseline(r, m, lp, spi, group_size, is_weights=w, zero_tail=zero_tail)
    adv, ret = ref_otb(r.tolist(), m.tolist(), lp.tolist(), spi.tolist(), group_size,
                       None if w is None else w.tolist(), zero_tail)  # fmt: skip
    kw = {"reduction": 6 * group_size, "stages": 3, "scale": 10.0}
    tolerance.assert_close(got.advantages, torch.tensor(adv, dtype=F64), **kw)
    tolerance.assert_close(got.returns * m, torch.tensor(ret, dtype=F64) * m, **kw)


def test_hand_case() -> None:
    # two rows, one step each valid everywhere; w = 1 - 2 pi + sum pi^2 = 0.5 for both, so the
    # baseline is the plain group mean of the returns
    r = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    m = torch.ones(2, 2, dtype=torch.bool)
    lp = torch.full((2, 2), math.log(0.5), dtype=F64)
    spi = torch.full((2, 2), 0.5, dtype=F64)
    out = ra.optimal_token_baseline(r, m, lp, spi, 2, eps=0.0)
    assert out.returns.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert out.advantages.reshape(-1).tolist() == pytest.approx([0.0, -0.5, 0.0, 0.5])
    assert ra.get_estimator("optimal_token_baseline") is ra.optimal_token_baseline


@settings(max_examples=40, deadline=None)
@given(rewards=st.lists(st.floats(-2.0, 2.0), min_size=4, max_size=4))
def test_identical_rows_have_zero_advantage(rewards: list[float]) -> None:
    """A group of identical rows: the baseline is their common return, every advantage 0."""
    row = torch.tensor([rewards], dtype=F64)
    r = row.repeat(3, 1)
    m = torch.ones(3, 4, dtype=torch.bool)
    lp = torch.full((3, 4), -1.0, dtype=F64)
    spi = torch.full((3, 4), 0.3, dtype=F64)
    out = ra.optimal_token_baseline(r, m, lp, spi, 3, eps=0.0)
    tolerance.assert_close(out.advantages, torch.zeros(3, 4, dtype=F64), reduction=4, stages=3)


def _hand_inputs() -> tuple[torch.Tensor, ...]:
    r = torch.tensor([[0.0, 1.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.0]], dtype=F64)
    m = torch.tensor([[True, False, True, True], [True, True, False, False]])
    lp = torch.full((2, 4), -1.0, dtype=F64)
    spi = torch.full((2, 4), 0.2, dtype=F64)
    return r, m, lp, spi


def test_returns_are_zero_at_invalid_steps() -> None:
    # row 0 valid rewards 0, (1), 0, 2: suffix sums 2, -, 2, 2; row 1 valid 1, 0: 1, 0
    r, m, lp, spi = _hand_inputs()
    out = ra.optimal_token_baseline(r, m, lp, spi, 2)
    assert out.returns.tolist() == [[2.0, 0.0, 2.0, 2.0], [1.0, 0.0, 0.0, 0.0]]
    assert out.advantages[~m].tolist() == [0.0] * 3


def test_bad_inputs_are_named() -> None:
    r, m, lp, spi = _hand_inputs()
    with pytest.raises(TypeError, match=r"`token_rewards` must be a torch\.Tensor"):
        ra.optimal_token_baseline(r.tolist(), m, lp, spi, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`logprobs` must be a torch\.Tensor"):
        ra.optimal_token_baseline(r, m, lp.tolist(), spi, 2)  # type: ignore[arg-type]
    bad = r.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match="`token_rewards` has 1 non-finite"):
        ra.optimal_token_baseline(bad, m, lp, spi, 2)
    for name in ("logprobs", "sum_pi_squared", "is_weights"):
        kwargs = {"logprobs": lp, "sum_pi_squared": spi, "is_weights": torch.ones_like(lp)}
        x = kwargs[name].clone()
        x[0, 2] = float("inf")
        kwargs[name] = x
        with pytest.raises(ValueError, match=f"`{name}` holds non-finite values at valid"):
            ra.optimal_token_baseline(r, m, group_size=2, **kwargs)
    half = m.double()
    half[0, 0] = 0.5
    with pytest.raises(ValueError, match=r"masks are bool.*`is_weights`"):
        ra.optimal_token_baseline(r, half, lp, spi, 2)


def test_nonfinite_mask_equals_explicit_mask_and_zero_one_masks_work() -> None:
    r, m, lp, spi = _hand_inputs()
    bad = r.clone()
    bad[0, 3] = float("inf")
    got = ra.optimal_token_baseline(bad, m, lp, spi, 2, nonfinite="mask")
    fixed = m.clone()
    fixed[0, 3] = False
    want = ra.optimal_token_baseline(torch.where(fixed, r, 0.0), fixed, lp, spi, 2)
    for g, w in zip(got, want, strict=True):
        # bit-exact: the same mask reaches the same ops on the same values
        assert torch.equal(g, w)
    plain = ra.optimal_token_baseline(r, m, lp, spi, 2)
    for other in (m.long(), m.double()):
        for g, w in zip(ra.optimal_token_baseline(r, other, lp, spi, 2), plain, strict=True):
            # bit-exact: a 0/1 mask becomes the same bool mask at entry
            assert torch.equal(g, w)


FILLS = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e9])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), fill=FILLS, which=st.sets(st.sampled_from(range(4)), min_size=1))
def test_invalid_positions_never_matter(seed: int, fill: float, which: set[int]) -> None:
    """NaN / inf / 1e9 at the invalid steps of any input changes no output."""
    r, m, lp, spi, rho = _inputs(seed, 3)
    clean = [torch.where(m, x, 0.0) for x in (r, lp, spi, rho)]
    dirty = [torch.where(m, x, fill) if i in which else x for i, x in enumerate(clean)]
    got = ra.optimal_token_baseline(dirty[0], m, dirty[1], dirty[2], 3, is_weights=dirty[3])
    want = ra.optimal_token_baseline(clean[0], m, clean[1], clean[2], 3, is_weights=clean[3])
    for g, w in zip(got, want, strict=True):
        assert not g.isnan().any()
        # bit-exact: the invalid steps are zero-filled at entry, so the same values flow
        assert torch.equal(g, w)
