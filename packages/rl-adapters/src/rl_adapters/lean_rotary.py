r"""A lean rotary position embedding for the training and scoring forwards: the same numbers.

transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` (Llama, Qwen2, Qwen3,
Mistral and most decoders since) computes, for the query and for the key,

.. math:: \mathrm{RoPE}(x) = x \odot \cos + \mathrm{rotate\_half}(x) \odot \sin, \qquad
          \mathrm{rotate\_half}([x_1, x_2]) = [-x_2, x_1]

(RoFormer, arXiv:2104.09864, eq. 34, in GPT-NeoX's half-split layout) as seven operations,
four of them full-size temporaries (``-x_2``, the concatenation, two products), and autograd's
backward through them runs about ten more (two products, a negation, two zero-filled slice
gradients and their sums). :func:`rotary_embedding` computes the same thing as five operations
each way, with one autograd node that saves only ``cos`` and ``sin``:

* forward: ``y = x * cos``; ``y_1 -= x_2 * sin_1``; ``y_2 += x_1 * sin_2``;
* backward (``g = dL/dy``): ``dx = g * cos``; ``dx_1 += g_2 * sin_2``; ``dx_2 -= g_1 * sin_1``.

Where ``cos`` and ``sin`` broadcast over a dimension that lies inside ``x`` in memory (the heads
of the attention layers' transposed queries and keys, [N, heads, T, D] stored as
[N, T, heads, D]), they are first copied out in ``x``'s memory order, so that each
elementwise kernel runs over long contiguous stretches instead of D elements at a time.

Each element is the same two rounded products and one rounded sum as transformers' (``a + (-b)``
is ``a - b`` in IEEE arithmetic, and the zero-filled slice gradients add exact zeros), so the
values and the gradients are equal bit for bit (up to the sign of a zero).

:func:`lean_rotary` swaps the lean version into a model's modeling modules for the length of a
``with`` block, only where the module's own ``apply_rotary_pos_emb`` has the standard signature
and gives bit-equal results on a probe in fp32, fp64, bf16 and fp16 (checked once per
function): partial or interleaved rotary variants, or a function a kernel library replaced,
are left alone; a call the lean path does not cover (mixed dtypes, a partial rotary) runs the
original. Inside the block the
module function is replaced process-wide (as Liger-Kernel's patches are), by one that computes
the same numbers; the original is restored on exit.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from rl_adapters import _compat
from rl_adapters.lean_report import LeanFallback, LeanSwap, count_swap, group_fallbacks

__all__ = ["lean_rotary", "rotary_embedding", "survey"]

_STANDARD = ("q", "k", "cos", "sin", "unsqueeze_dim")
_SWAP_NAME = "apply_rotary_pos_emb"


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.shape[-1] % 2:
        raise ValueError(f"rotary needs an even last dimension, got x {tuple(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[-1] != x.shape[-1]:
            raise ValueError(
                f"`{name}` {tuple(t.shape)} must end in x's last dimension {x.shape[-1]}"
                f" (x {tuple(x.shape)})"
            )


def _plain(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The formula as transformers writes it: separate operations, autograd through each."""
    d = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., d:], x[..., :d]), dim=-1) * sin


