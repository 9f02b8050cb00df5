"""rl_testing.tolerance: admits reordered sums on every dtype, rejects a real error."""

from __future__ import annotations

import math

import pytest
import torch
from rl_testing.tolerance import assert_close, half_accumulation, lower_precision, rtol


def test_rtol_formula_by_hand() -> None:
    eps32 = torch.finfo(torch.float32).eps
    assert rtol(torch.float32) == 8 * eps32
    assert rtol(torch.float32, reduction=64, stages=3) == pytest.approx(3 * 8 * 8 * eps32)
    assert rtol(torch.bfloat16, reduction=4) == pytest.approx(8 * 2 * 2.0**-7)
    eps16 = torch.finfo(torch.bfloat16).eps
    got = rtol(torch.bfloat16, reduction=96, stages=3, accumulate=torch.float32)
    assert got == pytest.approx(3 * 8 * (math.sqrt(96) * eps32 + eps16))
    assert got < 0.2
    assert rtol(torch.bfloat16, reduction=96, stages=3) > 1
    with pytest.raises(ValueError, match=r"accumulate=torch\.float32 is not wider"):
        rtol(torch.float32, accumulate=torch.float32)
    with pytest.raises(ValueError, match="reduction must be >= 1"):
        rtol(torch.float32, reduction=0)
    with pytest.raises(ValueError, match="stages must be >= 1"):
        rtol(torch.float32, stages=0)


def test_half_accumulation() -> None:
    assert half_accumulation(torch.bfloat16) is torch.float32
    assert half_accumulation(torch.float16) is torch.float32
    assert half_accumulation(torch.float32) is None
    assert half_accumulation(torch.float64) is None


def test_lower_precision() -> None:
    assert lower_precision(torch.float64, torch.float32) is torch.float32
    assert lower_precision(torch.float32, torch.bfloat16, torch.float16) is torch.bfloat16
    with pytest.raises(TypeError, match="not a floating-point"):
        lower_precision(torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [16, 512, 8192])
def test_matmuls_in_another_reduction_order_pass(dtype: torch.dtype, n: int) -> None:
    """Row-by-row sequential sums, summed in two orders, against float64: inside the bound."""
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(64, n, generator=gen, dtype=torch.float64) / math.sqrt(n)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    terms = (w * x).to(dtype)
    forward = torch.zeros(64, dtype=dtype)
    backward = torch.zeros(64, dtype=dtype)
    for k in range(n):  # the rounding of each step in ``dtype``, as a loop kernel does
        forward = forward + terms[:, k]
        backward = backward + terms[:, n - 1 - k]
    exact = terms.double().sum(1)
    assert_close(forward, exact, reduction=n)
    assert_close(forward, backward, reduction=n)


def test_a_real_error_fails_and_the_message_says_why() -> None:
    expected = torch.linspace(-1, 1, 1000, dtype=torch.float64)
    wrong = expected.float() * (1 + 1e-4)  # a bug of 1e-4 relative, e.g. a wrong constant
    with pytest.raises(AssertionError, match=r"(?s)gradients: .*reduction=64, stages=1"):
        assert_close(wrong, expected, reduction=64, msg="gradients")
    with pytest.raises(AssertionError, match=r"shape \(3,\) \(actual\) != \(4,\)"):
        assert_close(torch.zeros(3), torch.zeros(4))


def test_scale_sets_the_absolute_floor_for_cancelled_elements() -> None:
    big = torch.tensor([1000.0, 0.0])
    near_zero = torch.tensor([1000.0, 1e-4])
    assert_close(near_zero, big)  # default scale: max|expected| = 1000 -> atol 9.5e-4
    with pytest.raises(AssertionError):
        assert_close(near_zero, big, scale=1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_accumulate_admits_a_wide_sum_rounded_once_and_rejects_a_wrong_scale(
    dtype: torch.dtype,
) -> None:
    """Float32 sums of rounded terms, rounded once to ``dtype``: inside the bound; the same sums
    scaled by 1/0.7 (a temperature applied twice): outside it."""
    gen = torch.Generator().manual_seed(7)
    terms = (torch.randn(64, 96, generator=gen, dtype=torch.float64) / math.sqrt(96)).to(dtype)
    exact = terms.double().sum(1)
    got = terms.float().sum(1).to(dtype)
    assert_close(got, exact, reduction=96, stages=3, accumulate=torch.float32)
    wrong = (terms.float().sum(1) / 0.7).to(dtype)
    with pytest.raises(AssertionError, match=r"accumulated in torch\.float32"):
        assert_close(wrong, exact, reduction=96, stages=3, accumulate=torch.float32)
    if dtype == torch.bfloat16:  # without it the bound is rtol 1.8: the error passes
        assert_close(wrong, exact, reduction=96, stages=3)
