"""Set a drop-in ``forward`` on modules for the length of a ``with`` block (the lean modules)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

from torch import nn

__all__ = ["instance_forwards"]

#: One lock for every swap: the probes' caches and the modules' ``__dict__`` entries.
LOCK = threading.Lock()


@contextlib.contextmanager
def instance_forwards(
    modules: Iterable[nn.Module],
    build: Callable[[nn.Module], Callable[..., object] | None],
    marker: str,
) -> Iterator[int]:
    """Set ``build(module)`` as each module's instance ``forward`` for the block; yield how many.

    A module that already has an instance ``forward`` (an enclosing block's, or a hook
    library's such as accelerate's) is skipped before ``build`` runs; ``build`` returns None
    for a module to leave alone. On exit only the forwards that carry the attribute
    ``marker`` are removed, so a forward someone else set meanwhile stays.
    """
    swapped: list[nn.Module] = []
    with LOCK:
        for module in modules:
            if "forward" in module.__dict__:
                continue
            forward = build(module)
            if forward is not None:
                # what nn.Module.__setattr__ does for a value that is no parameter, buffer or
                # module, without its checks (this runs for every module at every forward)
                module.__dict__["forward"] = forward
                swapped.append(module)
    try:
        yield len(swapped)
    finally:
        with LOCK:
            for module in reversed(swapped):
                if hasattr(module.__dict__.get("forward"), marker):
                    del module.__dict__["forward"]