def _lean_applies(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the lean path covers these inputs.

    It does for one dtype, an even last dimension shared by all three, and ``cos``/``sin``
    that broadcast to ``x`` without enlarging it and need no gradient.
    """
    size = x.shape[-1]
    if size % 2 or cos.shape[-1] != size or sin.shape[-1] != size:
        return False
    if cos.requires_grad or sin.requires_grad or not x.dtype == cos.dtype == sin.dtype:
        return False
    return _fits(cos.shape, x.shape) and _fits(sin.shape, x.shape)


def _fits(shape: torch.Size, into: torch.Size) -> bool:
    """Whether ``shape`` broadcasts to ``into`` without enlarging it."""
    if len(shape) > len(into):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(into), strict=False))


def _crosses(t: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``t`` broadcasts over a dimension of ``x`` that lies inside (has a smaller stride
    than) a dimension ``t`` spans: an elementwise kernel over ``x`` and ``t`` then runs over
    short stretches (``cos`` [N, 1, T, D] over ``q`` [N, heads, T, D] in memory order
    [N, T, heads, D]: stretches of D elements).
    """  # noqa: D205
    if t.dim() != x.dim() or x.shape[0] == 0 or t.shape[0] not in (1, x.shape[0]):
        return False
    spanned = [x.stride(i) for i in range(x.dim()) if t.shape[i] > 1]
    widest = max(spanned, default=0)
    return any(t.shape[i] == 1 < x.shape[i] and x.stride(i) < widest for i in range(1, x.dim()))


def _laid_out_like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``t`` materialised over every dimension of ``x`` but the first, in ``x``'s memory order.

    The same values as ``t`` broadcast, so each product is unchanged bit for bit; the
    elementwise kernels then run over stretches as long as ``x``'s (``docs/benchmarks.md``,
    "How we got here"). Used where :func:`_crosses` holds.
    """
    out = torch.empty_like(x.narrow(0, 0, t.shape[0]))  # x's strides where x is dense
    return out.copy_(t.expand(out.shape))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, or its transpose (``sign`` -1, the backward)."""
    d = x.shape[-1] // 2
    if _crosses(cos, x):
        cos = _laid_out_like(cos, x)
    if _crosses(sin, x):
        sin = _laid_out_like(sin, x)
    sin_1, sin_2 = _halves(sin)
    y = x * cos
    if sign > 0:
        y.narrow(-1, 0, d).sub_(x.narrow(-1, d, d) * sin_1)
        y.narrow(-1, d, d).add_(x.narrow(-1, 0, d) * sin_2)
    else:
        y.narrow(-1, 0, d).add_(x.narrow(-1, d, d) * sin_2)
        y.narrow(-1, d, d).sub_(x.narrow(-1, 0, d) * sin_1)
    return y


class _Rotary(torch.autograd.Function):
    """``x * cos + rotate_half(x) * sin`` as one node; ``cos`` and ``sin`` get no gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, -1), None, None


def _lean(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The lean rotary of ``x`` (``_lean_applies`` holds)."""
    if torch.is_grad_enabled() and x.requires_grad:
        out: torch.Tensor = _Rotary.apply(x, cos, sin)
        return out
    return _rotate(x, cos, sin, 1)


