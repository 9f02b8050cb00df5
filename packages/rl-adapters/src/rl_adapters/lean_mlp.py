r"""A lean SwiGLU MLP for the training and scoring forwards: same numbers, one saved tensor less.

The gated MLP of Llama, Qwen2/3, Mistral and most decoders since (Shazeer, arXiv:2002.05202,
eq. 6, "FFN_SwiGLU") is, in transformers,

.. math:: y = W_{down}\big(\mathrm{SiLU}(W_{gate}\, x) \odot W_{up}\, x\big),
          \qquad \mathrm{SiLU}(a) = a\, \sigma(a)

with the SiLU and the product as two autograd nodes. On ``[N, T, I]`` projections the forward
writes two full-size tensors (the activation and the product) and the graph keeps three for
the backward (the gate for SiLU's gradient, the activation and ``up`` for the product's);
the backward writes three more. :func:`silu_mul` is one node that keeps only ``gate`` and
``up``:

* forward: ``out = silu(gate)``; ``out *= up`` (in place);
* backward (``g = dL/dout``): ``d_up = silu(gate) g`` (recomputed, then in place) and
  ``d_gate = silu_backward(g up, gate)``, the very kernel autograd's SiLU node calls.

Every element is the same rounded operations as autograd's two nodes (IEEE products commute),
so values and both input gradients are equal **bit for bit**; one ``[N, T, I]`` activation per
layer less is saved (a quarter of the MLP's saved activations, counting the product the down
projection keeps) and one full-size write less runs each way (the time it saves:
``docs/benchmarks.md``, "How we got here").

:func:`lean_swiglu` swaps a drop-in ``forward`` into a model's MLP modules (those with
``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``) for the length of a ``with`` block,
only where the module's class computes the formula above with its ``act_fn``: checked once per
class forward and activation type, on a small stand-in module of the same class (values and
input gradients bit for bit, fp32, fp64, bf16 and fp16). GeGLU (Gemma), other activations,
a forward a kernel library replaced, and autocast run the module's own forward. The
projections are the module's own (LoRA layers, hooks and all): only the step between them
changes.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.functional import silu

from rl_adapters import _compat
from rl_adapters._swap import instance_forwards
from rl_adapters.lean_report import LeanFallback, LeanSwap, count_swap, group_fallbacks

__all__ = ["lean_swiglu", "silu_mul", "survey"]

_PROBE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


class _SiluMul(torch.autograd.Function):
    """``silu(gate) * up`` as one node that saves only its two inputs."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        out = silu(gate)
        out.mul_(up)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    @once_differentiable  # the backward updates its temporaries in place
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gate, up = ctx.saved_tensors
        need_gate, need_up = ctx.needs_input_grad
        # autograd's product node: d_act = grad * up, d_up = grad * act; then SiLU's node
        d_gate = torch.ops.aten.silu_backward(grad * up, gate) if need_gate else None
        d_up = silu(gate).mul_(grad) if need_up else None
        return d_gate, d_up


def _autocast(x: torch.Tensor) -> bool:
    return torch.is_autocast_enabled(x.device.type)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    r"""``SiLU(gate) * up``, the SwiGLU gate (arXiv:2002.05202, eq. 6), as one autograd node.

    Args:
        gate: [..., I] the gate projection ``W_gate x`` (e.g. [N, T, I]).
        up: [..., I] the up projection ``W_up x``, same shape and dtype as ``gate``.

    Returns:
        [..., I], differentiable w.r.t. both; values and gradients bit-equal to
        ``silu(gate) * up`` through autograd. Under autocast, or for inputs of different
        dtypes, it runs as those two operations. Without a recorded gradient it writes one
        tensor (the product in place).

    Raises:
        ValueError: ``gate`` and ``up`` differ in shape.
    """
    if gate.shape != up.shape:
        raise ValueError(
            f"`gate` {tuple(gate.shape)} and `up` {tuple(up.shape)} must have the same shape"
        )
    if _autocast(gate) or gate.dtype != up.dtype:
        return silu(gate) * up
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        out: torch.Tensor = _SiluMul.apply(gate, up)
        return out
    return silu(gate).mul_(up)


# -- swapping it into a model ------------------------------------------------------------------

#: (class forward, activation type) -> the dtypes for which the lean forward is the class's
_PROBED: dict[tuple[Any, type], frozenset[torch.dtype]] = {}
_MLPS: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = weakref.WeakKeyDictionary()


def _is_gated_mlp(module: nn.Module) -> bool:
    """Whether ``module`` has the parts of a gated MLP (three projections and an activation)."""
    return all(
        isinstance(_compat.read(module, name, None, library="transformers"), nn.Module)
        for name in _PARTS
    )


def survey(model: nn.Module) -> tuple[LeanSwap, list[LeanFallback]]:
    """The gated MLPs :func:`lean_swiglu` swaps, and those it leaves alone (with the reason).

    For the policy's :class:`~rl_adapters.lean_report.LeanReport`.

    Candidates are the modules with the three projections; one without ``act_fn`` is an
    unexpected internal (a renamed attribute).
    """
    lean: list[str] = []
    fell: list[tuple[str, str, bool]] = []
    for module in model.modules():
        target = type(module).__name__
        parts = [_compat.read(module, n, None, library="transformers") for n in _PARTS[:3]]
        if not all(isinstance(p, nn.Module) for p in parts):
            continue
        if not _is_gated_mlp(module):
            fell.append(
                (target, _compat.describe_missing(module, ["act_fn"], "transformers"), True)
            )
        elif "forward" in module.__dict__ and not hasattr(module.forward, "lean_swiglu_of"):
            fell.append((target, "an instance forward is set (a hook library's)", False))
        elif not _lean_dtypes(module):
            fell.append(
                (target, "class forward is not SiLU(gate) * up (bit-equality probe)", False)
            )
        else:
            lean.append(target)
    return count_swap("swiglu", lean), group_fallbacks("swiglu", fell)


