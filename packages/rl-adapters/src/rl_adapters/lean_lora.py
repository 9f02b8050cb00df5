r"""A lean training forward for plain LoRA linear layers: one autograd node, no temporaries.

peft's LoRA ``Linear.forward`` computes

.. math:: y = x W^\top + b + s \, (x A^\top) B^\top

as five operations (the base linear, ``lora_A``, ``lora_B``, ``* scaling``, ``+``), each a
separate autograd node, and two of them make a new ``[T, out]`` tensor besides the output
(``B``'s output, then its scaled copy); the backward makes two more (the scaled gradient and
the ``lora_A`` input gradient, then their sum). On CPU those full-size temporaries, not the
rank-r matmuls, dominate a LoRA layer's cost (about a third of a LoRA step on the peer
benchmark's 20M-parameter model). :class:`LoraLinearFunction` computes the same thing as one
autograd node that accumulates in place (``torch.addmm_``):

* forward: ``out = x W^T + b``; ``u = x A^T`` ``[T, r]``; ``out += s u B^T``;
* backward (``g = dL/dy``): ``gu = s g B`` ``[T, r]``; ``dB = s g^T u``; ``dA = gu^T x``;
  ``dx = g W + gu A``.

On CPU the three products with the rank ``r`` as one output dimension (``u``, ``gu``, ``dB``)
run transposed, as ``[r, T]`` (or ``[r, out]``) products whose transpose is the ``[T, r]``
result: the same sums, and CPU BLAS computes such a short-and-wide product several times
faster than the tall-and-thin one (``docs/benchmarks.md``, "How we got here").

The base weight and bias must be frozen (LoRA training): they get no gradient. The outputs
equal peft's to float rounding (a scale that is not a power of two rounds, and on CPU another
kernel sums ``x A^T``); the gradients too (the input gradient ``g W + gu A`` is summed inside
the node, not by autograd across the layers that read ``x``). :class:`LeanLora` hangs in the
model in place of a peft layer (see :meth:`rl_adapters.roles.LoraSites.lean`) and falls back to the
peft layer's own forward for anything this does not cover (dropout in training mode, variants
such as DoRA, a LoRA bias, several active adapters, mixed dtypes, autocast, a merged layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rl_adapters import _compat

__all__ = ["LeanLora", "LoraLinearFunction", "adapter_blocker", "lean_blocker", "lean_eligible"]


def _lora_linear(
    x2: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x W^T + b + s u B^T, u = x A^T)`` for [T, in] ``x2``: [T, out] and [T, r]."""
    out = nn.functional.linear(x2, weight, bias)
    u = torch.mm(lora_a, x2.t()).t() if x2.is_cpu else torch.mm(x2, lora_a.t())  # [T, r]
    out.addmm_(u, lora_b.t(), alpha=scaling)
    return out, u


class LoraLinearFunction(torch.autograd.Function):
    """One plain LoRA linear layer as one autograd node: ``x W^T + b + s (x A^T) B^T``.

    Shapes: ``x`` [..., in], ``W`` [out, in] and ``b`` [out] or None (frozen), ``A`` [r, in],
    ``B`` [out, r]; returns [..., out].
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        """[..., out]: ``out = x W^T + b``, then ``out += s (x A^T) B^T`` in place."""
        x2 = x.reshape(-1, x.shape[-1])
        out, u = _lora_linear(x2, weight, bias, lora_a, lora_b, scaling)
        ctx.save_for_backward(x2, u, weight, lora_a, lora_b)
        ctx.scaling = scaling
        ctx.in_shape = x.shape
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Gradients of ``x``, ``A`` and ``B`` (the frozen base gets none)."""
        x2, u, weight, lora_a, lora_b = ctx.saved_tensors
        s = ctx.scaling
        need_x, _, _, need_a, need_b, _ = ctx.needs_input_grad
        g = grad.reshape(-1, grad.shape[-1])
        if g.is_cpu:  # rank-major products (the module docstring), transposed back as views
            gu = torch.mm(lora_b.t(), g.t()).mul_(s).t()  # [T, r]
            grad_b = torch.mm(u.t(), g).mul_(s).t() if need_b else None
        else:
            gu = torch.mm(g, lora_b).mul_(s)  # [T, r]
            grad_b = torch.mm(g.t(), u).mul_(s) if need_b else None
        grad_a = torch.mm(gu.t(), x2) if need_a else None
        grad_x = None
        if need_x:
            grad_x = torch.mm(g, weight).addmm_(gu, lora_a).view(ctx.in_shape)
        return grad_x, None, None, grad_a, grad_b, None


