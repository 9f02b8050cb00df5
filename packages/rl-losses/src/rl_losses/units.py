"""Importance-sampling units: tokens, turns or whole trajectories.

A policy loss can treat each token as an action (``level="token"``), each turn of a multi-turn
rollout (``"turn"``), or the whole completion (``"trajectory"``). Log-ratios (and log-probs) are
pooled to the unit by ``sum`` (the exact product ratio of the unit's tokens) or ``mean`` (the
geometric mean, GSPO's length-normalised ratio); advantages and importance weights are always
mean-pooled. Each unit then counts once in the aggregation.
"""

from __future__ import annotations

from typing import Literal

import torch

from rl_losses._checks import as_mask, check_2d, check_choice, check_same_shape, zero_fill

__all__ = ["Level", "Pooling", "to_units"]

Level = Literal["token", "turn", "trajectory"]
Pooling = Literal["sum", "mean"]


def to_units(
    x: torch.Tensor,
    mask: torch.Tensor,
    level: Level = "token",
    turn_ids: torch.Tensor | None = None,
    pooling: Pooling = "sum",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Pool token values [N, T] to unit values [N, U] (differentiable).

    .. math:: x_u = \sum_{t \in u} x_t \;(\text{sum}) \quad\text{or}\quad
              \frac{1}{|u|}\sum_{t \in u} x_t \;(\text{mean})

    * ``"token"``: U = T, identity (masked entries set to 0).
    * ``"turn"``: U = K = ``max(turn_ids) + 1``; turn k of row n is the valid tokens with
      ``turn_ids == k``.
    * ``"trajectory"``: U = 1, every valid token of the row.

    Args:
        x: [N, T] token values.
        mask: [N, T] bool, True where the token counts.
        level: ``"token"``, ``"turn"`` or ``"trajectory"``.
        turn_ids: [N, T] integer turn index per token (-1 outside action tokens, >= 0 where
            ``mask`` is True); required for ``level="turn"``.
        pooling: ``"sum"`` or ``"mean"``.

    Returns:
        ``(x_u [N, U], mask_u [N, U])``; ``mask_u`` is True for units with at least one valid
        token, and ``x_u`` is 0 elsewhere.
    """
    check_choice("level", level, ("token", "turn", "trajectory"))
    check_choice("pooling", pooling, ("sum", "mean"))
    check_2d("x", x)
    mask = as_mask(mask, "x", x)
    xz = zero_fill(x, mask)
    if level == "token":
        return xz, mask
    if level == "trajectory":
        ids = torch.where(mask, 0, -1)
        k = 1
    else:
        if turn_ids is None:
            raise ValueError(
                "`turn_ids` is required for level='turn': pass [N, T] turn indices "
                "(-1 outside action tokens), or use level='token' or 'trajectory'"
            )
        check_same_shape("turn_ids", turn_ids, "logprobs", x)
        if turn_ids.is_floating_point() or turn_ids.dtype == torch.bool:
            raise ValueError(f"`turn_ids` must be an integer tensor, got {turn_ids.dtype}")
        k = 0
        if turn_ids.numel():
            # one host synchronisation for the three numbers
            low, low_valid, high = torch.stack(
                [turn_ids.min(), torch.where(mask, turn_ids, 0).min(), turn_ids.max()]
            ).tolist()
            if low < -1:
                raise ValueError("`turn_ids` must be >= -1 (-1 = not an action token)")
            if low_valid < 0:
                raise ValueError(
                    "`turn_ids` is -1 at a token where `mask` is True: give every valid token its "
                    "turn index (>= 0), or set `mask` False where the id is -1"
                )
            k = int(high) + 1
        ids = torch.where(mask, turn_ids, -1)
    n = x.shape[0]
    if k == 0:  # no unit: a zero-width slice keeps the result on the autograd graph
        return xz[:, :0], torch.zeros((n, 0), dtype=torch.bool, device=x.device)
    valid = ids >= 0
    idx = ids.clamp(min=0)
    sums = xz.new_zeros((n, k)).scatter_add(1, idx, zero_fill(xz, valid))
    counts = xz.new_zeros((n, k)).scatter_add(1, idx, valid.to(xz.dtype))
    mask_u = counts > 0
    pooled = sums / counts.clamp(min=1) if pooling == "mean" else sums
    return pooled, mask_u
