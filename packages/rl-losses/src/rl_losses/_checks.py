"""Input validation: every error names the argument, shows shapes, and says what to do."""

from __future__ import annotations

import torch


def shape_str(t: torch.Tensor) -> str:
    """``[3, 4]``-style rendering of a tensor's shape."""
    return str(list(t.shape))


def check_tensor(name: str, x: object) -> torch.Tensor:
    """Raise ``TypeError`` unless ``x`` is a tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_2d(name: str, x: torch.Tensor, doc: str = "[N, T]") -> None:
    """Raise unless ``x`` has two dimensions."""
    check_tensor(name, x)
    if x.ndim != 2:
        raise ValueError(f"`{name}` must have shape {doc}, got shape {shape_str(x)}")


def check_same_shape(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Raise unless ``x`` has the shape of ``ref``; the message shows both shapes."""
    check_tensor(name, x)
    if x.shape != ref.shape:
        raise ValueError(
            f"`{name}` has shape {shape_str(x)} but `{ref_name}` has shape {shape_str(ref)}; "
            "they must match"
        )


def check_float(name: str, x: torch.Tensor) -> None:
    """Raise unless ``x`` is a floating-point tensor (an integer or bool one is refused)."""
    check_tensor(name, x)
    if not x.is_floating_point():
        raise ValueError(
            f"`{name}` must be a floating-point tensor, got {x.dtype}; convert with .float()"
        )


def as_mask(
    mask: torch.Tensor, like_name: str, like: torch.Tensor, weights_name: str | None = None
) -> torch.Tensor:
    """Validate ``mask`` against ``like`` and return it as bool (True = counts).

    A bool mask is returned as is; an integer or floating-point one must hold only 0 and 1
    (one host synchronisation), so a weight is never silently counted as a whole token.
    ``weights_name`` is the caller's per-token weights argument, named in the error.
    """
    check_same_shape("mask", mask, like_name, like)
    if mask.dtype == torch.bool:
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        hint = f"; for per-token weights pass `{weights_name}`" if weights_name else ""
        raise ValueError(
            f"`mask` must be bool (True where the token counts) or 0/1, got a {mask.dtype} "
            f"mask with other values{hint}"
        )
    return mask != 0


def check_finite(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    """Raise unless ``x`` is finite wherever ``mask`` is True (masked values are ignored)."""
    if not x.is_floating_point() or bool(torch.isfinite(x.detach()).all()):
        return  # the common case in one pass: everything finite, masked or not
    bad = mask & ~torch.isfinite(x.detach())
    if bool(bad.any()):
        first = bad.nonzero()[0].tolist()
        raise ValueError(
            f"`{name}` has {int(bad.sum())} non-finite value(s) at valid positions (first at "
            f"{first}); check the forward pass (fp16 overflow?) or mask those tokens out"
        )


def zero_fill(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with masked entries replaced by 0 (NaN-safe, zero gradient there)."""
    if x.is_floating_point():  # a Python zero: no 0-dim tensor made per call
        return torch.where(mask, x, 0.0)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {options}; got {value!r}")


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim: the largest ``x`` where ``mask`` is True, 0 where it is True nowhere.

    Decided on the device (no host synchronisation, which costs a GPU stall per call).
    """
    if x.numel() == 0:
        return x.new_zeros(())
    big = torch.where(mask, x, float("-inf")).amax()
    return torch.where(mask.any(), big, big.new_zeros(()))
