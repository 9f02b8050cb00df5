"""Float64 loop references for the peer-convention arguments (issue 23), written from the
docstrings, independently of the implementation: plain loops over rows and tokens.

* ``ref_rollout_correction_ext``: ``statistic``, ``weights`` and ``lower`` in truncate mode.
* ``ref_off_policy_mask``: token band and DeepSeek-V3.2 sequence mask.
* ``ref_kl_penalty_ext``: ``importance_weight`` ("ratio" / "gradient"), ``weight_cap``,
  ``clamp_mode="drop"`` and ``is_weights`` (differentiable scalar graph for gradients).
* ``ref_clipped_surrogate_tokens``: ``unit_weight="tokens"`` (a unit's loss on each of its
  tokens, times that token's importance weight).
* ``ref_luspo_loss``: sum_i |y_i| * GSPO sequence loss_i / D (the sequence form, whose gradient
  the implementation's token form must reproduce).
* ``ref_vespo_loss``: -phi(w_i) A log pi per token, phi detached.
"""

from __future__ import annotations

import math
from typing import Any

import ref_losses as ref
import torch
from ref_losses import F64, _bl, _c, _clamp_t, _fl, _sum, aggregate_rows, ppo_unit_loss

Tensor = torch.Tensor


def _adv(advantages: Tensor) -> Any:
    a = _fl(advantages)
    return (lambda i, s: a[i]) if advantages.dim() == 1 else (lambda i, s: a[i][s])


def ref_rollout_correction_ext(
    old_logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    lower: float | None = None,
    statistic: str = "product",
    weights: str = "unit",
) -> tuple[Tensor, Tensor]:
    """(weights [N, T], mask [N, T])."""
    m = _bl(mask)
    d = [
        [o - s for o, s in zip(ro, rs, strict=True)]
        for ro, rs in zip(_fl(old_logprobs), _fl(sampling_logprobs), strict=True)
    ]
    n, t = mask.shape
    w_out = [[0.0] * t for _ in range(n)]
    m_out = [list(row) for row in m]
    for i in range(n):
        toks = [s for s in range(t) if m[i][s]]
        if not toks:
            continue
        if level == "token":
            units = [([s], math.exp(d[i][s])) for s in toks]
        else:
            total = sum(d[i][s] for s in toks)
            stat = total / len(toks) if statistic == "geometric_mean" else total
            units = [(toks, math.exp(stat))]
        for unit, rho in units:
            if mode == "truncate":
                w = min(rho, cap)
                if lower is not None:
                    w = max(w, lower)
                keep = True
            else:
                keep = rho <= cap and (lower is None or rho >= lower)
                w = rho if keep else 0.0
            for s in unit:
                if not keep:
                    m_out[i][s] = False
                if weights == "token":
                    w_out[i][s] = math.exp(d[i][s]) if keep else 0.0
                else:
                    w_out[i][s] = w
    return (
        torch.tensor(w_out, dtype=F64).reshape(n, t),
        torch.tensor(m_out, dtype=torch.bool).reshape(n, t),
    )


def ref_off_policy_mask(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    token_bounds: tuple[float, float] | None = None,
    sequence_threshold: float | None = None,
) -> Tensor:
    m = _bl(mask)
    lp, bl = _fl(logprobs), _fl(behaviour_logprobs)
    adv = _adv(advantages)
    n, t = mask.shape
    keep = [list(row) for row in m]
    for i in range(n):
        toks = [s for s in range(t) if m[i][s]]
        drift = sum(bl[i][s] - lp[i][s] for s in toks) / max(len(toks), 1)
        for s in toks:
            r = math.exp(lp[i][s] - bl[i][s])
            if token_bounds is not None and not token_bounds[0] <= r <= token_bounds[1]:
                keep[i][s] = False
            if sequence_threshold is not None and adv(i, s) < 0 and drift > sequence_threshold:
                keep[i][s] = False
    return torch.tensor(keep, dtype=torch.bool).reshape(n, t)


