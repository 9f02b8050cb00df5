"""Several processes (``torchrun`` / ``accelerate launch``): barriers, global means, ranks.

Every process trains on its shard; only process 0 writes metrics, curves and checkpoint
pointers, and the metrics it logs are means over processes. With one process every function
here is a no-op.
"""

from __future__ import annotations

import torch
from rl_algos.distributed import is_main_process, world_size

__all__ = [
    "any_process",
    "barrier",
    "distributed",
    "global_mean",
    "is_main_process",
    "rank",
    "world_size",
]


def distributed() -> bool:
    """Whether more than one process trains."""
    return world_size() > 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return torch.distributed.get_rank() if distributed() else 0


def barrier() -> None:
    """Wait for every process (no-op with one)."""
    if distributed():
        torch.distributed.barrier()


def global_mean(row: dict[str, float], device: torch.device) -> dict[str, float]:
    """``row``'s values averaged over processes.

    Args:
        row: Metric values; every process must hold the same keys.
        device: Where the collective runs (the agent's device).

    Returns:
        The averaged row (``row`` itself with one process).
    """
    if not distributed():
        return row
    keys = sorted(row)
    t = torch.tensor([float(row[k]) for k in keys], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    t /= world_size()
    return dict(zip(keys, t.tolist(), strict=True))


def any_process(flag: bool, device: torch.device | str) -> bool:
    """Whether ``flag`` is true on any process (``flag`` itself with one).

    Args:
        flag: This process's value.
        device: Where the collective runs (the agent's device).

    Returns:
        The logical or over processes.
    """
    if not distributed():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)
