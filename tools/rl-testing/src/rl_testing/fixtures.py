"""Pytest fixtures shared by the packages' conftest files (import them there to activate)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

__all__ = ["single_torch_thread"]


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Run each test with one intra-op torch thread, restoring the previous count after.

    On a loaded 2-core runner the thread hand-offs of tiny tensors cost more than the
    arithmetic, and a fixed thread count keeps CPU results bit-reproducible between runs.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