def ref_kl_penalty_ext(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    kind: str = "k3",
    coef: float = 1.0,
    clamp: float | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    old_logprobs: Tensor | None = None,
    importance_weight: str = "none",
    weight_cap: float | None = None,
    clamp_mode: str = "value",
    is_weights: Tensor | None = None,
) -> Tensor:
    m = _bl(mask)
    n, t = logprobs.shape
    isw = _fl(is_weights) if is_weights is not None else None
    rows: list[list[Tensor | None]] = [[None] * t for _ in range(n)]
    for i in range(n):
        for s in range(t):
            if not m[i][s]:
                continue
            ell = logprobs[i, s] - ref_logprobs[i, s].detach()
            e = ref.kl_scalar(ell, kind)
            if clamp is not None and clamp_mode == "value":
                e = _clamp_t(e, -clamp, clamp)
            if clamp_mode == "drop" and ell.item() < 0 and e.item() > clamp:
                e = e * 0.0
            if importance_weight != "none":
                assert old_logprobs is not None
                r = torch.exp(logprobs[i, s] - old_logprobs[i, s].detach())
                if weight_cap is not None and r.item() > weight_cap:
                    r = _c(weight_cap)
                if importance_weight == "ratio":
                    e = e * r
                else:
                    sur = r.detach() * 0.5 * ell * ell
                    e = e.detach() + sur - sur.detach()
            if isw is not None:
                e = e * isw[i][s]
            rows[i][s] = e
    return coef * aggregate_rows(rows, t, aggregation, normalizer, max_length)


def ref_clipped_surrogate_tokens(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    level: str,
    pooling: str = "sum",
    turn_ids: Tensor | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> Tensor:
    lo, hi = 1.0 - clip_low, 1.0 + (clip_low if clip_high is None else clip_high)
    units, n, _ = ref._units_of(
        logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, None
    )
    isw = _fl(is_weights) if is_weights is not None else None
    t = logprobs.shape[1]
    rows: list[list[Tensor | None]] = [[None] * t for _ in range(n)]
    for x in units:
        lu = ppo_unit_loss(x.r, x.adv, lo, hi)
        for s in x.toks:
            rows[x.i][s] = lu * (isw[x.i][s] if isw is not None else 1.0)
    return aggregate_rows(rows, t, aggregation, normalizer, max_length)


def ref_luspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "seq_mean_token_sum",
    normalizer: Any = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> Tensor:
    """Sequence form: |y_i| * l_i as the row's 'token sum' (per-sequence advantages only)."""
    assert aggregation == "seq_mean_token_sum"
    m = _bl(mask)
    a = _fl(advantages)
    n, t = logprobs.shape
    rows: list[list[Tensor | None]] = [[None] * t for _ in range(n)]
    for i in range(n):
        toks = [s for s in range(t) if m[i][s]]
        if not toks:
            continue
        ell = _sum([logprobs[i, s] - old_logprobs[i, s].detach() for s in toks]) / len(toks)
        rows[i][toks[0]] = len(toks) * ppo_unit_loss(
            torch.exp(ell), a[i], 1 - clip_low, 1 + clip_high
        )
    return aggregate_rows(rows, t, aggregation, normalizer, None)


def ref_vespo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    is_weights: Tensor | None = None,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    m = _bl(mask)
    adv = _adv(advantages)
    lp, old = _fl(logprobs), _fl(old_logprobs)
    isw = _fl(is_weights) if is_weights is not None else None
    n, t = logprobs.shape
    rows: list[list[Tensor | None]] = [[None] * t for _ in range(n)]
    for i in range(n):
        toks = [s for s in range(t) if m[i][s]]
        log_w = sum(lp[i][s] - old[i][s] for s in toks)
        log_w = min(max(log_w, math.log(1e-8)), 20.0)
        w = math.exp(log_w)
        for s in toks:
            a = adv(i, s)
            k, lam = (k_pos, lambda_pos) if a >= 0 else (k_neg, lambda_neg)
            phi = math.exp(lam) * w**k * math.exp(-lam * w)
            rows[i][s] = -phi * a * logprobs[i, s] * (isw[i][s] if isw is not None else 1.0)
    return aggregate_rows(rows, t, aggregation, normalizer, None)
