"""Advantages from several rewards per sample: GDPO's group-decoupled normalisation.

``rewards`` [N, R] hold R named rewards per sample (accuracy, format, length, ...), rows laid
out as in :mod:`rl_advantages.group` (B contiguous groups of G samples); the result is one
advantage per sample, [N].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_advantages._checks import (
    NonFinite,
    as_float,
    bool_mask,
    check_ndim,
    check_tensor,
    shape_str,
)
from rl_advantages.group import GroupScale, group_relative

__all__ = ["gdpo"]


def gdpo(
    rewards: torch.Tensor,
    group_size: int,
    weights: Sequence[float] | torch.Tensor | None = None,
    scale: GroupScale = "group",
    unbiased: bool = True,
    eps: float = 1e-6,
    mask: torch.Tensor | None = None,
    *,
    batch_scale: bool = False,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Group reward-Decoupled normalisation (GDPO, Liu et al., arXiv 2601.05242).

    .. math:: \hat A_i = \sum_k w_k\, \frac{r_{i,k} - \operatorname{mean}(r_{\text{group}(i),k})}
              {\operatorname{std}(r_{\text{group}(i),k}) + \epsilon}

    Each reward is normalised within its group on its own (:func:`group_relative` per column),
    then the weighted sum is taken. GRPO on the summed reward lets the reward with the largest
    spread drown the others (distinct reward combinations collapse to the same advantage);
    decoupling keeps each reward's signal. The paper then normalises the sum over the batch:
    compose with :func:`rl_advantages.whiten` (verl whitens the token-broadcast sum, so each
    sample weighs by its token count), or pass ``batch_scale=True`` for the per-sample
    standardisation :math:`(\hat A_i - \bar A) / (\operatorname{std}(\hat A) + \epsilon)`
    over the valid samples (TRL's). With R = 1 and unit weight this is :func:`group_relative`.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``whiten(gdpo(rewards, G, weights=gdpo_reward_weights)`` broadcast
      over the tokens ``, mask)`` (``gdpo``; verl reads the rewards as float32).
    * TRL 1.16.0: equal with ``eps=1e-4, batch_scale=True`` (``GRPOConfig(
      multi_objective_aggregation="normalize_then_sum")``, ``reward_weights`` as ``weights``).
    * No counterpart: OpenRLHF, Liger, AgileRL.

    Args:
        rewards: [N, R] rewards per sample, groups contiguous.
        group_size: G >= 2.
        weights: R weights :math:`w_k` (default all 1).
        scale: Per-reward scale, as in :func:`group_relative`.
        unbiased: Bessel-corrected standard deviation (as :func:`group_relative`).
        eps: :math:`\epsilon` added to the standard deviation.
        mask: [N] bool, True for samples that count; None means all.
        batch_scale: Then standardise the sum over the batch's valid samples (the std as
            ``unbiased`` says, ``eps`` added to it).
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat the sample as masked
            (for every reward).

    Returns:
        [N] advantages, 0 for masked samples; a reward whose group is degenerate adds 0.
    """
    check_tensor("rewards", rewards)
    check_ndim("rewards", rewards, 2, "[N, R]")
    n, r = rewards.shape
    if r == 0:
        raise ValueError("`rewards` has R = 0 columns: pass at least one reward per sample")
    if mask is not None:
        check_tensor("mask", mask)
        if mask.shape != (n,):
            raise ValueError(
                f"`mask` must have shape [N] = [{n}] like the rows of `rewards` "
                f"{shape_str(rewards)}, got {shape_str(mask)}"
            )
        mask = bool_mask("mask", mask)
    rewards = as_float(rewards, weights if isinstance(weights, torch.Tensor) else None)
    if weights is None:
        w = torch.ones(r, dtype=rewards.dtype, device=rewards.device)
    else:
        w = torch.as_tensor(weights, dtype=rewards.dtype, device=rewards.device).reshape(-1)
        if w.numel() != r:
            raise ValueError(f"`weights` has {w.numel()} entries but `rewards` has R = {r} columns")
        if not bool(torch.isfinite(w).all()):
            raise ValueError(f"`weights` must be finite, got {w.tolist()}")
    if nonfinite == "mask":
        finite = torch.isfinite(rewards).all(dim=1)
        mask = finite if mask is None else mask & finite
        rewards = torch.where(finite[:, None], rewards, torch.zeros_like(rewards))
    total = rewards.new_zeros(n)
    for k in range(r):
        col = group_relative(
            rewards[:, k], group_size, scale, unbiased, eps, mask, nonfinite=nonfinite
        )
        total = total + w[k] * col
    if not batch_scale:
        return total
    valid = torch.ones(n, dtype=torch.bool, device=rewards.device) if mask is None else mask
    count = int(valid.sum())
    if count < 2:
        return torch.zeros_like(total)
    x = total[valid]
    std = x.std(unbiased=unbiased)
    scaled = torch.where(std > 0, (total - x.mean()) / (std + eps), 0.0)
    return torch.where(valid, scaled, torch.zeros_like(scaled))