def _dropout_is_identity(dropout: Any) -> bool:
    if isinstance(dropout, nn.Identity):
        return True
    return isinstance(dropout, nn.Dropout) and (dropout.p == 0.0 or not dropout.training)


def lean_blocker(layer: Any) -> tuple[str, bool] | None:
    """Why a peft LoRA layer cannot run the lean forward, or None where it can.

    The static half of the check (done when the layer is swapped and when the policy's
    :class:`~rl_adapters.lean_report.LeanReport` is made): every internal in
    :data:`rl_adapters._compat.LORA_INTERNALS` is readable, and the base is a plain
    floating-point ``nn.Linear`` (not ZeRO-3). :class:`LeanLora` checks the rest (active
    adapter, variant, dropout, frozen base, dtypes) at the first call of each body in each
    state of the layer (see :meth:`LeanLora.refresh`), and the input dtype and autocast at
    every call.

    Returns:
        ``(reason, unexpected)``: ``unexpected`` is True where a peft internal is missing or
        renamed; None where the layer can run the lean forward.
    """
    gone = _compat.missing(layer, _compat.LORA_INTERNALS)
    if gone:
        return _compat.describe_missing(layer, gone, "peft"), True
    base = _compat.read(layer, "base_layer")
    if type(base) is not nn.Linear:
        return f"base layer is {type(base).__name__}, not a plain nn.Linear", False
    if _compat.read(layer, "fan_in_fan_out", False):
        return "fan_in_fan_out weights", False
    if not base.weight.is_floating_point():
        return f"{base.weight.dtype} base weight", False
    if hasattr(base.weight, "ds_id"):
        return "ZeRO-3 partitioned base weight", False
    return None


def lean_eligible(layer: Any) -> bool:
    """Whether a peft LoRA layer can run the lean forward (:func:`lean_blocker` finds nothing)."""
    return lean_blocker(layer) is None


def adapter_blocker(layer: Any, name: str) -> str | None:
    """Why adapter ``name`` of a LoRA layer runs peft's forward, or None for plain LoRA.

    Not plain: missing from the layer, a variant (DoRA and peft's other ``lora_variant``
    entries, or ``use_dora``), a LoRA bias. Internals that cannot be read count as not plain.
    """
    lora_a = _compat.read(layer, "lora_A")
    variants = _compat.read(layer, "lora_variant")
    bias = _compat.read(layer, "lora_bias")
    if lora_a is _compat.MISSING or variants is _compat.MISSING or bias is _compat.MISSING:
        return "peft internals missing"
    if name not in lora_a:
        return f"no adapter {name!r}"
    if name in variants:
        return f"{type(variants[name]).__name__} variant"
    if _compat.read(layer, "use_dora", {}).get(name, False):
        return "DoRA"
    if bias.get(name, False):
        return "LoRA bias"
    return None


@dataclass(frozen=True)
class _Plan:
    """What :class:`LeanLora` runs for one state of its layer: the tensors and the scale."""

    dtype: torch.dtype
    weight: torch.Tensor
    bias: torch.Tensor | None
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scaling: float


class LeanLora(nn.Module):
    """Stands in for a peft LoRA ``Linear``: :class:`LoraLinearFunction` where it applies.

    Applies when the layer is neither merged nor disabled, exactly one adapter is active and
    it is plain LoRA (no variant, no LoRA bias), its dropout is the identity (``p = 0`` or eval
    mode), the base weight and bias are frozen, the input, base and adapter weights share one
    dtype, autocast is off and no extra arguments are passed. Otherwise the peft layer's own
    forward runs.
    """

    def __init__(self, layer: Any) -> None:
        super().__init__()
        self.layer = layer
        # (active adapters, disabled, merged) -> _Plan, or None for peft's forward
        self._plans: dict[tuple[Any, ...], _Plan | None] = {}
        self._checked: set[tuple[Any, ...]] = set()  # the states checked in this body

    def refresh(self) -> None:
        """Check the per-state decisions again (done on entering each training body).

        Inside one body the adapter's settings (dropout, trainable flags, dtypes) are taken to
        stay as they were at its first forward in each state of the layer (active adapters,
        disabled, merged); role switches change that state and are followed. At the first
        forward of a body in each state, a plan still holds when the layer keeps its tensors,
        scale, frozen base and identity dropout (:meth:`_holds`); else it is decided again.
        """
        self._checked.clear()

    def _plan(self, x: torch.Tensor) -> _Plan | None:
        layer = self.layer
        if torch.is_autocast_enabled(x.device.type):  # autocast of the input's device
            return None
        active = _compat.read(layer, "active_adapters")
        disabled = _compat.read(layer, "disable_adapters")
        merged = _compat.read(layer, "merged_adapters")
        if active is _compat.MISSING or disabled is _compat.MISSING or merged is _compat.MISSING:
            return None  # peft's forward (_compat warned once)
        key = (tuple(active), disabled, len(merged))
        if key not in self._checked:
            plan = self._plans.get(key)
            if plan is None or not self._holds(plan, active):
                self._plans[key] = None if disabled or merged else self._decide(x, active)
            self._checked.add(key)
        plan = self._plans[key]
        return plan if plan is not None and plan.dtype == x.dtype else None

    def _holds(self, plan: _Plan, active: Any) -> bool:
        """Whether :meth:`_decide` would give ``plan`` again: the same base and adapter tensors
        in one dtype, the same scale, a frozen base and a dropout that is the identity.

        What :func:`adapter_blocker` reads (variant, LoRA bias) is fixed when the adapter is
        built; rebuilding it makes new tensors, which this sees.
        """  # noqa: D205
        layer = self.layer
        try:
            name = active[0]
            base = layer.base_layer
            same = (
                len(active) == 1
                and base.weight is plan.weight
                and base.bias is plan.bias
                and layer.lora_A[name].weight is plan.lora_a
                and layer.lora_B[name].weight is plan.lora_b
                and float(layer.scaling[name]) == plan.scaling
                and _dropout_is_identity(layer.lora_dropout[name])
            )
        except Exception:  # an internal gone or renamed: _decide reads it through _compat
            return False
        if not same or plan.weight.requires_grad:
            return False
        if plan.bias is not None and plan.bias.requires_grad:
            return False
        return plan.weight.dtype == plan.lora_a.dtype == plan.lora_b.dtype == plan.dtype

    def _decide(self, x: torch.Tensor, active: Any) -> _Plan | None:
        layer = self.layer
        name = active[0] if len(active) == 1 else None
        if name is None or adapter_blocker(layer, name) is not None:
            return None
        dropout = _compat.read(layer, "lora_dropout")
        base = _compat.read(layer, "base_layer")
        lora_b = _compat.read(layer, "lora_B")
        scaling = _compat.read(layer, "scaling")
        if any(v is _compat.MISSING for v in (dropout, base, lora_b, scaling)):
            return None
        if name not in dropout or not _dropout_is_identity(dropout[name]):
            return None
        if base.weight.requires_grad or (base.bias is not None and base.bias.requires_grad):
            return None  # a trained base needs its own gradient
        lora_a, lora_b = _compat.read(layer, "lora_A")[name].weight, lora_b[name].weight
        if len({x.dtype, base.weight.dtype, lora_a.dtype, lora_b.dtype}) != 1:
            return None
        return _Plan(x.dtype, base.weight, base.bias, lora_a, lora_b, float(scaling[name]))

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """[..., out] what the peft layer computes for [..., in] ``x``."""
        plan = None if args or kwargs else self._plan(x)
        if plan is None:
            out: torch.Tensor = self.layer(x, *args, **kwargs)
            return out
        if not torch.is_grad_enabled() or not (
            x.requires_grad or plan.lora_a.requires_grad or plan.lora_b.requires_grad
        ):  # nothing to differentiate (scoring): the same operations, no autograd node
            x2 = x.reshape(-1, x.shape[-1])
            out2, _ = _lora_linear(
                x2, plan.weight, plan.bias, plan.lora_a, plan.lora_b, plan.scaling
            )
            return out2.view(*x.shape[:-1], out2.shape[-1])
        y: torch.Tensor = LoraLinearFunction.apply(
            x, plan.weight, plan.bias, plan.lora_a, plan.lora_b, plan.scaling
        )
        return y
