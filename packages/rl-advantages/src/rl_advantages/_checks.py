"""Input validation shared by the estimators: every error names the argument and the fix."""

from __future__ import annotations

from typing import Literal

import torch

NonFinite = Literal["raise", "mask"]


def shape_str(t: torch.Tensor) -> str:
    """``[3, 4]``-style rendering of a tensor's shape for error messages."""
    return str(list(t.shape))


def check_tensor(name: str, x: object) -> torch.Tensor:
    """Raise unless ``x`` is a tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_ndim(name: str, x: torch.Tensor, ndim: int, shape_doc: str) -> None:
    """Raise unless ``x`` has ``ndim`` dimensions (``shape_doc`` names them, e.g. ``[N, T]``)."""
    if x.ndim != ndim:
        raise ValueError(f"`{name}` must have shape {shape_doc}, got shape {shape_str(x)}")


def check_same_shape(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Raise unless ``x`` has the shape of ``ref``, naming both and showing both shapes."""
    if x.shape != ref.shape:
        raise ValueError(
            f"`{name}` has shape {shape_str(x)} but `{ref_name}` has shape {shape_str(ref)}; "
            "they must match"
        )


def float_dtype(*xs: torch.Tensor | None) -> torch.dtype:
    """The dtype the estimators compute in for the value tensors ``xs`` (None entries skipped).

    The package's one dtype rule: an integer or bool tensor counts as torch's default float
    dtype (0/1 correctness rewards are valid input), and the float dtypes combine with
    ``torch.promote_types`` (float32 rewards with float64 values compute in float64).
    """
    dtype: torch.dtype | None = None
    for x in xs:
        if x is None:
            continue
        d = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        dtype = d if dtype is None else torch.promote_types(dtype, d)
    return torch.get_default_dtype() if dtype is None else dtype


def as_float(x: torch.Tensor, *others: torch.Tensor | None) -> torch.Tensor:
    """``x`` in :func:`float_dtype` of itself and ``others`` (``x`` itself when already so)."""
    return x.to(float_dtype(x, *others))


def bool_mask(name: str, mask: torch.Tensor, weights: str | None = None) -> torch.Tensor:
    """``mask`` as bool: a bool mask as is, a 0/1 integer or float mask converted.

    Any other value (0.5, -1, NaN) raises: a mask is not a weight. ``weights`` names the
    function's weight argument for the message, if it has one.
    """
    if mask.dtype == torch.bool:
        return mask
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        fix = f"pass weights as `{weights}`" if weights else "weight the rewards instead"
        raise ValueError(
            f"`{name}` holds {mask[bad].flatten()[0].item()}, but masks are bool: True where the "
            f"element counts (0/1 integers or floats are accepted); {fix}"
        )
    return mask != 0


def as_mask(
    name: str,
    mask: torch.Tensor | None,
    like_name: str,
    like: torch.Tensor,
    weights: str | None = None,
) -> torch.Tensor:
    """A bool mask of ``like``'s shape (all True when ``mask`` is None); True = counts.

    A non-bool ``mask`` must hold only 0 and 1 (:func:`bool_mask`).
    """
    if mask is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    check_tensor(name, mask)
    check_same_shape(name, mask, like_name, like)
    return bool_mask(name, mask, weights)


def check_finite_values(
    name: str, x: torch.Tensor, mask: torch.Tensor, nonfinite: NonFinite
) -> torch.Tensor:
    """Check ``x`` is finite where ``mask`` is True; return the (possibly narrowed) mask.

    With ``nonfinite="raise"`` a NaN or infinite value at a valid position raises a
    ``ValueError`` naming ``name``; with ``"mask"`` such positions are dropped from the mask.
    Values at invalid positions are never inspected.
    """
    if nonfinite not in ("raise", "mask"):
        raise ValueError(f"`nonfinite` must be 'raise' or 'mask', got {nonfinite!r}")
    if not x.is_floating_point():
        return mask
    bad = mask & ~torch.isfinite(x)
    if nonfinite == "mask":
        return mask & ~bad
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ValueError(
            f"`{name}` has {int(bad.sum())} non-finite value(s) at valid positions (first at "
            f"index {where}); fix the reward source, or pass nonfinite='mask' to treat them as "
            "masked"
        )
    return mask


def check_group_size(name: str, n: int, group_size: int) -> int:
    """Validate a group size G for ``n`` rows laid out as contiguous groups; return B = n / G."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"`group_size` must be an int, got {type(group_size).__name__}")
    if group_size < 2:
        raise ValueError(
            f"`group_size` must be >= 2 for a group baseline, got {group_size}; sample at least "
            "two completions per prompt"
        )
    if n == 0:
        raise ValueError(f"`{name}` is empty (N = 0): there is nothing to estimate")
    if n % group_size != 0:
        raise ValueError(
            f"`{name}` has N = {n} rows, not divisible by `group_size` = {group_size}; rows must "
            "come as contiguous groups of G samples per prompt"
        )
    return n // group_size


def check_unit_interval(name: str, value: float) -> None:
    """Raise unless ``0 <= value <= 1``."""
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"`{name}` must be in [0, 1], got {value}")


def check_nonnegative(name: str, value: float) -> None:
    """Raise unless ``value >= 0``."""
    if not float(value) >= 0.0:
        raise ValueError(f"`{name}` must be >= 0, got {value}")
