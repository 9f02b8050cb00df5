"""float64 loop references of the trust-region objectives (DPPO, DRO), token by token in plain
Python floats where the spec branches, built on ``ref_losses``' unit machinery."""

from __future__ import annotations

import math
from typing import Any

from ref_losses import RefPolicyOut, _finish, _units_of
from torch import Tensor

__all__ = ["ref_dppo_loss", "ref_dro_loss"]


def _binary_kl(mu: float, p: float) -> float:
    """KL(Bern(mu) || Bern(p)), written out."""
    first = mu * math.log(mu / p)
    if mu >= 1.0:
        return first
    if p >= 1.0:
        return math.inf
    return first + (1.0 - mu) * math.log((1.0 - mu) / (1.0 - p))


def ref_dppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    divergence: str = "tv",
    delta_low: float = 0.2,
    delta_high: float | None = None,
    ratio_cap: float | None = 20.0,
) -> RefPolicyOut:
    hi = delta_low if delta_high is None else delta_high
    units, n, u = _units_of(
        logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights
    )
    losses, low, high = [], [], []
    for x in units:
        lp = float(x.lp.item())
        mu = math.exp(lp - float(x.ell.item()))
        p = math.exp(lp)
        if divergence == "tv":
            out_up, out_down = p - mu > hi, p - mu < -delta_low
        else:
            d = _binary_kl(mu, p)
            out_up, out_down = d > hi and p > mu, d > delta_low and p < mu
        dropped = out_up if x.adv > 0 else out_down
        w = x.rv if ratio_cap is None else min(x.rv, ratio_cap)
        losses.append(x.lp * 0.0 if dropped else -w * x.adv * x.lp)
        low.append(dropped and x.adv < 0)
        high.append(dropped and x.adv > 0)
    return _finish(units, losses, n, u, aggregation, normalizer, max_length, low, high)


def ref_dro_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    beta: float = 1.0,
) -> RefPolicyOut:
    units, n, u = _units_of(
        logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights
    )
    losses = [-x.adv * x.lp + 0.5 * beta * x.ell**2 for x in units]
    return _finish(units, losses, n, u, aggregation, normalizer, max_length)
