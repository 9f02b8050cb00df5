"""Seeded initialisation that leaves the caller's random state untouched.

``torch.random.fork_rng(devices=[])`` restores only the CPU generator, while
``torch.manual_seed`` reseeds the CPU generator and every CUDA generator (queued until CUDA
initialises, if it has not yet): the caller's CUDA random state would change. :func:`seeded`
seeds exactly the generators it restores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["seeded"]


def _cuda_devices(modules: tuple[nn.Module, ...]) -> list[int]:
    found = {
        t.device.index if t.device.index is not None else torch.cuda.current_device()
        for m in modules
        for t in [*m.parameters(), *m.buffers()]
        if t.device.type == "cuda"
    }
    return sorted(found)


@contextlib.contextmanager
def seeded(seed: int, *modules: nn.Module) -> Iterator[None]:
    """Run the body with the CPU generator seeded with ``seed``; restore it after.

    The CUDA generators of the devices that ``modules``' parameters and buffers live on (an
    initialisation of new weights there draws from them) are seeded and restored too; no other
    generator is touched.
    """
    devices = _cuda_devices(modules)
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        for index in devices:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield
