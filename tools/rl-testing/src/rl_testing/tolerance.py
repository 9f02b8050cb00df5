"""One tolerance for two float computations of the same quantity that take different routes.

Two routes to one real number (a fused kernel against a loop, packed rows against padded ones,
two processes against one, float32 against a float64 reference, another CPU's vector width)
agree only to rounding. How far they may differ follows from the arithmetic, not from one
machine's run. A sum of ``n`` terms rounded at each step carries the error ``sum_k delta_k s_k``
(partial sums ``s_k``, ``|delta_k| <= u = eps / 2``): at most ``n u max|s_k|`` in the worst case
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2), and, with the
rounding errors modelled as independent and mean zero, at most ``lam * sqrt(n) * u *
max|s_k|`` with probability at least ``1 - 2 exp(-lam**2 / 2)`` (Higham and Mary, *A New
Approach to Probabilistic Rounding Error Analysis*, SIAM J. Sci. Comput. 41(5), 2019). Two
routes may err in opposite directions, so their difference is bounded by twice that. This
module takes ``lam = 8`` (a failure chance below ``3e-14`` per element) and the largest
magnitude of the compared values for ``max|s_k|``, so::

    rtol = stages * 8 * sqrt(reduction) * eps(dtype)
    atol = rtol * scale

or, where the sums accumulate in a wider dtype than the values are stored in (half-precision
GEMMs and kernels that upcast: each sum carries the wide dtype's error, and each stage's result
is rounded once to ``dtype``)::

    rtol = stages * 8 * (sqrt(reduction) * eps(accumulate) + eps(dtype))

* ``dtype``: the lower precision of the two sides (float32 against a float64 reference is a
  float32 comparison; bf16 kernels against float32 are bf16).
* ``reduction``: the length of the longest sum behind one element (the hidden size of a
  matmul, the tokens of a mean, the rows of a batch, the number of elements of a norm).
* ``stages``: how many such rounded reductions are chained between the inputs and the compared
  value (the layers of a model, the optimiser steps of a run); the errors add.
* ``accumulate``: the dtype the sums are accumulated in, where it is wider than ``dtype``
  (float32 for bf16 / fp16 inputs to an upcasting kernel or a CUDA GEMM). Without it a half
  dtype's ``sqrt(reduction) * eps`` passes anything at the sizes tests use (bfloat16, 96 terms,
  3 stages: rtol 1.8), so such a check could not fail.
* ``scale``: the size of the partial sums, since an element that cancels to near zero keeps
  the absolute error of its terms; by default the largest magnitude of ``expected``. Pass it
  where the terms are much larger than the results (a loss that is a difference of large
  sums).

Compare bit for bit (``torch.equal``) only where the same kernels run on the same inputs in
the same order; everywhere else use :func:`assert_close`.
"""

from __future__ import annotations

import math

import torch

#: ``lam`` of the probabilistic bound: twice ``lam * u`` is ``lam * eps``.
LAMBDA = 8.0


def lower_precision(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype with the largest machine epsilon among ``dtypes`` (all floating point)."""
    for dtype in dtypes:
        if not dtype.is_floating_point:
            raise TypeError(f"lower_precision: {dtype} is not a floating-point dtype")
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


def half_accumulation(dtype: torch.dtype) -> torch.dtype | None:
    """``accumulate`` for values stored in ``dtype``: float32 for bf16 / fp16, else None.

    What CUDA GEMMs, PyTorch's reductions and the upcasting kernels sum half-precision values in.
    """
    return torch.float32 if torch.finfo(dtype).eps > torch.finfo(torch.float32).eps else None


def rtol(
    dtype: torch.dtype,
    *,
    reduction: int = 1,
    stages: int = 1,
    accumulate: torch.dtype | None = None,
) -> float:
    """The relative tolerance (module docstring).

    ``stages * 8 * sqrt(reduction) * eps(dtype)``; with ``accumulate`` (a dtype whose epsilon
    is smaller than ``dtype``'s) ``stages * 8 * (sqrt(reduction) * eps(accumulate) +
    eps(dtype))``.
    """
    if reduction < 1:
        raise ValueError(f"rtol: reduction must be >= 1 (the length of a sum), got {reduction}")
    if stages < 1:
        raise ValueError(f"rtol: stages must be >= 1 (chained reductions), got {stages}")
    eps = torch.finfo(dtype).eps
    if accumulate is None:
        return stages * LAMBDA * math.sqrt(reduction) * eps
    wide = torch.finfo(accumulate).eps
    if wide >= eps:
        raise ValueError(
            f"rtol: accumulate={accumulate} is not wider than dtype={dtype}; pass "
            "accumulate=None when the sums run in the compared dtype"
        )
    return stages * LAMBDA * (math.sqrt(reduction) * wide + eps)


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    reduction: int = 1,
    stages: int = 1,
    scale: float | None = None,
    dtype: torch.dtype | None = None,
    accumulate: torch.dtype | None = None,
    msg: str | None = None,
) -> None:
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` with the module's tolerance.

    Args:
        actual: The value computed by the route under test.
        expected: The reference; any floating dtype (a float64 reference is compared after
            casting ``actual`` up, never by rounding the reference down).
        reduction: Length of the longest sum behind one element.
        stages: Number of chained rounded reductions.
        scale: Magnitude of the summed terms; default ``max|expected|`` (1 when that is 0).
        dtype: Precision of the comparison; default the lower precision of the two sides.
        accumulate: The wider dtype the sums run in, if any (module docstring).
        msg: Prefix of the failure message (what is compared).
    """
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{msg + ': ' if msg else ''}shape {tuple(actual.shape)} (actual) != "
            f"{tuple(expected.shape)} (expected)"
        )
    dtype = dtype or lower_precision(actual.dtype, expected.dtype)
    wide = min(actual.dtype, expected.dtype, key=lambda d: torch.finfo(d).eps)
    a, e = actual.detach().to(wide), expected.detach().to(wide)
    if scale is None:
        scale = float(e.abs().max()) if e.numel() else 1.0
        scale = scale if scale > 0 and math.isfinite(scale) else 1.0
    r = rtol(dtype, reduction=reduction, stages=stages, accumulate=accumulate)
    torch.testing.assert_close(
        a,
        e,
        rtol=r,
        atol=r * scale,
        check_device=False,
        msg=lambda m: (
            f"{msg + ': ' if msg else ''}{m}\n(tolerance for {dtype}"
            f"{f' accumulated in {accumulate}' if accumulate else ''}: reduction={reduction}, "
            f"stages={stages}, scale={scale:.3g} -> rtol={r:.3g}, atol={r * scale:.3g})"
        ),
    )
