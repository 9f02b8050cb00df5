"""The learner's AdamW: PyTorch's fused kernel where it serves every parameter, and the same
update as the per-parameter loop it replaces."""

from __future__ import annotations

import torch
from rl_algos.learner import Learner, fused_adamw


def params(seed: int, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(8, 64), (128, 8), (8, 128), (64, 8), (64,)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=dtype)) for s in shapes]


def test_fused_where_every_parameter_is_served() -> None:
    assert fused_adamw([{"params": params(0)}], deepspeed=False) is True
    assert fused_adamw([{"params": params(0, torch.float64)}], deepspeed=False) is True
    assert fused_adamw([{"params": params(0)}], deepspeed=True) is None  # DeepSpeed steps
    assert fused_adamw([{"params": []}], deepspeed=False) is None
    learner = Learner([{"params": params(0)}], lr=1e-3, max_grad_norm=1.0, schedule=None)
    assert learner.optimizer.defaults["fused"] is True


def test_fused_update_equals_the_per_parameter_loop() -> None:
    fused, loop = params(1), params(1)
    opt_fused = torch.optim.AdamW(fused, lr=1e-3, weight_decay=0.0, fused=True)
    opt_loop = torch.optim.AdamW(loop, lr=1e-3, weight_decay=0.0, foreach=False)
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        grads = [torch.randn(p.shape, generator=gen) for p in fused]
        for a, b, g in zip(fused, loop, grads, strict=True):
            a.grad, b.grad = g.clone(), g.clone()
        opt_fused.step()
        opt_loop.step()
    for a, b in zip(fused, loop, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
