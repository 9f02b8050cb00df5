"""Hypothesis strategies for RL tensors (torch + hypothesis only; no transformers).

Shape glossary: ``B`` prompts, ``G`` samples per prompt, ``N = B * G`` sequences (prompt-major:
sequence ``n = b * G + g``), ``T`` tokens per sequence, ``K`` turns.

Every tensor is built from drawn Python lists (never from raw bytes or numpy arrays), so
hypothesis shrinks failures to small, readable examples: masks shrink towards short prefixes,
rewards towards zero, layouts towards ``B = G = 1``.

* masks: ``bool`` tensors ``[N, T]``, ``True`` where a token counts (the completion / loss mask).
* turn ids: ``int64`` tensors ``[N, T]``, ``-1`` where the mask is ``False``; within a row the
  counted tokens form turns ``0, 1, ..., K-1`` in order; each turn is a contiguous run of ``True``
  (masked-out observation tokens may separate two turns; a run may hold several turns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import DrawFn, SearchStrategy

__all__ = [
    "group_layouts",
    "grouped_rewards",
    "mask_batches",
    "masks",
    "rewards",
    "turn_batches",
    "turn_ids_for",
]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgument(message)


def group_layouts(
    max_b: int = 4, max_g: int = 4, *, min_b: int = 1, min_g: int = 1
) -> SearchStrategy[tuple[int, int]]:
    """Draws a group layout ``(B, G)``.

    Args:
        max_b: Largest number of prompts ``B``.
        max_g: Largest number of samples per prompt ``G``.
        min_b: Smallest ``B`` (at least 1).
        min_g: Smallest ``G`` (at least 1; use 2 where a group std must exist).

    Returns:
        A strategy for ``(B, G)`` with ``min_b <= B <= max_b`` and ``min_g <= G <= max_g``.

    Raises:
        InvalidArgument: If a bound is below 1 or a minimum exceeds its maximum.
    """
    _check(1 <= min_b <= max_b, f"need 1 <= min_b <= max_b, got {min_b}, {max_b}")
    _check(1 <= min_g <= max_g, f"need 1 <= min_g <= max_g, got {min_g}, {max_g}")
    return st.tuples(st.integers(min_b, max_b), st.integers(min_g, max_g))


def _mask_row(t: int, *, allow_empty: bool, right_padded: bool) -> SearchStrategy[list[bool]]:
    if right_padded:
        return st.integers(0 if allow_empty else 1, t).map(
            lambda length: [True] * length + [False] * (t - length)
        )
    bits = st.lists(st.booleans(), min_size=t, max_size=t)
    if allow_empty:
        return bits

    def force(pair: tuple[list[bool], int]) -> list[bool]:
        row, pos = pair
        row = list(row)
        row[pos] = True
        return row

    return st.tuples(bits, st.integers(0, t - 1)).map(force)


def masks(
    n: int, t: int, *, allow_empty_rows: bool = False, right_padded: bool = True
) -> SearchStrategy[torch.Tensor]:
    """Draws a token mask of a fixed shape.

    Args:
        n: Number of sequences ``N``.
        t: Number of tokens ``T``.
        allow_empty_rows: Allow rows with no ``True`` (otherwise every row has at least one).
        right_padded: Each row is ``True`` on a prefix and ``False`` after it (a right-padded
            completion). When ``False``, rows are arbitrary boolean patterns.

    Returns:
        A strategy for a ``bool`` tensor of shape ``[N, T]``.

    Raises:
        InvalidArgument: If ``n < 0``, ``t < 0``, or ``t == 0`` while rows must be non-empty.
    """
    _check(n >= 0 and t >= 0, f"need n >= 0 and t >= 0, got {n}, {t}")
    _check(allow_empty_rows or n == 0 or t >= 1, "t must be >= 1 unless allow_empty_rows")
    row = _mask_row(t, allow_empty=allow_empty_rows, right_padded=right_padded)
    return st.lists(row, min_size=n, max_size=n).map(
        lambda rows: torch.tensor(rows, dtype=torch.bool).reshape(n, t)
    )


def mask_batches(
    max_n: int = 6,
    max_t: int = 12,
    *,
    min_n: int = 1,
    min_t: int = 1,
    allow_empty_rows: bool = False,
    right_padded: bool = True,
) -> SearchStrategy[torch.Tensor]:
    """Draws ``N`` and ``T``, then a mask of that shape (see :func:`masks`).

    Args:
        max_n: Largest ``N``.
        max_t: Largest ``T``.
        min_n: Smallest ``N`` (0 allowed).
        min_t: Smallest ``T`` (at least 1).
        allow_empty_rows: As in :func:`masks`.
        right_padded: As in :func:`masks`.

    Returns:
        A strategy for a ``bool`` tensor ``[N, T]``; read ``N, T`` from its shape.

    Raises:
        InvalidArgument: If the bounds are inconsistent.
    """
    _check(0 <= min_n <= max_n, f"need 0 <= min_n <= max_n, got {min_n}, {max_n}")
    _check(1 <= min_t <= max_t, f"need 1 <= min_t <= max_t, got {min_t}, {max_t}")
    return st.tuples(st.integers(min_n, max_n), st.integers(min_t, max_t)).flatmap(
        lambda nt: masks(nt[0], nt[1], allow_empty_rows=allow_empty_rows, right_padded=right_padded)
    )


_FLOAT_WIDTHS: dict[torch.dtype, Literal[16, 32, 64]] = {
    torch.float64: 64,
    torch.float32: 32,
    torch.float16: 16,
}


def rewards(
    shape: int | Sequence[int],
    *,
    min_value: float = -10.0,
    max_value: float = 10.0,
    dtype: torch.dtype = torch.float64,
    values: Sequence[float] | None = None,
) -> SearchStrategy[torch.Tensor]:
    """Draws a finite floating-point tensor (rewards, values, advantages, log-probs...).

    Args:
        shape: Tensor shape, e.g. ``N`` or ``(B, G)`` or ``(N, T)``.
        min_value: Smallest element.
        max_value: Largest element.
        dtype: Floating dtype of the result.
        values: When given, elements are drawn from these values only (e.g. ``(0.0, 1.0)`` for
            binary rewards, which makes ties and zero-variance groups common); ``min_value`` and
            ``max_value`` are then ignored.

    Returns:
        A strategy for a finite tensor of ``shape`` and ``dtype`` with elements in
        ``[min_value, max_value]`` (or in ``values``).

    Raises:
        InvalidArgument: If ``dtype`` is not floating, the bounds are inverted or not finite,
            ``values`` is empty, or a dimension is negative.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    _check(all(d >= 0 for d in dims), f"negative dimension in shape {dims}")
    _check(dtype.is_floating_point, f"dtype must be floating, got {dtype}")
    numel = 1
    for d in dims:
        numel *= d
    elements: SearchStrategy[float]
    if values is not None:
        _check(len(values) > 0, "values must not be empty")
        elements = st.sampled_from([float(v) for v in values])
    else:
        _check(
            -float("inf") < min_value <= max_value < float("inf"),
            f"need finite min_value <= max_value, got {min_value}, {max_value}",
        )
        elements = st.floats(
            min_value,
            max_value,
            allow_nan=False,
            allow_infinity=False,
            allow_subnormal=False,
            width=_FLOAT_WIDTHS.get(dtype, 32),
        )

    def build(xs: list[float]) -> torch.Tensor:
        out = torch.tensor(xs, dtype=torch.float64).reshape(dims).to(dtype)
        if values is None and dtype not in _FLOAT_WIDTHS:
            # bfloat16 etc.: rounding may step just outside the bounds.
            out = out.clamp(min_value, max_value)
        return out

    return st.lists(elements, min_size=numel, max_size=numel).map(build)


