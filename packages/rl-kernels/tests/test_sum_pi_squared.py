r""":math:`\sum_v \pi(v)^2` per token: ``fused_logprobs(..., with_sum_pi_squared=True)`` (chunk by
chunk from the hidden states) and the plain ``sum_pi_squared(logits)``.

Both against a float64 loop over the vocabulary (``sum_v p_v * p_v`` of the float64 softmax),
against each other, and on hand cases (uniform logits: ``1/V``; one logit far above the rest:
``~1``). The comparisons are on ``log sum pi^2 = lse(2z) - 2 lse(z)``, a difference of
``O(|z|)`` terms like a log-prob, so they take the log-probs' tolerance
(``kernels_testlib.token_tol``).
"""

from __future__ import annotations

import math

import pytest
import rl_kernels as rk
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels_testlib import (
    F32,
    F64,
    assert_close,
    gen,
    make_lm_head,
    make_targets,
    naive_logits,
    token_tol,
)


def _loop_reference(logits: torch.Tensor) -> torch.Tensor:
    """[M] ``sum_v p_v^2`` in float64, one row and one vocabulary entry at a time."""
    out = torch.empty(logits.shape[0], dtype=F64)
    for i, row in enumerate(logits.detach().double()):
        p = torch.softmax(row, dim=0)
        out[i] = math.fsum(float(p[v]) * float(p[v]) for v in range(row.shape[0]))
    return out


@pytest.mark.parametrize("with_entropy", [False, True], ids=["logp", "logp+entropy"])
@pytest.mark.parametrize("chunk_rows", [1, 7, None], ids=lambda c: f"chunk={c}")
@pytest.mark.parametrize(("temperature", "bias"), [(1.0, False), (0.7, True)])
def test_fused_matches_the_float64_loop(
    with_entropy: bool, chunk_rows: int | None, temperature: float, bias: bool
) -> None:
    """Every chunking gives the float64 loop's value to float32 rounding, and the log-probs
    (and entropies) are bit for bit those of the call without it (same kernels, same tiles)."""
    g = gen("spi", with_entropy, chunk_rows, temperature, bias)
    hidden, weight, b = make_lm_head(g, (37,), 16, 97, bias=bias)
    targets = make_targets(g, (37,), 97)
    out = rk.fused_logprobs(
        hidden, weight, targets, b, temperature, chunk_rows, with_entropy, with_sum_pi_squared=True
    )
    plain = rk.fused_logprobs(hidden, weight, targets, b, temperature, chunk_rows, with_entropy)
    assert isinstance(out, tuple) and len(out) == (3 if with_entropy else 2)
    spi = out[-1]
    assert spi.shape == (37,) and spi.dtype == F32 and not spi.requires_grad
    z64 = naive_logits(hidden.double(), weight.double(), None if b is None else b.double())
    expected = _loop_reference(z64 / temperature)
    assert_close(spi.log(), expected.log(), "log sum_pi_squared", **token_tol(hidden, weight, b))
    # bit-exact: asking for sum_pi_squared does not touch the other outputs
    for got, want in zip(out[:-1], plain if with_entropy else (plain,), strict=True):
        assert torch.equal(got, want)


def test_fused_equals_plain_and_keeps_the_logprob_gradient() -> None:
    """The fused value equals ``sum_pi_squared`` of the full logits to float32 rounding; the
    log-probs returned beside it still carry their gradient (``sum_pi_squared`` none)."""
    g = gen("spi-plain")
    hidden, weight, b = make_lm_head(g, (41,), 16, 257, bias=True)
    targets = make_targets(g, (41,), 257)
    logp, spi = rk.fused_logprobs(hidden, weight, targets, b, 1.3, 5, with_sum_pi_squared=True)
    plain = rk.sum_pi_squared(naive_logits(hidden, weight, b), temperature=1.3)
    assert plain.dtype == F32 and not plain.requires_grad
    assert_close(spi.log(), plain.log(), "fused vs plain", **token_tol(hidden, weight, b, 1.3))
    (gh,) = torch.autograd.grad(logp.sum(), [hidden])
    ref = rk.fused_logprobs(hidden, weight, targets, b, 1.3, 5)
    assert isinstance(ref, torch.Tensor)
    (rh,) = torch.autograd.grad(ref.sum(), [hidden])
    # bit-exact: the same kernels' backward, with or without the extra output
    assert torch.equal(gh, rh)


