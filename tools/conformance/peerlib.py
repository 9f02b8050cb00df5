"""Helpers shared by the peer scripts (run inside each peer's throwaway venv: torch only)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch

Out = dict[str, torch.Tensor]


def stub(*names: str, **attrs: Any) -> None:
    """Install empty modules (and parents) for GPU/launcher modules the math never touches."""
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            if key not in sys.modules:
                mod = types.ModuleType(key)
                mod.__path__ = []  # type: ignore[attr-defined]
                sys.modules[key] = mod
    for dotted, value in attrs.items():
        mod_name, _, attr = dotted.rpartition("__")
        setattr(sys.modules[mod_name.replace("__", ".")], attr, value)


def with_grad(fn: Callable[[torch.Tensor], torch.Tensor], lp: torch.Tensor) -> Out:
    """{"value": fn(x), "grad": d value / d x} at x = lp (float64 leaf)."""
    x = lp.detach().clone().requires_grad_(True)
    value = fn(x)
    (g,) = torch.autograd.grad(value, x, allow_unused=True)
    return {"value": value.detach(), "grad": torch.zeros_like(x) if g is None else g}


def main(run: Callable[[dict[str, torch.Tensor], int], dict[str, Out]]) -> None:
    """argv: inputs.pt out.pt. Runs ``run(batch, G)`` for every batch, saves {case@G: out}."""
    torch.set_default_dtype(torch.float64)
    batches = torch.load(sys.argv[1])
    results: dict[str, Out] = {}
    for key, b in batches.items():
        for case, out in run(b, int(key[1:])).items():
            results[f"{case}@{key}"] = {k: v.detach().to(torch.float64) for k, v in out.items()}
    torch.save(results, sys.argv[2])
