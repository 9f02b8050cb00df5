"""The learner's AdamW: PyTorch's fused kernel where it serves every parameter."""

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
