r"""A lean RMSNorm for the training and scoring forwards: the same numbers, fewer passes.

transformers' RMSNorm (Llama, Qwen2, Qwen3, Mistral and most decoders since; Zhang and
Sennrich, arXiv:1910.07467, eq. 4) computes, in float32 whatever the input dtype,

.. math:: y = w \odot \mathrm{cast}\Big(x \cdot \big(\tfrac{1}{D}\textstyle\sum_d x_d^2
          + \epsilon\big)^{-1/2}\Big)

as six operations, each a separate autograd node; on a ``[N, T, D]`` input the forward writes
three full-size tensors (``x^2``, the normalised ``x``, the product; four when a narrower input
is cast) and autograd's
backward runs about ten more full-size operations (the expanded ``mean`` gradient, the
``pow`` gradient ``2 x``, their product, the sum of the two input gradients, ...).
:func:`rms_norm` computes the same thing as one autograd node that saves ``x``, the ``[..., 1]``
reciprocal ``r`` and ``w``:

* forward: ``r = rsqrt(mean(x^2) + eps)``; ``y = (x r) w`` (the product in place);
* backward (``g = dL/dy``): ``g_1 = g w``; ``c = 2 (-1/2 sum(g_1 x) r^3) / D`` on ``[..., 1]``;
  ``dx = g_1 r + x c`` (in place).

Each element is the same rounded operations as autograd's chain (the factors ``-1/2`` and
``2`` are exact, ``mean``'s backward divides every element of the expanded gradient by ``D``,
which equals dividing the ``[..., 1]`` tensor first, and IEEE products and sums commute), so
the values and the norm's input gradient are equal bit for bit. Inside a model the gradients
further back equal to float rounding only (about 1e-7 relative): autograd adds the norm's two
gradient terms and the residual stream's in its own order, this node hands over their first
two already summed. The time it saves is measured in ``docs/benchmarks.md`` ("How we got
here").

:func:`lean_rms_norm` swaps the lean forward into a model's RMSNorm modules for the length of a
``with`` block, only where the module's class computes transformers' formula: checked once per
class, weight dtype and device on a probe (values and input gradients bit for bit, in fp32,
fp64, bf16 and fp16 inputs). Variants such as Gemma's ``(1 + w)`` scale, a forward a kernel
library replaced, a trained (requires-grad) weight, autocast and ZeRO-3 partitioned weights run
the module's own forward.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from rl_adapters import _compat
from rl_adapters._swap import instance_forwards
from rl_adapters.lean_report import LeanFallback, LeanSwap, count_swap, group_fallbacks

__all__ = ["lean_rms_norm", "rms_norm", "survey"]

#: Where transformers' RMSNorm modules keep their epsilon.
_EPS_NAMES = ("variance_epsilon", "eps")
_PROBE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"`weight` {tuple(weight.shape)} must be one-dimensional with x's last dimension "
            f"{x.shape[-1]} (x {tuple(x.shape)})"
        )


def _plain(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The formula as transformers writes it: separate operations, autograd through each."""
    dtype = x.dtype
    xf = x.to(torch.float32)
    variance = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(variance + eps)).to(dtype)


def _forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, x in float32, r)``: the normalised, scaled ``x`` and what the backward needs."""
    dtype = x.dtype
    xf = x.to(torch.float32)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * r
    if dtype == torch.float32 and torch.promote_types(weight.dtype, dtype) == dtype:
        return y.mul_(weight), xf, r  # y is a new tensor: scaled in place
    return weight * y.to(dtype), xf, r


class _RMSNorm(torch.autograd.Function):
    """transformers' RMSNorm as one node; ``weight`` is frozen (gets no gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y, xf, r = _forward(x, weight, eps)
        ctx.save_for_backward(xf, r, weight)
        ctx.in_dtype = x.dtype
        return y

    @staticmethod
    @once_differentiable  # the backward updates its temporaries in place
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        xf, r, weight = ctx.saved_tensors
        dtype = ctx.in_dtype
        # autograd's chain: the product's gradient, cast to the input dtype and back to float32
        g1 = (grad * weight).to(dtype).to(torch.float32)  # a new tensor: updated in place
        c = (g1 * xf).sum(-1, keepdim=True).mul(-0.5).mul(r.pow(3)).div(xf.shape[-1]).mul(2)
        gx = g1.mul_(r).add_(xf * c)
        return gx.to(dtype), None, None