def test_float64_inputs_without_upcast_stay_float64() -> None:
    g = gen("spi-f64")
    hidden, weight, _ = make_lm_head(g, (9,), 8, 31, bias=False, dtype=F64)
    targets = make_targets(g, (9,), 31)
    _, spi = rk.fused_logprobs(hidden, weight, targets, chunk_rows=4, with_sum_pi_squared=True)
    assert spi.dtype == F64
    expected = _loop_reference(naive_logits(hidden, weight, upcast=False))
    assert_close(spi.log(), expected.log(), "float64", **token_tol(hidden, weight))


@pytest.mark.parametrize("v", [1, 2, 59, 1000])
def test_uniform_logits_give_one_over_v(v: int) -> None:
    """Equal logits (a zero head, any temperature): every probability is 1/V, so the sum of
    their squares is V / V^2 = 1/V."""
    hidden = torch.randn(6, 8, generator=gen("uniform", v))
    weight = torch.zeros(v, 8)
    targets = torch.zeros(6, dtype=torch.long)
    _, spi = rk.fused_logprobs(hidden, weight, targets, None, 0.5, 4, with_sum_pi_squared=True)
    expected = torch.full((6,), 1.0 / v, dtype=F64)
    assert_close(spi, expected, "fused, uniform", reduction=v, stages=2)
    plain = rk.sum_pi_squared(torch.full((3, v), 4.25))
    assert_close(plain, expected[:3], "plain, uniform", reduction=v, stages=2)


def test_one_dominant_logit_gives_about_one() -> None:
    """One logit 30 above the other V - 1 = 58: its probability is ``1 / (1 + 58 e^{-30})``,
    and the sum of squares ``(1 + 58 e^{-60}) / (1 + 58 e^{-30})^2``, 1 to within 1e-11."""
    v, gap = 59, 30.0
    bias = torch.zeros(v)
    bias[7] = gap
    hidden = torch.zeros(4, 8)
    weight = torch.randn(v, 8, generator=gen("one-hot"))
    _, spi = rk.fused_logprobs(
        hidden, weight, torch.full((4,), 7), bias, 1.0, 3, with_sum_pi_squared=True
    )
    rest = (v - 1) * math.exp(-gap)
    exact = (1 + (v - 1) * math.exp(-2 * gap)) / (1 + rest) ** 2
    expected = torch.full((4,), exact, dtype=F64)
    assert_close(spi, expected, "fused, one-hot", reduction=v, stages=2)
    assert_close(rk.sum_pi_squared(bias[None]), expected[:1], "plain", reduction=v, stages=2)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    v=st.integers(1, 40),
    spread=st.floats(0.0, 20.0),
    seed=st.integers(0, 2**16),
)
def test_plain_is_a_collision_probability(rows: int, v: int, spread: float, seed: int) -> None:
    """``max_v p_v^2 <= sum_v p_v^2 <= max_v p_v`` and ``1/V <= sum_v p_v^2 <= 1``, on float64
    logits of any spread."""
    z = torch.randn(rows, v, generator=gen("prop", seed), dtype=F64) * spread
    spi = rk.sum_pi_squared(z)
    p = torch.softmax(z, dim=-1)
    top = p.amax(-1)
    slack = 64 * torch.finfo(F64).eps
    assert bool((spi >= top.square() * (1 - slack)).all()) and bool((spi <= top + slack).all())
    assert bool((spi >= (1.0 / v) * (1 - slack)).all()) and bool((spi <= 1 + slack).all())


def test_plain_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        rk.sum_pi_squared(torch.zeros(2, 3), temperature=0.0)
    with pytest.raises(ValueError, match=r"`logits` must have shape \[\.\.\., V\]"):
        rk.sum_pi_squared(torch.zeros(2, 0))
