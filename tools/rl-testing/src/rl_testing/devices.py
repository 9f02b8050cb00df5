"""Devices and dtypes for tests that run on CPU everywhere and on CUDA where there is a GPU.

A test takes its device from :data:`DEVICES` (or :func:`devices`) instead of hard-coding
``"cpu"``::

    @pytest.mark.parametrize("device", DEVICES)
    def test_fused_equals_full_logits(device: str) -> None: ...

The ``cuda`` case carries the ``cuda`` marker and, without a CUDA device, skips with
:data:`NO_CUDA` as its reason. ``nox -s gpu`` (``tools/gpu/run.py``) runs ``pytest -m cuda``
over the files in :data:`tools/gpu/run.py`'s list; the per-package sessions run the ``cpu``
cases and report the ``cuda`` ones as skipped. The dtypes a device's kernels are checked in
come from :func:`dtypes_for`; the tolerance for each from :mod:`rl_testing.tolerance`, which
scales with the dtype's epsilon (bfloat16's is 2**-7, float16's 2**-10).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

__all__ = ["CUDA", "DEVICES", "NO_CUDA", "devices", "dtypes_for", "needs_cuda", "synchronize"]

#: Whether this process sees a CUDA device.
CUDA: bool = torch.cuda.is_available()
#: The skip reason of a ``cuda`` case on a machine without one.
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False): runs in `nox -s gpu`"
#: Marks a test as CUDA-only: the ``cuda`` marker plus a skip with :data:`NO_CUDA` without one.
needs_cuda = pytest.mark.skipif(not CUDA, reason=NO_CUDA)


def devices(*, cuda: bool = True) -> list[Any]:
    """``pytest.param`` cases ``"cpu"`` and (unless ``cuda`` is False) ``"cuda"``.

    The ``cuda`` case has the ``cuda`` marker and skips with :data:`NO_CUDA` where there is no
    CUDA device.
    """
    params = [pytest.param("cpu", id="cpu")]
    if cuda:
        params.append(pytest.param("cuda", id="cuda", marks=(pytest.mark.cuda, needs_cuda)))
    return params


#: ``devices()``: the parametrisation most tests want.
DEVICES = devices()


def dtypes_for(device: str) -> list[torch.dtype]:
    """The dtypes a device's kernels are checked in.

    float32 on CPU; float32, bfloat16 and float16 on CUDA (the half types are what GPU training
    runs in).
    """
    if torch.device(device).type == "cuda":
        return [torch.float32, torch.bfloat16, torch.float16]
    return [torch.float32]


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on CPU): before reading a time or a peak."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
