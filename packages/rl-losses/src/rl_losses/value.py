"""Critic loss: PPO's clipped value loss, unclipped, or Huber."""

from __future__ import annotations

import torch

from rl_losses._checks import (
    as_mask,
    check_2d,
    check_choice,
    check_finite,
    check_float,
    check_same_shape,
    zero_fill,
)
from rl_losses.aggregate import AGGREGATIONS, Aggregation, aggregate
from rl_losses.outputs import ValueLossOutput

__all__ = ["value_loss"]


def _error(x: torch.Tensor, huber_delta: float | None) -> torch.Tensor:
    if huber_delta is None:
        return 0.5 * x * x
    a = x.abs()
    return torch.where(a <= huber_delta, 0.5 * x * x, huber_delta * (a - 0.5 * huber_delta))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = None,
    huber_delta: float | None = None,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
) -> ValueLossOutput:
    r"""Value-function loss (PPO, arXiv 1707.06347, eq. 9; clipped form of OpenAI baselines).

    .. math:: l = \tfrac12 (V - R)^2 \quad\text{or, with clip } \epsilon_v:\quad
              l = \max\big(\tfrac12 (V - R)^2,\; \tfrac12 (V_{old} +
              \operatorname{clip}(V - V_{old}, -\epsilon_v, \epsilon_v) - R)^2\big)

    The factor 1/2 makes the gradient :math:`V - R` (AgileRL, TRL and verl all include it;
    TRL/AgileRL then multiply by ``vf_coef``). ``huber_delta`` replaces :math:`\tfrac12 x^2`
    by the Huber function :math:`\tfrac12 x^2` for :math:`|x| \le d`, else
    :math:`d(|x| - \tfrac d2)`. Works per token [N, T] or per turn [N, K].

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``clip=cliprange_value``.
    * OpenRLHF 0.11.2: equal with ``clip=clip_eps``.
    * AgileRL 2.58.0: equal with ``clip=clip_coef``, times ``vf_coef`` outside.
    * No counterpart: TRL (TRL's PPO is experimental; not compared), Liger.

    Args:
        values: [N, T] predicted values (differentiable).
        old_values: [N, T] values at rollout time (for the clip).
        returns: [N, T] value targets (e.g. GAE returns).
        mask: [N, T] bool.
        clip: :math:`\epsilon_v` in value units (> 0), or None for the unclipped loss.
        huber_delta: Huber threshold (> 0), or None for the squared error.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.

    Returns:
        :class:`ValueLossOutput`.
    """
    check_2d("values", values)
    check_same_shape("old_values", old_values, "values", values)
    check_same_shape("returns", returns, "values", values)
    m = as_mask(mask, "values", values)
    check_choice("aggregation", aggregation, AGGREGATIONS)
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        check_float(name, x)
        check_finite(name, x, m)
    if clip is not None and not clip > 0:
        raise ValueError(f"`clip` must be > 0, got {clip}")
    if huber_delta is not None and not huber_delta > 0:
        raise ValueError(f"`huber_delta` must be > 0, got {huber_delta}")
    v = zero_fill(values, m)
    old = zero_fill(old_values.detach(), m).to(v.dtype)
    ret = zero_fill(returns.detach(), m).to(v.dtype)
    loss = _error(v - ret, huber_delta)
    moved = torch.zeros_like(m)
    if clip is not None:
        v_clipped = old + (v - old).clamp(-clip, clip)
        loss = torch.maximum(loss, _error(v_clipped - ret, huber_delta))
        moved = (v - old).abs() > clip
    total = aggregate(loss, m, aggregation, normalizer, max_length)
    with torch.no_grad():
        count = m.sum().clamp(min=1).to(v.dtype)
        vd = v.detach()
        resid = zero_fill(ret - vd, m)
        var_r = zero_fill((ret - ret.sum() / count) ** 2, m).sum() / count
        var_e = zero_fill((resid - resid.sum() / count) ** 2, m).sum() / count
        ev = torch.where(var_r > 0, 1 - var_e / var_r.clamp(min=torch.finfo(v.dtype).tiny), 0.0)
        return ValueLossOutput(
            loss=total,
            clip_frac=zero_fill(moved.to(v.dtype), m).sum() / count,
            value_mean=vd.sum() / count,
            explained_variance=ev,
        )
