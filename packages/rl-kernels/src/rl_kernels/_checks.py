"""Input validation for the kernels; every error names the argument."""

from __future__ import annotations

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