def _autocast(x: torch.Tensor) -> bool:
    return torch.is_autocast_enabled(x.device.type)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    r"""Transformers' RMSNorm ``w * cast(x * rsqrt(mean(x^2, -1) + eps))`` (float32 inside).

    Args:
        x: [..., D] hidden states (e.g. [N, T, H], or [N, heads, T, D] for Qwen3's q/k norms).
        weight: [D] scale ``w``.
        eps: Added to the mean square.

    Returns:
        [..., D] in ``promote_types(weight.dtype, x.dtype)``, differentiable w.r.t. ``x``;
        bit-equal to transformers' formula in values and input gradient. Where ``weight`` needs
        a gradient or autocast is on, the formula runs as separate operations.

    Raises:
        ValueError: ``weight`` is not [D].
    """
    _check(x, weight)
    if _autocast(x) or (torch.is_grad_enabled() and weight.requires_grad):
        return _plain(x, weight, eps)
    if torch.is_grad_enabled() and x.requires_grad:
        out: torch.Tensor = _RMSNorm.apply(x, weight, eps)
        return out
    return _forward(x, weight, eps)[0]


# -- swapping it into a model ------------------------------------------------------------------

#: (class forward, weight dtype, device type) -> the input dtypes the lean path reproduces
_PROBED: dict[tuple[Any, torch.dtype, str], frozenset[torch.dtype]] = {}
_NORMS: weakref.WeakKeyDictionary[nn.Module, list[tuple[nn.Module, str]]] = (
    weakref.WeakKeyDictionary()
)


def _eps_name(module: nn.Module) -> str | None:
    """The epsilon attribute of an RMSNorm-like module with a [D] weight (None: not one)."""
    weight = _compat.read(module, "weight", None, library="transformers")
    if "RMSNorm" not in type(module).__name__ or not isinstance(weight, nn.Parameter):
        return None
    if weight.dim() != 1 or not weight.is_floating_point() or hasattr(weight, "ds_id"):
        return None  # ZeRO-3 partitions weights: only the module's own hooks gather them
    for name in _EPS_NAMES:
        if isinstance(_compat.read(module, name, None, library="transformers"), float):
            return name
    return None


def _blocker(module: nn.Module) -> tuple[str, bool] | None:  # noqa: PLR0911
    """Why an ``*RMSNorm*`` module keeps its own forward (None: it runs the lean one)."""
    weight = _compat.read(module, "weight", None, library="transformers")
    if not isinstance(weight, nn.Parameter):
        return _compat.describe_missing(module, ["weight"], "transformers"), True
    if weight.dim() != 1 or not weight.is_floating_point():
        return f"weight of shape {tuple(weight.shape)} and dtype {weight.dtype}", False
    if hasattr(weight, "ds_id"):
        return "ZeRO-3 partitioned weight", False
    name = _eps_name(module)
    if name is None:
        return _compat.describe_missing(module, ["/".join(_EPS_NAMES)], "transformers"), True
    if "forward" in module.__dict__ and not hasattr(module.forward, "lean_rms_norm_of"):
        return "an instance forward is set (a hook library's)", False
    if not _lean_dtypes(module, name):
        return "class forward is not transformers' RMSNorm (bit-equality probe)", False
    return None


def survey(model: nn.Module) -> tuple[LeanSwap, list[LeanFallback]]:
    """The RMSNorms :func:`lean_rms_norm` swaps, and those it leaves alone (with the reason).

    For the policy's :class:`~rl_adapters.lean_report.LeanReport`.

    Candidates are the modules whose class name contains ``RMSNorm``. A trained weight (full
    fine-tuning) is counted as swapped and noted: its training forwards run the module's own
    forward, its no-grad forwards the lean one.
    """
    lean: list[str] = []
    fell: list[tuple[str, str, bool]] = []
    for module in model.modules():
        target = type(module).__name__
        if "RMSNorm" not in target:
            continue
        blocked = _blocker(module)
        if blocked is not None:
            fell.append((target, *blocked))
            continue
        lean.append(target)
        if module.weight.requires_grad:
            fell.append((target, "trained weight: its training forwards run their own", False))
    return count_swap("rms_norm", lean), group_fallbacks("rms_norm", fell)