def _lean_call(module: Any, x: torch.Tensor, act: Callable[..., Any]) -> Any:
    """``down(silu_mul(gate(x), up(x)))`` through ``module``'s own projections."""
    return module.down_proj(act(module.gate_proj(x), module.up_proj(x)))


def _probe(module: nn.Module) -> frozenset[torch.dtype]:
    """The dtypes for which ``module``'s class forward is the lean formula, bit for bit.

    Runs the class forward on a stand-in of the same class (``object.__new__``, no
    ``__init__``) holding small ``nn.Linear`` projections and ``module``'s activation, so
    nothing of the model runs (no hooks, collectives or random state). Gradients are recorded
    whatever the caller's mode: the result is cached, and the first block is often a no-grad
    scoring pass.
    """
    with torch.inference_mode(False), torch.enable_grad():
        return _probe_dtypes(module)


def _probe_dtypes(module: nn.Module) -> frozenset[torch.dtype]:
    cls = type(module)
    gen = torch.Generator().manual_seed(0)
    ok = set()
    for dtype in _PROBE_DTYPES:
        try:
            stand_in: Any = object.__new__(cls)
            nn.Module.__init__(stand_in)
            stand_in.gate_proj = nn.Linear(4, 6, bias=False, dtype=dtype)
            stand_in.up_proj = nn.Linear(4, 6, bias=False, dtype=dtype)
            stand_in.down_proj = nn.Linear(6, 4, bias=False, dtype=dtype)
            stand_in.act_fn = module.act_fn
            for p in stand_in.parameters():
                p.requires_grad_(False)
                p.copy_(torch.randn(p.shape, generator=gen).to(dtype))
            x = torch.randn((2, 3, 4), generator=gen).to(dtype)
            g = torch.randn((2, 3, 4), generator=gen).to(dtype)
            xa = x.clone().requires_grad_()
            want = cls.forward(stand_in, xa)
            if not isinstance(want, torch.Tensor):
                continue
            (want_grad,) = torch.autograd.grad(want, xa, g)
        except Exception:  # a variant that cannot run on the stand-in: not ours to replace
            continue
        xb = x.clone().requires_grad_()
        got = _lean_call(stand_in, xb, _SiluMul.apply)
        if got.dtype != want.dtype or not torch.equal(got.detach(), want.detach()):
            continue
        (got_grad,) = torch.autograd.grad(got, xb, g)
        with torch.no_grad():
            plain = _lean_call(stand_in, x, silu_mul)
        if torch.equal(got_grad, want_grad) and torch.equal(plain, want.detach()):
            ok.add(dtype)
    return frozenset(ok)


def _lean_dtypes(module: nn.Module) -> frozenset[torch.dtype]:
    key = (type(module).forward, type(module.act_fn))
    if key not in _PROBED:
        _PROBED[key] = _probe(module)
    return _PROBED[key]


def _lean_forward(
    module: nn.Module, dtypes: frozenset[torch.dtype]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A drop-in ``forward`` for ``module``: the lean gate for the probed ``dtypes``."""
    original = type(module).forward
    act_type: Any = type(module.act_fn)

    def forward(x: torch.Tensor) -> torch.Tensor:
        m = cast(Any, module)
        if x.dtype not in dtypes or type(m.act_fn) is not act_type or _autocast(x):
            out: torch.Tensor = original(module, x)
            return out
        gate, up = m.gate_proj(x), m.up_proj(x)
        if gate.dtype not in dtypes or gate.dtype != up.dtype or gate.shape != up.shape:
            y: torch.Tensor = m.down_proj(m.act_fn(gate) * up)  # the class's formula
            return y
        lean: torch.Tensor = m.down_proj(silu_mul(gate, up))
        return lean

    forward.lean_swiglu_of = original  # type: ignore[attr-defined]
    return forward


def _mlps(model: nn.Module) -> list[nn.Module]:
    """``model``'s gated MLP modules (found once per model)."""
    if model not in _MLPS:
        _MLPS[model] = [m for m in model.modules() if _is_gated_mlp(m)]
    return _MLPS[model]


@contextlib.contextmanager
def lean_swiglu(model: nn.Module, enabled: bool = True) -> Iterator[int]:
    """Run ``model``'s forwards (and their backwards) inside the block with the lean SwiGLU.

    Yields how many modules were swapped (0 when ``enabled`` is False or none qualifies).
    The swap sets an instance ``forward`` on each gated MLP module whose class forward passes
    the probe, and removes it on exit; a module that already has an instance ``forward`` (an
    enclosing block's, or a hook library's such as accelerate's) is left alone. With
    activation checkpointing keep the backward inside the block too (see
    :func:`rl_adapters.lean_norm.lean_rms_norm`): the recomputed forward must save the same
    tensors.
    """

    def build(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        dtypes = _lean_dtypes(module)
        return _lean_forward(module, dtypes) if dtypes else None

    with instance_forwards(_mlps(model) if enabled else [], build, "lean_swiglu_of") as swapped:
        yield swapped