def grouped_rewards(
    max_b: int = 4,
    max_g: int = 4,
    *,
    min_g: int = 1,
    min_value: float = -10.0,
    max_value: float = 10.0,
    dtype: torch.dtype = torch.float64,
    values: Sequence[float] | None = None,
) -> SearchStrategy[tuple[int, int, torch.Tensor]]:
    """Draws a layout ``(B, G)`` (see :func:`group_layouts`) and rewards ``[N]`` for it.

    Args:
        max_b: Largest ``B``.
        max_g: Largest ``G``.
        min_g: Smallest ``G``.
        min_value: As in :func:`rewards`.
        max_value: As in :func:`rewards`.
        dtype: As in :func:`rewards`.
        values: As in :func:`rewards`.

    Returns:
        A strategy for ``(B, G, rewards)`` with ``rewards`` of shape ``[B * G]``, prompt-major.
    """
    return group_layouts(max_b, max_g, min_g=min_g).flatmap(
        lambda bg: rewards(
            bg[0] * bg[1], min_value=min_value, max_value=max_value, dtype=dtype, values=values
        ).map(lambda r: (bg[0], bg[1], r))
    )


def _runs(row: Sequence[bool]) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` spans of the contiguous ``True`` runs of ``row``."""
    spans: list[tuple[int, int]] = []
    start = -1
    for i, valid in enumerate(row):
        if valid and start < 0:
            start = i
        elif not valid and start >= 0:
            spans.append((start, i))
            start = -1
    if start >= 0:
        spans.append((start, len(row)))
    return spans


def _turn_row(row: Sequence[bool], cuts: set[int]) -> list[int]:
    """Turn ids for one row: a turn starts at each run start and at each position in ``cuts``."""
    ids = [-1] * len(row)
    turn = -1
    for start, end in _runs(row):
        for i in range(start, end):
            if i == start or i in cuts:
                turn += 1
            ids[i] = turn
    return ids


@st.composite
def _turn_row_ids(draw: DrawFn, row: list[bool], max_turns: int | None) -> list[int]:
    spans = _runs(row)
    budget = len(row) if max_turns is None else max_turns - len(spans)
    if budget < 0:
        raise InvalidArgument(f"row has {len(spans)} runs of True but max_turns={max_turns}")
    candidates = [i for start, end in spans for i in range(start + 1, end)]
    cuts: set[int] = set()
    if candidates and budget > 0:
        cuts = draw(st.sets(st.sampled_from(candidates), max_size=budget))
    return _turn_row(row, cuts)


def turn_ids_for(mask: torch.Tensor, max_turns: int | None = None) -> SearchStrategy[torch.Tensor]:
    """Draws turn ids consistent with a given mask.

    Each contiguous run of ``True`` in a row starts a new turn; runs may additionally be split
    into several turns. Turns are numbered ``0, 1, ...`` left to right within each row.

    Args:
        mask: ``bool`` tensor ``[N, T]``.
        max_turns: Largest number of turns ``K`` per row; ``None`` for no limit.

    Returns:
        A strategy for an ``int64`` tensor ``[N, T]``: ``-1`` where ``mask`` is ``False``, else the
        token's turn index.

    Raises:
        InvalidArgument: If ``mask`` is not a 2-D bool tensor, ``max_turns < 1``, or a row has
            more runs of ``True`` than ``max_turns`` (raised when drawing).
    """
    _check(mask.dtype == torch.bool and mask.dim() == 2, "mask must be a 2-D bool tensor")
    _check(max_turns is None or max_turns >= 1, f"max_turns must be >= 1, got {max_turns}")
    rows: list[list[bool]] = mask.tolist()
    n, t = mask.shape
    return st.tuples(*(_turn_row_ids(row, max_turns) for row in rows)).map(
        lambda ids: torch.tensor(list(ids), dtype=torch.int64).reshape(n, t)
    )


def _limit_runs(row: list[bool], max_turns: int) -> list[bool]:
    """Fills the gaps after the ``max_turns``-th run so that at most ``max_turns`` runs remain."""
    spans = _runs(row)
    if len(spans) <= max_turns:
        return row
    out = list(row)
    for i in range(spans[max_turns - 1][1], spans[-1][1]):
        out[i] = True
    return out


def turn_batches(
    max_n: int = 6,
    max_t: int = 12,
    max_turns: int = 3,
    *,
    min_n: int = 1,
    min_t: int = 1,
    allow_empty_rows: bool = False,
    right_padded: bool = False,
) -> SearchStrategy[tuple[torch.Tensor, torch.Tensor]]:
    """Draws a multi-turn batch ``(mask, turn_ids)``.

    Masks are arbitrary patterns by default (prompt and observation tokens masked out between
    turns), with at most ``max_turns`` runs of ``True`` per row; see :func:`turn_ids_for` for the
    turn ids.

    Args:
        max_n: Largest ``N``.
        max_t: Largest ``T``.
        max_turns: Largest number of turns ``K`` per row.
        min_n: Smallest ``N``.
        min_t: Smallest ``T``.
        allow_empty_rows: Allow rows with no counted token (all ``-1`` turn ids).
        right_padded: Draw right-padded masks (one run per row, split into turns).

    Returns:
        A strategy for ``(mask, turn_ids)``: ``bool`` ``[N, T]`` and ``int64`` ``[N, T]``.

    Raises:
        InvalidArgument: If the bounds are inconsistent or ``max_turns < 1``.
    """
    _check(max_turns >= 1, f"max_turns must be >= 1, got {max_turns}")

    def limited(mask: torch.Tensor) -> torch.Tensor:
        rows = [_limit_runs(row, max_turns) for row in mask.tolist()]
        return torch.tensor(rows, dtype=torch.bool).reshape(mask.shape)

    mask_strategy = mask_batches(
        max_n,
        max_t,
        min_n=min_n,
        min_t=min_t,
        allow_empty_rows=allow_empty_rows,
        right_padded=right_padded,
    ).map(limited)
    return mask_strategy.flatmap(lambda m: turn_ids_for(m, max_turns).map(lambda ids: (m, ids)))