def _probe(module: nn.Module, eps: float) -> frozenset[torch.dtype]:
    """The input dtypes for which ``module``'s class forward is our formula, bit for bit.

    Runs with gradients recorded whatever the caller's mode: the result is cached, and the
    first block is often a no-grad scoring pass.
    """
    with torch.inference_mode(False), torch.enable_grad():
        return _probe_dtypes(module, eps)


def _probe_dtypes(module: nn.Module, eps: float) -> frozenset[torch.dtype]:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    gen = torch.Generator().manual_seed(0)
    frozen = weight.detach()
    ok = set()
    for dtype in _PROBE_DTYPES:
        x = torch.randn((2, 3, weight.shape[0]), generator=gen).to(weight.device, dtype)
        g = torch.randn((2, 3, weight.shape[0]), generator=gen).to(weight.device)
        try:
            xa = x.clone().requires_grad_()
            want = type(module).forward(module, xa)
            if not isinstance(want, torch.Tensor):
                continue
            (want_grad,) = torch.autograd.grad(want, xa, g.to(want.dtype))
        except Exception:  # a variant that cannot take this input: not ours to replace
            continue
        xb = x.clone().requires_grad_()
        got = _RMSNorm.apply(xb, frozen, eps)
        if got.dtype != want.dtype or not torch.equal(got.detach(), want.detach()):
            continue
        (got_grad,) = torch.autograd.grad(got, xb, g.to(got.dtype))
        if torch.equal(got_grad, want_grad):
            ok.add(dtype)
    return frozenset(ok)


def _lean_dtypes(module: nn.Module, eps_name: str) -> frozenset[torch.dtype]:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    key = (type(module).forward, weight.dtype, weight.device.type)
    if key not in _PROBED:
        _PROBED[key] = _probe(
            module, float(_compat.read(module, eps_name, 0.0, library="transformers"))
        )
    return _PROBED[key]


def _lean_forward(
    module: nn.Module, eps_name: str, dtypes: frozenset[torch.dtype]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A drop-in ``forward`` for ``module``: the lean path for the probed input ``dtypes``."""
    original = type(module).forward
    weight_dtype = module.weight.dtype

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        grad = torch.is_grad_enabled()
        if (
            hidden_states.dtype not in dtypes
            or weight.dtype != weight_dtype
            or (grad and weight.requires_grad)
            or hidden_states.shape[-1] != weight.shape[0]
            or _autocast(hidden_states)
        ):
            out: torch.Tensor = original(module, hidden_states)
            return out
        eps = _compat.read(module, eps_name, library="transformers")
        if not isinstance(eps, float):
            return original(module, hidden_states)  # type: ignore[no-any-return]
        if grad and hidden_states.requires_grad:
            y: torch.Tensor = _RMSNorm.apply(hidden_states, weight, eps)
            return y
        return _forward(hidden_states, weight, eps)[0]

    forward.lean_rms_norm_of = original  # type: ignore[attr-defined]
    return forward


def _norms(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """``model``'s RMSNorm modules and their epsilon attributes (found once per model)."""
    if model not in _NORMS:
        found = [(m, _eps_name(m)) for m in model.modules()]
        _NORMS[model] = [(m, name) for m, name in found if name is not None]
    return _NORMS[model]


@contextlib.contextmanager
def lean_rms_norm(model: nn.Module, enabled: bool = True) -> Iterator[int]:
    """Run ``model``'s forwards (and their backwards) inside the block with the lean RMSNorm.

    Yields how many modules were swapped (0 when ``enabled`` is False or none qualifies).
    The swap sets an instance ``forward`` on each RMSNorm module whose class forward passes the
    probe, and removes it on exit; a module that already has an instance ``forward`` (an
    enclosing block's, or a hook library's such as accelerate's) is left alone. With activation
    checkpointing, keep the backward inside the block too: a checkpointed layer recomputes its
    forward during the backward, and torch's non-reentrant checkpoint raises
    ``CheckpointError`` when the recomputation (the original forward, after the block) saves
    other tensors than the forward did.
    """
    norms = dict(_norms(model)) if enabled else {}

    def build(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        dtypes = _lean_dtypes(module, norms[module])
        return _lean_forward(module, norms[module], dtypes) if dtypes else None

    with instance_forwards(norms, build, "lean_rms_norm_of") as swapped:
        yield swapped
