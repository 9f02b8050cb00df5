"""Input validation for the kernels; every error names the argument."""

from __future__ import annotations

import numbers

import torch


def shape_str(t: torch.Tensor) -> str:
    """``[3, 4]``-style rendering of a shape."""
    return str(list(t.shape))


def check_projection(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> None:
    """Validate ``hidden [..., H]``, ``weight [V, H]``, ``bias [V]`` and ``temperature``."""
    for name, x in (("hidden", hidden), ("weight", weight)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"`{name}` must be a floating-point tensor, got {x.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"`weight` must have shape [V, H], got {shape_str(weight)}")
    if hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"`hidden` has shape {shape_str(hidden)} but `weight` has shape {shape_str(weight)}; "
            "the hidden size H (last dim of hidden, second of weight) must match"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"`bias` must have shape [V] = [{weight.shape[0]}], got {shape_str(bias)}")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature}")


def check_targets(
    targets: torch.Tensor, vocab_size: int, valid: torch.Tensor | None
) -> torch.Tensor:
    """The targets as int64 ids; raise unless the (valid) targets are integer ids in ``[0, V)``.

    Any integer dtype is accepted (int32 ids from a tokenizer included) and returned as int64,
    the index dtype every supported torch's ``gather`` and ``index_select`` take (torch 2.4 takes
    no other).
    """
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"`targets` must be integer token ids, got {targets.dtype}")
    t = targets if valid is None else targets[valid]
    if not t.numel():
        return targets.long()
    low, high = (int(v) for v in torch.aminmax(t))  # one pass
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"`targets` must be in [0, V) = [0, {vocab_size}) at valid positions, got values in "
            f"[{low}, {high}]"
        )
    return targets.long()


def check_finite_rows(h: torch.Tensor) -> None:
    """Raise unless a chunk of hidden rows is finite."""
    if not bool(torch.isfinite(h).all()):
        raise ValueError(
            "`hidden` holds non-finite values at valid rows; check the forward pass (fp16 "
            "overflow?) or mask those tokens out"
        )


def check_vocab_chunk(vocab_chunk: int | None, vocab: int) -> int:
    """``vocab_chunk`` as a tile width (0: whole rows, for None or a width >= V)."""
    if vocab_chunk is None:
        return 0
    if isinstance(vocab_chunk, bool) or not isinstance(vocab_chunk, int) or vocab_chunk < 1:
        raise ValueError(
            f"`vocab_chunk` must be a positive number of vocabulary columns or None, got "
            f"{vocab_chunk!r}"
        )
    return 0 if vocab_chunk >= vocab else vocab_chunk


def check_chunk_rows(chunk_rows: int | None) -> None:
    """Raise unless ``chunk_rows`` is None or a positive int (a float or bool is refused)."""
    if chunk_rows is None:
        return
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, numbers.Integral):
        raise ValueError(
            f"`chunk_rows` must be a positive int (rows per chunk) or None, got {chunk_rows!r}"
        )
    if chunk_rows < 1:
        raise ValueError(f"`chunk_rows` must be >= 1, got {chunk_rows}")


def check_float(name: str, x: torch.Tensor) -> None:
    """Raise unless ``x`` is a floating-point tensor (an integer or bool one is refused)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
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
    ``weights_name`` is the caller's per-token weights argument, named in the error. The same
    rule and message as rl-losses' masks.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"`mask` must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != like.shape:
        raise ValueError(
            f"`mask` has shape {shape_str(mask)} but `{like_name}` has shape {shape_str(like)}; "
            "they must match"
        )
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
    """Raise unless ``x`` is finite wherever ``mask`` is True (masked values are ignored).

    The same message as rl-losses' check of the same input.
    """
    if bool(torch.isfinite(x.detach()).all()):
        return  # the common case in one pass: everything finite, masked or not
    bad = mask & ~torch.isfinite(x.detach())
    if bool(bad.any()):
        first = bad.nonzero()[0].tolist()
        raise ValueError(
            f"`{name}` has {int(bad.sum())} non-finite value(s) at valid positions (first at "
            f"{first}); check the forward pass (fp16 overflow?) or mask those tokens out"
        )
