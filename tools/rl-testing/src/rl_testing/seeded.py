"""Deterministic random test inputs keyed by a description (torch only)."""

from __future__ import annotations

import zlib

import torch

__all__ = ["ROW_KINDS", "gen", "make_mask", "rand", "randint"]

#: The row patterns ``make_mask`` cycles through.
ROW_KINDS = ("empty", "single", "prefix", "holes", "full")


def gen(*key: object) -> torch.Generator:
    """A generator seeded from ``repr(key)``: the same key gives the same draws."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randint(g: torch.Generator, low: int, high: int) -> int:
    """Uniform integer in [low, high)."""
    return int(torch.randint(low, high, (1,), generator=g).item())


def rand(g: torch.Generator) -> float:
    """Uniform float in [0, 1)."""
    return float(torch.rand((), generator=g, dtype=torch.float64))


def make_mask(g: torch.Generator, n: int, t: int) -> torch.Tensor:
    """[n, t] bool; consecutive rows cycle through empty / single / prefix / holes / full."""
    offset = randint(g, 0, len(ROW_KINDS))
    rows = []
    for i in range(n):
        kind = ROW_KINDS[(i + offset) % len(ROW_KINDS)]
        if kind == "empty":
            row = [False] * t
        elif kind == "single":
            p = randint(g, 0, t)
            row = [s == p for s in range(t)]
        elif kind == "prefix":
            length = randint(g, 1, t + 1)
            row = [s < length for s in range(t)]
        elif kind == "holes":
            row = [bool(b) for b in (torch.rand(t, generator=g) < 0.6).tolist()]
            if t >= 3:  # a hole between two valid tokens
                row[0], row[1], row[-1] = True, False, True
        else:
            row = [True] * t
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(n, t)
