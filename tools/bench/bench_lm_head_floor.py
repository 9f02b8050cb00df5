"""Plain lm_head -> log-prob (forward + backward) against its physical floor.

The plain path materialises the logits [M, V], takes log_softmax and gathers the targets; the
floor is the three bare GEMMs any exact method must do (forward ``hidden @ W.T``, backward
``dlogits @ W`` and ``dlogits.T @ hidden``) into preallocated buffers. The fused kernels of
rl-kernels will be added as variants of the same cases.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from harness import Row, measure, with_ratios

CASES = [(512, 64, 1024), (2048, 128, 4096)]  # (M tokens, H hidden, V vocabulary)


def _case(M: int, H: int, V: int, gen: torch.Generator) -> tuple[Callable[[], None], ...]:
    """The plain path and the floor for one shape, as zero-argument callables."""
    hidden = torch.randn(M, H, generator=gen, requires_grad=True)
    weight = torch.randn(V, H, generator=gen, requires_grad=True)
    targets = torch.randint(0, V, (M,), generator=gen)

    def plain() -> None:
        logits = hidden @ weight.T
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
        torch.autograd.grad(logp.sum(), (hidden, weight))

    logits_buf = torch.empty(M, V)
    dlogits = torch.randn(M, V, generator=gen)
    grad_h = torch.empty(M, H)
    grad_w = torch.empty(V, H)
    h, w = hidden.detach(), weight.detach()

    def floor() -> None:
        torch.mm(h, w.T, out=logits_buf)
        torch.mm(dlogits, w, out=grad_h)
        torch.mm(dlogits.T, h, out=grad_w)

    return plain, floor


def run(quick: bool) -> list[Row]:
    repeats, warmup = (3, 1) if quick else (15, 3)
    rows: list[Row] = []
    gen = torch.Generator().manual_seed(0)
    for M, H, V in CASES:
        case = f"M={M} H={H} V={V} fp32"
        plain, floor = _case(M, H, V, gen)
        for name, fn in (("plain", plain), ("floor", floor)):
            timing = measure(fn, repeats=repeats, warmup=warmup)
            rows.append(Row("lm_head_floor", case, name, timing))
    return with_ratios(rows, baseline="plain", floor="floor")
