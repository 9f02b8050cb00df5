"""Micro-batch planning: rows cut into forwards by a row count or a token budget.

Shapes: ``N`` rows, ``L`` tokens per padded row, ``R`` rows selected for one pass.

**Token budgets.** :func:`token_budget_groups` splits rows into micro-batches of at most
``micro_batch_tokens`` real tokens, balanced by the sum of squared lengths (attention grows with
``L^2``): rows longest first, each into the micro-batch of least cost it still fits in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["RowSplit", "split_rows", "token_budget_groups"]


def token_budget_groups(
    lengths: Sequence[int],
    budget: int,
    max_rows: int | None = None,
    groups: int = 0,
    together: Sequence[bool] | None = None,
) -> list[list[int]]:
    """Indices of ``lengths`` in micro-batches of at most ``budget`` tokens, balanced.

    Two passes. The first counts the micro-batches a first-fit pass needs (rows longest first,
    each into the first micro-batch with room: ``budget`` tokens and ``max_rows`` rows). The
    second opens that many (or ``groups``, if more: e.g. the most any process needs, so every
    process runs the same number of forwards; never more than there are rows) and puts the rows,
    longest first, each into the micro-batch of least cost (sum of squared lengths, as attention
    grows with ``L^2``) that has room, opening another when none has. Each micro-batch lists
    its rows in ascending order; the micro-batches are ordered by their first row.

    ``together`` (one flag per row): row ``k`` goes with row ``k - 1``, as rows that share a
    prompt (:func:`rl_algos.shared_prefix.shares_previous`) must to compute it once. Each run of
    such rows is placed as one unit (its tokens and costs summed), cut into consecutive pieces
    where it does not fit one micro-batch; with ``groups`` more than the units, the rows are
    placed one by one.

    Raises:
        ValueError: A row longer than ``budget`` (both numbers are named).
    """
    if budget < 1:
        raise ValueError(f"`micro_batch_tokens` must be >= 1, got {budget}")
    longest = max(lengths, default=0)
    if longest > budget:
        raise ValueError(
            f"a row has {longest} tokens, more than micro_batch_tokens={budget}: raise "
            "micro_batch_tokens to at least the longest row (prompt + completion), or shorten "
            "max_output_tokens"
        )
    units = _units(lengths, budget, max_rows, together)
    if groups > len(units):
        units = [[k] for k in range(len(lengths))]
    order = sorted(units, key=lambda u: (-sum(lengths[k] for k in u), u[0]))
    first_fit = _fill(order, lengths, budget, max_rows, 0, balanced=False)
    bins = _fill(order, lengths, budget, max_rows, max(groups, len(first_fit)), balanced=True)
    out = [sorted(b) for b in bins if b]
    return sorted(out, key=lambda b: b[0])


def _units(
    lengths: Sequence[int], budget: int, max_rows: int | None, together: Sequence[bool] | None
) -> list[list[int]]:
    """Rows in runs that go ``together``, each cut where it would not fit one micro-batch."""
    if together is None:
        return [[k] for k in range(len(lengths))]
    if len(together) != len(lengths):
        raise ValueError(f"`together` has {len(together)} flags for {len(lengths)} rows")
    units: list[list[int]] = []
    tokens = 0
    for k, n in enumerate(lengths):
        full = bool(units) and (
            tokens + n > budget or (max_rows is not None and len(units[-1]) >= max_rows)
        )
        if not units or not together[k] or full:
            units.append([])
            tokens = 0
        units[-1].append(k)
        tokens += n
    return units


def _fill(
    order: list[list[int]],
    lengths: Sequence[int],
    budget: int,
    max_rows: int | None,
    opened: int,
    balanced: bool,
) -> list[list[int]]:
    """Units of rows ``order`` into ``opened`` micro-batches, more when needed.

    Each unit goes into the first micro-batch with room or (``balanced``) the one of least sum
    of squared lengths with room.
    """
    bins: list[list[int]] = [[] for _ in range(min(opened, len(order)))]
    tokens = [0] * len(bins)
    cost = [0] * len(bins)
    for unit in order:
        n, rows = sum(lengths[i] for i in unit), len(unit)
        fits = [
            b
            for b in range(len(bins))
            if tokens[b] + n <= budget and (max_rows is None or len(bins[b]) + rows <= max_rows)
        ]
        if not fits:
            bins.append([])
            tokens.append(0)
            cost.append(0)
            fits = [len(bins) - 1]
        b = min(fits, key=lambda k: (cost[k], tokens[k], k)) if balanced else fits[0]
        bins[b].extend(unit)
        tokens[b] += n
        cost[b] += sum(lengths[i] ** 2 for i in unit)
    return bins


@dataclass(frozen=True)
class RowSplit:
    """How a set of rows is cut into forwards (micro-batches)."""

    micro_batch_rows: int | None = None
    """At most this many rows per micro-batch (None: no row limit)."""
    micro_batch_tokens: int | None = None
    """At most this many real tokens per micro-batch (None: no token budget)."""


def split_rows(
    rows: torch.Tensor,
    attention_mask: torch.Tensor,
    split: RowSplit,
    together: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """``rows`` [R] (indices into ``attention_mask`` [N, L]) cut into micro-batches.

    Without a token budget: consecutive slices of ``split.micro_batch_rows`` rows (all rows
    when None). With one: :func:`token_budget_groups` over the rows' real lengths (the row
    limit still applies), keeping the runs of ``together`` [R] bool (row ``rows[i]`` goes with
    ``rows[i - 1]``) in one micro-batch where they fit; under data parallelism every process
    gets as many micro-batches as the process that needs the most, so collective forwards
    (ZeRO-3) stay in step.
    """
    if split.micro_batch_tokens is None:
        size = split.micro_batch_rows or max(1, len(rows))
        return [rows[s : s + size] for s in range(0, len(rows), size)]
    lengths = attention_mask[rows].sum(1).tolist()
    flags = None if together is None else together.tolist()
    budget, max_rows = split.micro_batch_tokens, split.micro_batch_rows
    groups = token_budget_groups(lengths, budget, max_rows, together=flags)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        count = torch.tensor([len(groups)], device=attention_mask.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        if int(count) > len(groups):
            groups = token_budget_groups(
                lengths, budget, max_rows, groups=int(count), together=flags
            )
        if int(count) > len(groups):
            raise ValueError(
                f"another process needs {int(count)} micro-batches of micro_batch_tokens="
                f"{split.micro_batch_tokens}, this one has only {len(groups)} rows: give every "
                "process the same number of rows, or raise micro_batch_tokens"
            )
    return [rows[torch.tensor(g, dtype=torch.long, device=rows.device)] for g in groups]
