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