def _halves(sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = sin.shape[-1] // 2
    return sin.narrow(-1, 0, d), sin.narrow(-1, d, sin.shape[-1] - d)


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r"""Rotary position embedding ``x * cos + rotate_half(x) * sin`` (half-split layout).

    Args:
        x: [..., D] queries or keys (e.g. [N, heads, T, D]), D even.
        cos: [..., D] cosines, broadcastable to ``x`` (e.g. [N, 1, T, D]).
        sin: [..., D] sines, like ``cos``.

    Returns:
        [..., D] (``x``'s shape and dtype), differentiable w.r.t. ``x``; bit-equal to
        transformers' formula in values and gradient. Where ``cos`` or ``sin`` needs a gradient
        or is larger than ``x``, or the dtypes differ, the formula runs as separate operations
        (autograd through them).

    Raises:
        ValueError: an odd D, or ``cos``/``sin`` not ending in D.
    """
    _check(x, cos, sin)
    if not _lean_applies(x, cos, sin):
        return _plain(x, cos, sin)
    return _lean(x, cos, sin)


Rope = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _lean_version(original: Rope) -> Rope:
    """A drop-in for ``original`` (transformers' standard ``apply_rotary_pos_emb``).

    ``q`` [N, heads, T, D] and ``k`` [N, kv_heads, T, D] (with ``unsqueeze_dim=1``); ``cos``
    and ``sin`` [N, T, D], unsqueezed at ``unsqueeze_dim``. A call the lean path does not
    cover (other dtypes, a partial rotary, ``cos`` needing a gradient) runs ``original``.
    """

    def apply_rotary_pos_emb(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        if not (_lean_applies(q, c, s) and _lean_applies(k, c, s)):
            return original(q, k, cos, sin, unsqueeze_dim)
        return _lean(q, c, s), _lean(k, c, s)

    apply_rotary_pos_emb.lean_rotary_of = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


_LEAN: dict[Callable[..., Any], Rope | None] = {}
_LOCK = threading.Lock()
_PROBE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _lean_for(fn: Any) -> Rope | None:
    """The lean drop-in for ``fn``, or None where ``fn`` is not transformers' standard rotary.

    Standard: its signature, and our numbers bit for bit on a probe in each float dtype
    (decided once per function).
    """
    if not callable(fn) or hasattr(fn, "lean_rotary_of"):
        return None
    if fn not in _LEAN:
        _LEAN[fn] = _lean_version(fn) if _probe(fn) else None
    return _LEAN[fn]


def _probe(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if tuple(params) != _STANDARD or params["unsqueeze_dim"].default != 1:
        return False
    gen = torch.Generator().manual_seed(0)
    shapes = ((2, 3, 5, 8), (2, 1, 5, 8), (2, 5, 8), (2, 5, 8))
    for dtype in _PROBE_DTYPES:
        q, k, cos, sin = (torch.randn(shape, generator=gen).to(dtype) for shape in shapes)
        try:
            with torch.no_grad():
                want = fn(q, k, cos, sin)
        except Exception:  # a variant that cannot take the standard shapes: not ours to replace
            return False
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        got = (rotary_embedding(q, c, s), rotary_embedding(k, c, s))
        if not (isinstance(want, tuple) and len(want) == 2):
            return False
        if not all(
            isinstance(w, torch.Tensor) and torch.equal(w, g)
            for w, g in zip(want, got, strict=True)
        ):
            return False
    return True


_MODULES: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()


def _modeling_modules(model: nn.Module) -> list[Any]:
    """The Python modules defining ``model``'s submodule classes that hold a rotary function.

    Found once per model (a model's classes do not change).
    """
    if model not in _MODULES:
        names = {type(m).__module__ for m in model.modules()}
        found = [sys.modules.get(n) for n in sorted(names)]
        _MODULES[model] = [
            m
            for m in found
            if m is not None and _compat.read(m, _SWAP_NAME, None, library="transformers")
        ]
    return _MODULES[model]


def survey(model: nn.Module) -> tuple[LeanSwap, list[LeanFallback]]:
    """The modeling modules whose rotary :func:`lean_rotary` swaps, and the others (and why).

    For the policy's :class:`~rl_adapters.lean_report.LeanReport`.
    """
    lean: list[str] = []
    fell: list[tuple[str, str, bool]] = []
    modules = _modeling_modules(model)
    with _LOCK:
        for module in modules:
            fn = _compat.read(module, _SWAP_NAME, None, library="transformers")
            if hasattr(fn, "lean_rotary_of") or _lean_for(fn) is not None:
                lean.append(module.__name__)
            else:
                reason = (
                    f"{_SWAP_NAME} is not the standard rotary (signature or bit-equality probe)"
                )
                fell.append((module.__name__, reason, False))
    if not modules:
        fell.append((type(model).__name__, f"no modeling module defines {_SWAP_NAME}", False))
    return count_swap("rotary", lean), group_fallbacks("rotary", fell)


@contextlib.contextmanager
def lean_rotary(model: nn.Module, enabled: bool = True) -> Iterator[list[str]]:
    """Run ``model``'s forwards (and their backwards) inside the block with the lean rotary.

    Yields the names of the modeling modules swapped (empty when none qualifies or
    ``enabled`` is False). Re-entrant: a module already swapped by an enclosing block is left
    to it. With activation checkpointing, keep the backward inside the block too: a
    checkpointed layer recomputes its forward during the backward, and torch's non-reentrant
    checkpoint raises ``CheckpointError`` when the recomputation (with the original function,
    after the block) saves other tensors than the forward did.
    """
    swapped: list[tuple[Any, Any]] = []
    if enabled:
        with _LOCK:
            for module in _modeling_modules(model):
                original = _compat.read(module, _SWAP_NAME, None, library="transformers")
                lean = _lean_for(original)
                if lean is not None:
                    setattr(module, _SWAP_NAME, lean)
                    swapped.append((module, original))
    try:
        yield [m.__name__ for m, _ in swapped]
    finally:
        with _LOCK:
            for module, original in reversed(swapped):
                setattr(module, _SWAP_NAME, original)
