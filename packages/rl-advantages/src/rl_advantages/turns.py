"""Turn and token plumbing: pool token values to turns and broadcast turn values back.

A multi-turn trajectory interleaves action tokens (what the policy generated) with observation
tokens (what the environment said). ``turn_ids`` [N, T] gives, for each token, the index of the
turn it belongs to (0, 1, ..., K-1), or -1 for tokens that are not action tokens (prompt,
observations, padding). A single-turn completion is ``turn_ids = where(mask, 0, -1)``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from rl_advantages._checks import as_float, check_ndim, check_tensor, shape_str

__all__ = ["TurnValues", "broadcast_to_tokens", "pool_to_turns", "turn_mask_from_ids"]

TurnReduction = Literal["sum", "mean", "final"]


class TurnValues(NamedTuple):
    """Values pooled per turn."""

    values: torch.Tensor
    """[N, K] pooled value per (sequence, turn); 0 where the turn was not played."""
    mask: torch.Tensor
    """[N, K] bool, True where the sequence has at least one token of that turn."""


def _check_turn_ids(turn_ids: torch.Tensor, num_turns: int | None) -> int:
    check_tensor("turn_ids", turn_ids)
    check_ndim("turn_ids", turn_ids, 2, "[N, T]")
    if turn_ids.is_floating_point() or turn_ids.dtype == torch.bool:
        raise ValueError(f"`turn_ids` must be an integer tensor, got dtype {turn_ids.dtype}")
    top = int(turn_ids.max()) if turn_ids.numel() else -1
    low = int(turn_ids.min()) if turn_ids.numel() else -1
    if low < -1:
        raise ValueError(f"`turn_ids` must be >= -1 (-1 = not an action token), found {low}")
    if num_turns is None:
        return top + 1
    if num_turns < 0:
        raise ValueError(f"`num_turns` must be >= 0, got {num_turns}")
    if top >= num_turns:
        raise ValueError(
            f"`turn_ids` holds turn {top} but `num_turns` = {num_turns}; ids must be < num_turns"
        )
    return num_turns


def _last_positions(turn_ids: torch.Tensor, num_turns: int) -> torch.Tensor:
    """[N, K] position of each turn's last token, -1 where the turn is absent."""
    n, t = turn_ids.shape
    if num_turns == 0:
        return torch.full((n, 0), -1, dtype=torch.long, device=turn_ids.device)
    valid = turn_ids >= 0
    pos = torch.arange(t, device=turn_ids.device).expand(n, t)
    pos = torch.where(valid, pos, -1)
    last = torch.full((n, num_turns), -1, dtype=pos.dtype, device=turn_ids.device)
    return last.scatter_reduce(1, turn_ids.clamp(min=0), pos, reduce="amax", include_self=True)


def turn_mask_from_ids(turn_ids: torch.Tensor, num_turns: int | None = None) -> torch.Tensor:
    """[N, K] bool: True where sequence n has at least one token of turn k.

    Args:
        turn_ids: [N, T] integer turn index per token, -1 outside action tokens.
        num_turns: K; defaults to ``max(turn_ids) + 1``.
    """
    k = _check_turn_ids(turn_ids, num_turns)
    return _last_positions(turn_ids, k) >= 0


def pool_to_turns(
    values: torch.Tensor,
    turn_ids: torch.Tensor,
    num_turns: int | None = None,
    reduction: TurnReduction = "sum",
) -> TurnValues:
    r"""Pool token values [N, T] to turn values [N, K].

    .. math:: \text{sum: } v_{n,k} = \sum_{t: id_{n,t}=k} x_{n,t}, \quad
              \text{mean: } v_{n,k} = \frac{1}{|\{t: id_{n,t}=k\}|}\sum_{t: id_{n,t}=k} x_{n,t},
              \quad \text{final: } v_{n,k} = x_{n,\max\{t: id_{n,t}=k\}}

    ``final`` is the value at the turn's last token, the usual choice for a critic's value of
    a turn (AgileRL's ``turn_value_reduction="final_value"``); ``mean`` is the alternative.

    Args:
        values: [N, T] token values (rewards, values, log-probs).
        turn_ids: [N, T] integer turn index per token, -1 outside action tokens.
        num_turns: K; defaults to ``max(turn_ids) + 1``.
        reduction: ``"sum"``, ``"mean"`` or ``"final"``.

    Returns:
        ``TurnValues(values [N, K], mask [N, K])``. Tokens with id -1 never contribute, even
        when their value is NaN.
    """
    check_tensor("values", values)
    k = _check_turn_ids(turn_ids, num_turns)
    if values.shape != turn_ids.shape:
        raise ValueError(
            f"`values` has shape {shape_str(values)} but `turn_ids` has shape "
            f"{shape_str(turn_ids)}; they must match"
        )
    if reduction not in ("sum", "mean", "final"):
        raise ValueError(f"`reduction` must be 'sum', 'mean' or 'final', got {reduction!r}")
    n = values.shape[0]
    values = as_float(values)
    valid = turn_ids >= 0
    idx = turn_ids.clamp(min=0)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    x = torch.where(valid, values, zero)
    last = _last_positions(turn_ids, k)
    played = last >= 0
    if k == 0:
        return TurnValues(values.new_zeros((n, 0)), played)
    if reduction == "final":
        pooled = x.gather(1, last.clamp(min=0))
    else:
        pooled = x.new_zeros((n, k)).scatter_add(1, idx, x)
        if reduction == "mean":
            count = x.new_zeros((n, k)).scatter_add(1, idx, valid.to(x.dtype))
            pooled = pooled / count.clamp(min=1)
    return TurnValues(torch.where(played, pooled, zero), played)


def broadcast_to_tokens(
    turn_values: torch.Tensor,
    turn_ids: torch.Tensor,
    placement: Literal["all", "last"] = "all",
) -> torch.Tensor:
    """Spread turn values [N, K] back over the tokens of each turn.

    Args:
        turn_values: [N, K] one value per (sequence, turn).
        turn_ids: [N, T] integer turn index per token, -1 outside action tokens.
        placement: ``"all"`` gives every token of turn k the value of turn k (advantages);
            ``"last"`` puts it on the turn's last token only and 0 elsewhere (rewards, so that
            token-level returns do not grow with the remaining length).

    Returns:
        [N, T], 0 at tokens with id -1.
    """
    check_tensor("turn_values", turn_values)
    check_ndim("turn_values", turn_values, 2, "[N, K]")
    k = _check_turn_ids(turn_ids, turn_values.shape[1])
    if turn_values.shape[0] != turn_ids.shape[0]:
        raise ValueError(
            f"`turn_values` has shape {shape_str(turn_values)} but `turn_ids` has shape "
            f"{shape_str(turn_ids)}; their first dimension N must match"
        )
    if placement not in ("all", "last"):
        raise ValueError(f"`placement` must be 'all' or 'last', got {placement!r}")
    turn_values = as_float(turn_values)
    valid = turn_ids >= 0
    zero = torch.zeros((), dtype=turn_values.dtype, device=turn_values.device)
    if k == 0:
        return turn_values.new_zeros(turn_ids.shape)
    idx = turn_ids.clamp(min=0)
    out = torch.where(valid, turn_values.gather(1, idx), zero)
    if placement == "last":
        last = _last_positions(turn_ids, k).gather(1, idx)
        pos = torch.arange(turn_ids.shape[1], device=turn_ids.device).expand_as(turn_ids)
        out = torch.where(valid & (last == pos), out, zero)
    return out
