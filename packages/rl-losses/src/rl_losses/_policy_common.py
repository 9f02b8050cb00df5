"""Shared machinery of the policy objectives (private): input checks, IS units, clipping, output.

:mod:`rl_losses.policy` and :mod:`rl_losses.policy_variants` build every objective from these:
:func:`_prepare` validates the inputs and pools them to importance-sampling units,
:func:`_bounds` / :func:`_clip_objective` give the ratio bounds and the clipped surrogate, and
:func:`_finish` weights, aggregates and adds the diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rl_losses._checks import (
    as_mask,
    check_2d,
    check_choice,
    check_finite,
    check_float,
    check_same_shape,
    check_tensor,
    masked_max,
    shape_str,
    zero_fill,
)
from rl_losses.aggregate import AGGREGATIONS, Aggregation, aggregate
from rl_losses.outputs import PolicyLossOutput
from rl_losses.units import Level, Pooling, to_units

#: How a unit (turn, trajectory) counts in the aggregation: once, or once per valid token.
UnitWeight = Literal["unit", "tokens"]


@dataclass(frozen=True)
class _Units:
    """Validated inputs pooled to units."""

    logratio: torch.Tensor  # [N, U] pooled log pi - log pi_old (differentiable)
    logprobs: torch.Tensor  # [N, U] pooled log pi (differentiable)
    advantages: torch.Tensor  # [N, U] mean-pooled, detached
    weights: torch.Tensor | None  # [N, U] mean-pooled is_weights, detached
    mask: torch.Tensor  # [N, U]
    token_ids: torch.Tensor | None = None  # [N, T] unit index of each token (-1: none)
    token_weights: torch.Tensor | None = None  # [N, T] is_weights, detached, unpooled


def _token_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    check_tensor("advantages", advantages)
    n, t = logprobs.shape
    if advantages.shape == (n,):
        return advantages[:, None].expand(n, t)
    if advantages.shape != logprobs.shape:
        raise ValueError(
            f"`advantages` has shape {shape_str(advantages)} but `logprobs` has shape "
            f"{shape_str(logprobs)}; pass [N] (one per sequence) or [N, T]"
        )
    return advantages


def _prepare(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    level: Level,
    pooling: Pooling,
    turn_ids: torch.Tensor | None,
    is_weights: torch.Tensor | None,
) -> _Units:
    check_2d("logprobs", logprobs)
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    m = as_mask(mask, "logprobs", logprobs, "is_weights")
    adv = _token_advantages(advantages, logprobs)
    for name, x in (("logprobs", logprobs), ("old_logprobs", old_logprobs), ("advantages", adv)):
        check_float(name, x)
    check_finite("logprobs", logprobs, m)
    check_finite("old_logprobs", old_logprobs, m)
    check_finite("advantages", adv, m)
    lp = zero_fill(logprobs, m)
    logratio = lp - zero_fill(old_logprobs.detach(), m)
    ratio_u, mask_u = to_units(logratio, m, level, turn_ids, pooling)
    lp_u, _ = to_units(lp, m, level, turn_ids, pooling)
    adv_u, _ = to_units(adv.detach().to(lp.dtype), m, level, turn_ids, "mean")
    w_u = w_t = None
    if is_weights is not None:
        check_same_shape("is_weights", is_weights, "logprobs", logprobs)
        check_finite("is_weights", is_weights, m)
        w_t = zero_fill(is_weights.detach().to(lp.dtype), m)
        w_u, _ = to_units(w_t, m, level, turn_ids, "mean")
    if level == "token":
        ids = torch.where(m, torch.arange(m.shape[1], device=m.device).expand_as(m), -1)
    elif level == "trajectory":
        ids = torch.where(m, 0, -1)
    else:
        assert turn_ids is not None  # to_units raised otherwise
        ids = torch.where(m, turn_ids, -1)
    return _Units(ratio_u, lp_u, adv_u, w_u, mask_u, ids, w_t)


def _to_tokens(loss_u: torch.Tensor, units: _Units) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast a per-unit loss [N, U] back to every valid token of its unit: [N, T]."""
    assert units.token_ids is not None
    ids = units.token_ids
    valid = ids >= 0
    if loss_u.shape[1] == 0:  # no unit: zeros that stay on the autograd graph
        return loss_u.new_zeros(ids.shape) + loss_u.sum(), valid
    loss_t = torch.gather(loss_u, 1, ids.clamp(min=0))
    if units.token_weights is not None:
        loss_t = loss_t * units.token_weights
    return zero_fill(loss_t, valid), valid


def _check_unit_weight(unit_weight: str) -> None:
    check_choice("unit_weight", unit_weight, ("unit", "tokens"))


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    x = zero_fill(x, m)
    return x.sum() / m.sum().clamp(min=1).to(x.dtype)


def _finish(
    loss_u: torch.Tensor,
    units: _Units,
    ratio: torch.Tensor,
    logratio: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    aggregation: Aggregation,
    normalizer: float | torch.Tensor | None,
    max_length: int | None,
    unit_weight: UnitWeight = "unit",
) -> PolicyLossOutput:
    check_choice("aggregation", aggregation, AGGREGATIONS)
    _check_unit_weight(unit_weight)
    m = units.mask
    if unit_weight == "tokens":
        loss_t, valid = _to_tokens(loss_u, units)
        loss = aggregate(loss_t, valid, aggregation, normalizer, max_length)
    else:
        if units.weights is not None:
            loss_u = loss_u * units.weights
        loss = aggregate(loss_u, m, aggregation, normalizer, max_length)
    with torch.no_grad():
        r = ratio.detach()
        lr = logratio.detach()
        fdtype = r.dtype
        ratio_max = masked_max(r, m)
        return PolicyLossOutput(
            loss=loss,
            clip_frac_low=_masked_mean(low.to(fdtype), m),
            clip_frac_high=_masked_mean(high.to(fdtype), m),
            approx_kl=_masked_mean((r - 1) - lr, m),
            ratio_mean=_masked_mean(r, m),
            ratio_max=ratio_max,
        )


def _bounds(
    clip_low: float, clip_high: float | None, ratio_bounds: tuple[float, float] | None
) -> tuple[float, float]:
    if ratio_bounds is not None:
        lo, hi = (float(b) for b in ratio_bounds)
        if not (0.0 <= lo <= 1.0 <= hi and lo < hi):
            raise ValueError(
                f"`ratio_bounds` must be (low, high) absolute ratio bounds with 0 <= low <= 1 <= "
                f"high and low < high (e.g. (0.8, 1.2); (0, inf) for no clip), got {ratio_bounds}"
            )
        return lo, hi
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"`clip_low` must be in [0, 1), got {clip_low}")
    high = clip_low if clip_high is None else clip_high
    if not high >= 0.0:
        raise ValueError(f"`clip_high` must be >= 0, got {clip_high}")
    return 1.0 - clip_low, 1.0 + high


def _clip_objective(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    lo: float,
    hi: float,
    dual_clip: float | None,
    delta: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-unit clipped-surrogate loss and the low/high clip indicators."""
    capped = ratio.clamp(max=delta) if delta is not None else ratio
    loss = -torch.minimum(capped * adv, ratio.clamp(lo, hi) * adv)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return loss, (ratio < lo) & (adv < 0), (ratio > hi) & (adv > 0)


def _check_clip_extras(hi: float, dual_clip: float | None, delta: float | None) -> None:
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"`dual_clip` must be > 1 (verl uses 3.0), got {dual_clip}")
    if delta is not None and not delta > hi:
        raise ValueError(f"`delta` must be > the upper ratio bound {hi}, got {delta}")
