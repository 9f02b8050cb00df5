"""Float64 loop references for ``rl_losses``.

Written directly from ``/work/spec/rl_losses_spec.md``, independently of the implementation:
plain Python loops over rows / units / tokens with explicit formulas. Loss references are
differentiable torch computations built from 0-dim tensors (``x[i, t]`` indexing, scalar ops, Python
branches on the scalar's value to pick a min / max / clamp branch), so that gradients w.r.t.
``logprobs`` (and ``values`` for ``value_loss``) can be compared with the implementation through
``torch.autograd.grad``. Invalid positions (mask False) are never read. Advantages, importance
weights and all diagnostics are plain Python floats.

``ref_<name>`` takes the same arguments, with the same keyword names, as ``rl_losses.<name>`` and
returns float64 tensors / simple dataclasses with the same field names.

Readings of the spec chosen here where it is not explicit:

* A unit / row without valid tokens contributes nothing; a diagnostic that is a mean or max over an
  empty set is 0 here (the tests only compare diagnostics when something is valid).
* ``to_units``: invalid units hold 0 (the tests compare valid units only). At level "turn",
  ``U = max(turn_ids) + 1`` over ALL positions (the spec's words), 0 when every id is -1.
* Clip branches: torch's ``clamp`` passes the gradient at the boundary itself (``lo <= r <= hi``);
  ties of a ``min`` inside the band have the same gradient on both sides. Tests keep ratios away
  from the kinks anyway.
* ``gspo_loss(gradient="token")``: ``A_it`` is the token advantage (not pooled) and ``is_weights``
  are per token. Diagnostics are computed over sequences (s_i), but the tests do not compare them
  in token mode (the spec does not say what a unit is there).
* ``gmpo_loss``: diagnostics are computed from the unclipped per-sequence mean log-ratio but the
  tests do not compare them (the spec does not define them).
* ``clip_cov_loss`` / ``kl_cov_loss``: the means in ``cov_t`` are over ALL valid tokens of the
  batch (verl's global masked mean), with ``lp`` detached. ``k`` is capped by the number of
  candidates / valid tokens. The clip-cov reference takes the set of detached tokens as an argument
  (``chosen``); by default it requires that every candidate is chosen (k >= #candidates), which is
  the only deterministic case.
* ``kl_estimate``: with ``clamp`` each estimate (``kind`` and ``grad_kind``) is clamped before the
  straight-through combination (the tests do not combine the two).
* ``rollout_correction``: ``lower`` only applies to mode "mask"; ``ess`` is 0 with no valid unit or
  when ``sum w^2 == 0`` (every unit dropped), else ``(sum w)^2 / (n sum w^2)``; ratio_mean /
  frac_clamped / mismatch_kl are 0 with nothing valid.
* ``value_loss``: ``clip_frac`` is 0 when ``clip`` is None; ``explained_variance`` is 0 when the
  (biased) variance of the valid returns is exactly 0 or nothing is valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

F64 = torch.float64
Tensor = torch.Tensor

__all__ = [
    "RefEntropyOut",
    "RefKLOut",
    "RefPolicyOut",
    "RefRolloutOut",
    "RefValueOut",
    "ref_aggregate",
    "ref_cispo_loss",
    "ref_clip_cov_candidates",
    "ref_clip_cov_loss",
    "ref_clipped_surrogate",
    "ref_cov",
    "ref_entropy_bonus",
    "ref_gmpo_loss",
    "ref_gspo_loss",
    "ref_high_entropy_mask",
    "ref_kl_cov_loss",
    "ref_kl_estimate",
    "ref_kl_penalty",
    "ref_reinforce_loss",
    "ref_rollout_correction",
    "ref_sapo_loss",
    "ref_to_units",
    "ref_value_loss",
]


# --------------------------------------------------------------------------- helpers


def _c(v: float) -> Tensor:
    """A constant (no gradient) 0-dim float64 tensor."""
    return torch.tensor(float(v), dtype=F64)


def _zero() -> Tensor:
    return _c(0.0)


def _bl(mask: Tensor) -> list[list[bool]]:
    return [[bool(b) for b in row] for row in mask.detach().cpu().tolist()]


def _fl(x: Tensor) -> list:
    return x.detach().cpu().to(F64).tolist()


def _sum(vals: list[Any]) -> Any:
    total = vals[0]
    for v in vals[1:]:
        total = total + v
    return total


def _fmean(vals: list[float]) -> float:
    return _sum(vals) / len(vals) if vals else 0.0


def _pool(vals: list[Tensor], pooling: str) -> Tensor:
    if pooling == "sum":
        return _sum(vals)
    if pooling == "mean":
        return _sum(vals) / len(vals)
    raise ValueError(f"pooling {pooling!r}")


def _clamp_t(x: Tensor, lo: float, hi: float) -> Tensor:
    """clamp(x, lo, hi): gradient 1 on [lo, hi] (boundaries included, as torch.clamp), else 0."""
    v = x.item()
    if v < lo:
        return _c(lo)
    if v > hi:
        return _c(hi)
    return x


def _min_t(a: Tensor, b: Tensor) -> Tensor:
    return a if a.item() <= b.item() else b


def _max_t(a: Tensor, b: Tensor) -> Tensor:
    return a if a.item() >= b.item() else b


def _normalizer(normalizer: Any) -> float | None:
    return None if normalizer is None else float(normalizer)


def unit_tokens(
    mask: Tensor, level: str, turn_ids: Tensor | None = None
) -> tuple[list[list[list[int]]], int]:
    """[N][U] lists of the token indices of each unit (empty list = invalid unit), and U."""
    m = _bl(mask)
    n, t = mask.shape
    if level == "token":
        return [[[s] if m[i][s] else [] for s in range(t)] for i in range(n)], t
    if level == "turn":
        assert turn_ids is not None
        ids = turn_ids.tolist()
        k = 0
        for row in ids:
            for v in row:
                k = max(k, int(v) + 1)
        units = [
            [[s for s in range(t) if m[i][s] and int(ids[i][s]) == u] for u in range(k)]
            for i in range(n)
        ]
        return units, k
    if level == "trajectory":
        return [[[s for s in range(t) if m[i][s]]] for i in range(n)], 1
    raise ValueError(f"level {level!r}")


# --------------------------------------------------------------------------- aggregate


def aggregate_rows(  # noqa: PLR0911
    rows: list[list[Tensor | None]],
    u: int,
    mode: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> Tensor:
    """Aggregates per-unit losses given as rows of 0-dim tensors (None = invalid unit)."""
    norm = _normalizer(normalizer)
    counts = [sum(1 for v in row if v is not None) for row in rows]
    valid_rows = [i for i, c in enumerate(counts) if c > 0]
    row_sums = {i: _sum([v for v in rows[i] if v is not None]) for i in valid_rows}
    if mode == "token_mean":
        d = norm if norm is not None else float(sum(counts))
        if d == 0 or not valid_rows:
            return _zero()
        return _sum([row_sums[i] for i in valid_rows]) / d
    d = norm if norm is not None else float(len(valid_rows))
    if d == 0 or not valid_rows:
        return _zero()
    if mode == "seq_mean_token_mean":
        return _sum([row_sums[i] / counts[i] for i in valid_rows]) / d
    if mode == "seq_mean_token_sum":
        return _sum([row_sums[i] for i in valid_rows]) / d
    if mode == "seq_mean_token_sum_norm":
        length = float(max_length) if max_length is not None else float(u)
        if length == 0:
            return _zero()
        return _sum([row_sums[i] for i in valid_rows]) / (d * length)
    raise ValueError(f"mode {mode!r}")


def ref_aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> Tensor:
    m = _bl(mask)
    n, u = loss.shape
    rows = [[loss[i, j] if m[i][j] else None for j in range(u)] for i in range(n)]
    return aggregate_rows(rows, u, mode, normalizer, max_length)


def aggregation_weights(
    mask: Tensor, mode: str, normalizer: Any = None, max_length: int | None = None
) -> Tensor:
    """d aggregate / d loss[i, u] as documented (float64 [N, U], 0 at invalid units)."""
    m = _bl(mask)
    n, u = mask.shape
    norm = _normalizer(normalizer)
    counts = [sum(row) for row in m]
    n_rows = sum(1 for c in counts if c > 0)
    out = [[0.0] * u for _ in range(n)]
    for i in range(n):
        for j in range(u):
            if not m[i][j]:
                continue
            if mode == "token_mean":
                d = norm if norm is not None else float(sum(counts))
                out[i][j] = 1.0 / d
            elif mode == "seq_mean_token_mean":
                d = norm if norm is not None else float(n_rows)
                out[i][j] = 1.0 / (counts[i] * d)
            elif mode == "seq_mean_token_sum":
                d = norm if norm is not None else float(n_rows)
                out[i][j] = 1.0 / d
            elif mode == "seq_mean_token_sum_norm":
                d = norm if norm is not None else float(n_rows)
                length = float(max_length) if max_length is not None else float(u)
                out[i][j] = 1.0 / (d * length)
            else:
                raise ValueError(mode)
    return torch.tensor(out, dtype=F64).reshape(n, u)


# --------------------------------------------------------------------------- units


def ref_to_units(
    x: Tensor,
    mask: Tensor,
    level: str,
    turn_ids: Tensor | None = None,
    pooling: str = "sum",
) -> tuple[Tensor, Tensor]:
    units, u = unit_tokens(mask, level, turn_ids)
    n = x.shape[0]
    rows_x: list[Tensor] = []
    rows_m: list[list[bool]] = []
    for i in range(n):
        vals = []
        ms = []
        for toks in units[i]:
            if toks:
                vals.append(_pool([x[i, s] for s in toks], pooling))
                ms.append(True)
            else:
                vals.append(_zero())
                ms.append(False)
        rows_x.append(torch.stack(vals) if vals else torch.zeros(0, dtype=F64))
        rows_m.append(ms)
    x_u = torch.stack(rows_x) if rows_x else torch.zeros(0, u, dtype=F64)
    return x_u.reshape(n, u), torch.tensor(rows_m, dtype=torch.bool).reshape(n, u)


# --------------------------------------------------------------------------- policy losses


@dataclass
class RefPolicyOut:
    loss: Tensor
    clip_frac_low: Tensor
    clip_frac_high: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    ratio_max: Tensor


@dataclass
class _Unit:
    i: int
    j: int
    toks: list[int]
    ell: Tensor  # pooled log-ratio (differentiable w.r.t. logprobs)
    lp: Tensor  # pooled logprob (differentiable)
    adv: float  # mean-pooled advantage
    w: float  # mean-pooled importance weight (1.0 without is_weights)

    @property
    def r(self) -> Tensor:
        return torch.exp(self.ell)

    @property
    def rv(self) -> float:
        return math.exp(self.ell.item())


def _adv_getter(advantages: Tensor) -> Any:
    a = _fl(advantages)
    if advantages.dim() == 1:
        return lambda i, s: a[i]
    return lambda i, s: a[i][s]


def _units_of(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    level: str,
    pooling: str,
    turn_ids: Tensor | None,
    is_weights: Tensor | None,
) -> tuple[list[_Unit], int, int]:
    tok_units, u = unit_tokens(mask, level, turn_ids)
    adv = _adv_getter(advantages)
    isw = _fl(is_weights) if is_weights is not None else None
    old = old_logprobs.detach()
    out: list[_Unit] = []
    for i, row in enumerate(tok_units):
        for j, toks in enumerate(row):
            if not toks:
                continue
            ell = _pool([logprobs[i, s] - old[i, s] for s in toks], pooling)
            lp = _pool([logprobs[i, s] for s in toks], pooling)
            a = _fmean([adv(i, s) for s in toks])
            w = _fmean([isw[i][s] for s in toks]) if isw is not None else 1.0
            out.append(_Unit(i, j, toks, ell, lp, a, w))
    return out, logprobs.shape[0], u


def _diag(units: list[_Unit], low: list[bool], high: list[bool]) -> dict[str, Tensor]:
    if not units:
        return {k: _zero() for k in ("clip_frac_low", "clip_frac_high", "approx_kl")} | {
            "ratio_mean": _zero(),
            "ratio_max": _zero(),
        }
    rs = [u.rv for u in units]
    ells = [u.ell.item() for u in units]
    return {
        "clip_frac_low": _c(_fmean([1.0 if b else 0.0 for b in low])),
        "clip_frac_high": _c(_fmean([1.0 if b else 0.0 for b in high])),
        "approx_kl": _c(_fmean([(r - 1.0) - e for r, e in zip(rs, ells, strict=True)])),
        "ratio_mean": _c(_fmean(rs)),
        "ratio_max": _c(max(rs)),
    }


def _finish(
    units: list[_Unit],
    losses: list[Tensor],
    n: int,
    u: int,
    aggregation: str,
    normalizer: Any,
    max_length: int | None,
    low: list[bool] | None = None,
    high: list[bool] | None = None,
) -> RefPolicyOut:
    rows: list[list[Tensor | None]] = [[None] * u for _ in range(n)]
    for unit, loss in zip(units, losses, strict=True):
        rows[unit.i][unit.j] = loss * unit.w
    total = aggregate_rows(rows, u, aggregation, normalizer, max_length)
    low = low if low is not None else [False] * len(units)
    high = high if high is not None else [False] * len(units)
    return RefPolicyOut(loss=total, **_diag(units, low, high))


def _bounds(
    clip_low: float, clip_high: float | None, ratio_bounds: tuple[float, float] | None
) -> tuple[float, float]:
    if ratio_bounds is not None:
        return float(ratio_bounds[0]), float(ratio_bounds[1])
    hi = clip_low if clip_high is None else clip_high
    return 1.0 - clip_low, 1.0 + hi


def ppo_unit_loss(
    r: Tensor,
    a: float,
    lo: float,
    hi: float,
    dual_clip: float | None = None,
    delta: float | None = None,
) -> Tensor:
    """l = -min(min(r, delta) A, clip(r, lo, hi) A), then min(l, -c A) where A < 0."""
    r1 = _min_t(r, _c(delta)) if delta else r
    lu = -_min_t(r1 * a, _clamp_t(r, lo, hi) * a)
    if dual_clip is not None and a < 0:
        lu = _min_t(lu, _c(-dual_clip * a))
    return lu


def ref_clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    pooling: str = "sum",
    turn_ids: Tensor | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    delta: float | None = None,
    ratio_bounds: tuple[float, float] | None = None,
) -> RefPolicyOut:
    lo, hi = _bounds(clip_low, clip_high, ratio_bounds)
    units, n, u = _units_of(
        logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights
    )
    losses = [ppo_unit_loss(x.r, x.adv, lo, hi, dual_clip, delta) for x in units]
    low = [x.rv < lo and x.adv < 0 for x in units]
    high = [x.rv > hi and x.adv > 0 for x in units]
    return _finish(units, losses, n, u, aggregation, normalizer, max_length, low, high)


def ref_reinforce_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    pooling: str = "sum",
    turn_ids: Tensor | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    form: str = "logprob",
) -> RefPolicyOut:
    units, n, u = _units_of(
        logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights
    )
    if form == "logprob":
        losses = [-x.adv * x.lp for x in units]
    elif form == "ratio":
        losses = [-x.adv * torch.exp(x.lp - x.lp.detach()) for x in units]
    else:
        raise ValueError(f"form {form!r}")
    return _finish(units, losses, n, u, aggregation, normalizer, max_length)


def ref_gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    gradient: str = "sequence",
) -> RefPolicyOut:
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    seq_units, n, _ = _units_of(
        logprobs, old_logprobs, advantages, mask, "trajectory", "mean", None, is_weights
    )
    low = [x.rv < lo and x.adv < 0 for x in seq_units]
    high = [x.rv > hi and x.adv > 0 for x in seq_units]
    if gradient == "sequence":
        losses = [ppo_unit_loss(x.r, x.adv, lo, hi) for x in seq_units]
        return _finish(seq_units, losses, n, 1, aggregation, normalizer, max_length, low, high)
    if gradient != "token":
        raise ValueError(f"gradient {gradient!r}")
    log_s = {x.i: x.ell.item() for x in seq_units}  # sg(log s_i)
    tok_units, _, t = _units_of(
        logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights
    )
    losses = []
    for x in tok_units:
        lp_t = logprobs[x.i, x.j]
        s_it = torch.exp(log_s[x.i] + lp_t - lp_t.detach())
        losses.append(ppo_unit_loss(s_it, x.adv, lo, hi))
    out = _finish(tok_units, losses, n, t, aggregation, normalizer, max_length)
    diag = _diag(seq_units, low, high)
    return RefPolicyOut(loss=out.loss, **diag)


def ref_cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    pooling: str = "sum",
    turn_ids: Tensor | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    clamp: str = "upper",
    eps_low: float = 0.2,
    eps_high: float = 4.0,
) -> RefPolicyOut:
    units, n, u = _units_of(
        logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights
    )
    losses = []
    for x in units:
        r = x.rv
        if clamp == "upper":
            w = min(r, 1.0 + eps_high)
        elif clamp == "two_sided":
            w = min(max(r, 1.0 - eps_low), 1.0 + eps_high)
        else:
            raise ValueError(f"clamp {clamp!r}")
        losses.append(-w * x.adv * x.lp)
    high = [x.rv > 1.0 + eps_high for x in units]
    low = [clamp == "two_sided" and x.rv < 1.0 - eps_low for x in units]
    return _finish(units, losses, n, u, aggregation, normalizer, max_length, low, high)


def ref_sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    pooling: str = "sum",
    turn_ids: Tensor | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> RefPolicyOut:
    units, n, u = _units_of(
        logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights
    )
    losses = []
    for x in units:
        tau = tau_pos if x.adv > 0 else tau_neg
        g = torch.sigmoid(tau * (x.r - 1.0)) * (4.0 / tau)
        losses.append(-g * x.adv)
    return _finish(units, losses, n, u, aggregation, normalizer, max_length)


def ref_gmpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
) -> RefPolicyOut:
    units, n, _ = _units_of(
        logprobs, old_logprobs, advantages, mask, "trajectory", "mean", None, is_weights
    )
    old = old_logprobs.detach()
    losses = []
    for x in units:
        sgn = (x.adv > 0) - (x.adv < 0)
        ells = []
        for s in x.toks:
            ell = logprobs[x.i, s] - old[x.i, s]
            ell_c = _clamp_t(ell, -clip_low, clip_high)
            ells.append(sgn * _min_t(sgn * ell, sgn * ell_c))
        big_r = torch.exp(_sum(ells) / len(ells))
        losses.append(-x.adv * big_r)
    return _finish(units, losses, n, 1, aggregation, normalizer, max_length)


def ref_cov(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> list[list[float | None]]:
    """cov_t = (A_t - mean A)(lp_t - mean lp), means over all valid tokens (None at invalid)."""
    m = _bl(mask)
    lp = _fl(logprobs)
    adv = _adv_getter(advantages)
    n, t = mask.shape
    valid = [(i, s) for i in range(n) for s in range(t) if m[i][s]]
    if not valid:
        return [[None] * t for _ in range(n)]
    mean_a = _fmean([adv(i, s) for i, s in valid])
    mean_lp = _fmean([lp[i][s] for i, s in valid])
    out: list[list[float | None]] = [[None] * t for _ in range(n)]
    for i, s in valid:
        out[i][s] = (adv(i, s) - mean_a) * (lp[i][s] - mean_lp)
    return out


def _k_of(ratio: float, n_valid: int) -> int:
    return max(1, math.floor(ratio * n_valid))


def ref_clip_cov_candidates(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> tuple[set[tuple[int, int]], int]:
    """(candidate token positions, k) of Clip-Cov."""
    cov = ref_cov(logprobs, advantages, mask)
    cands = {
        (i, s)
        for i, row in enumerate(cov)
        for s, c in enumerate(row)
        if c is not None and clip_cov_lb < c < clip_cov_ub
    }
    n_valid = int(mask.sum())
    return cands, _k_of(clip_cov_ratio, n_valid)


def ref_clip_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    chosen: set[tuple[int, int]] | None = None,
) -> RefPolicyOut:
    """``chosen``: detached token positions; None -> all candidates (requires k >= #candidates).
    ``generator`` is accepted for signature compatibility and ignored."""
    del generator
    if chosen is None:
        cands, k = ref_clip_cov_candidates(
            logprobs, advantages, mask, clip_cov_ratio, clip_cov_lb, clip_cov_ub
        )
        assert k >= len(cands), "random choice: pass `chosen`"
        chosen = cands
    lo, hi = _bounds(clip_low, clip_high, None)
    units, n, t = _units_of(
        logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights
    )
    losses = []
    for x in units:
        lu = ppo_unit_loss(x.r, x.adv, lo, hi)
        losses.append(lu.detach() if (x.i, x.j) in chosen else lu)
    low = [x.rv < lo and x.adv < 0 for x in units]
    high = [x.rv > hi and x.adv > 0 for x in units]
    return _finish(units, losses, n, t, aggregation, normalizer, max_length, low, high)


def ref_kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
    is_weights: Tensor | None = None,
    kl_cov_ratio: float = 2e-3,
    kl_coef: float = 1.0,
) -> RefPolicyOut:
    cov = ref_cov(logprobs, advantages, mask)
    units, n, t = _units_of(
        logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights
    )
    k = min(_k_of(kl_cov_ratio, len(units)), len(units))
    order = sorted(units, key=lambda x: -float(cov[x.i][x.j]))  # type: ignore[arg-type]
    top = {(x.i, x.j) for x in order[:k]}
    losses = []
    for x in units:
        lu = -x.r * x.adv
        if (x.i, x.j) in top:
            lu = lu + kl_coef * torch.abs(x.ell)
        losses.append(lu)
    return _finish(units, losses, n, t, aggregation, normalizer, max_length)


# --------------------------------------------------------------------------- value loss


@dataclass
class RefValueOut:
    loss: Tensor
    clip_frac: Tensor
    value_mean: Tensor
    explained_variance: Tensor


def _err(x: Tensor, huber_delta: float | None) -> Tensor:
    if huber_delta is None or abs(x.item()) <= huber_delta:
        return 0.5 * x * x
    return huber_delta * (torch.abs(x) - 0.5 * huber_delta)


def _fvar(xs: list[float]) -> float:
    m = _fmean(xs)
    return _fmean([(v - m) * (v - m) for v in xs])


def ref_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = None,
    huber_delta: float | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> RefValueOut:
    m = _bl(mask)
    n, u = values.shape
    old = _fl(old_values)
    ret = _fl(returns)
    vals = _fl(values)
    rows: list[list[Tensor | None]] = [[None] * u for _ in range(n)]
    clipped_flags, vs, rs, diffs = [], [], [], []
    for i in range(n):
        for j in range(u):
            if not m[i][j]:
                continue
            v = values[i, j]
            lu = _err(v - ret[i][j], huber_delta)
            if clip is not None:
                vc = old[i][j] + _clamp_t(v - old[i][j], -clip, clip)
                lu = _max_t(lu, _err(vc - ret[i][j], huber_delta))
                clipped_flags.append(abs(vals[i][j] - old[i][j]) > clip)
            rows[i][j] = lu
            vs.append(vals[i][j])
            rs.append(ret[i][j])
            diffs.append(ret[i][j] - vals[i][j])
    var_r = _fvar(rs) if rs else 0.0
    ev = 1.0 - _fvar(diffs) / var_r if var_r != 0 else 0.0
    return RefValueOut(
        loss=aggregate_rows(rows, u, aggregation, normalizer, max_length),
        clip_frac=_c(_fmean([1.0 if b else 0.0 for b in clipped_flags])),
        value_mean=_c(_fmean(vs)),
        explained_variance=_c(ev),
    )


# --------------------------------------------------------------------------- KL


def kl_scalar(ell: Tensor, kind: str) -> Tensor:
    if kind == "k1":
        return ell
    if kind == "k2":
        return 0.5 * ell * ell
    if kind == "k3":
        return torch.exp(-ell) - 1.0 + ell
    if kind == "abs":
        return torch.abs(ell)
    raise ValueError(f"kind {kind!r}")


def _kl_one(ell: Tensor, kind: str, clamp: float | None, grad_kind: str | None) -> Tensor:
    def est(k: str) -> Tensor:
        e = kl_scalar(ell, k)
        return _clamp_t(e, -clamp, clamp) if clamp is not None else e

    e_kind = est(kind)
    if grad_kind is None:
        return e_kind
    e_g = est(grad_kind)
    return e_g + (e_kind - e_g).detach()


def ref_kl_estimate(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    kind: str = "k3",
    *,
    clamp: float | None = None,
    grad_kind: str | None = None,
) -> Tensor:
    n, t = logprobs.shape
    rows = []
    for i in range(n):
        rows.append(
            torch.stack(
                [
                    _kl_one(logprobs[i, s] - ref_logprobs[i, s], kind, clamp, grad_kind)
                    for s in range(t)
                ]
            )
            if t
            else torch.zeros(0, dtype=F64)
        )
    return torch.stack(rows).reshape(n, t) if rows else torch.zeros(0, t, dtype=F64)


@dataclass
class RefKLOut:
    loss: Tensor
    kl_mean: Tensor
    kl_max: Tensor


def ref_kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    kind: str = "k3",
    coef: float = 1.0,
    clamp: float | None = None,
    grad_kind: str | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> RefKLOut:
    m = _bl(mask)
    n, t = logprobs.shape
    rows: list[list[Tensor | None]] = [[None] * t for _ in range(n)]
    ests: list[float] = []
    for i in range(n):
        for s in range(t):
            if m[i][s]:
                e = _kl_one(logprobs[i, s] - ref_logprobs[i, s], kind, clamp, grad_kind)
                rows[i][s] = e
                ests.append(e.item())
    return RefKLOut(
        loss=coef * aggregate_rows(rows, t, aggregation, normalizer, max_length),
        kl_mean=_c(_fmean(ests)),
        kl_max=_c(max(ests) if ests else 0.0),
    )


# --------------------------------------------------------------------------- entropy


@dataclass
class RefEntropyOut:
    loss: Tensor
    entropy_mean: Tensor


def ref_entropy_bonus(
    entropies: Tensor,
    mask: Tensor,
    *,
    coef: float = 0.0,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> RefEntropyOut:
    m = _bl(mask)
    n, t = entropies.shape
    rows = [[entropies[i, s] if m[i][s] else None for s in range(t)] for i in range(n)]
    vals = [entropies[i, s].item() for i in range(n) for s in range(t) if m[i][s]]
    loss = -coef * aggregate_rows(rows, t, aggregation, normalizer, max_length)
    return RefEntropyOut(loss=loss, entropy_mean=_c(_fmean(vals)))


def _lerp(a: float, b: float, w: float) -> float:
    # torch.lerp's formula (exact at w = 0 and w = 1)
    return a + w * (b - a) if w < 0.5 else b - (b - a) * (1.0 - w)


def ref_high_entropy_mask(entropies: Tensor, mask: Tensor, top_quantile: float = 0.2) -> Tensor:
    m = _bl(mask)
    e = _fl(entropies)
    n, t = entropies.shape
    vals = sorted(e[i][s] for i in range(n) for s in range(t) if m[i][s])
    out = [[False] * t for _ in range(n)]
    if not vals:
        return torch.tensor(out, dtype=torch.bool).reshape(n, t)
    q = 1.0 - top_quantile
    pos = q * (len(vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    thr = _lerp(vals[lo], vals[hi], pos - lo)
    for i in range(n):
        for s in range(t):
            out[i][s] = m[i][s] and e[i][s] >= thr
    return torch.tensor(out, dtype=torch.bool).reshape(n, t)


# --------------------------------------------------------------------------- rollout correction


@dataclass
class RefRolloutOut:
    weights: Tensor
    mask: Tensor
    ratio_mean: Tensor
    frac_clamped: Tensor
    ess: Tensor
    mismatch_kl: Tensor


def ref_rollout_correction(  # noqa: PLR0912
    old_logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    lower: float | None = None,
) -> RefRolloutOut:
    m = _bl(mask)
    old = _fl(old_logprobs)
    samp = _fl(sampling_logprobs)
    n, t = mask.shape
    # units: (list of token positions, rho)
    units: list[tuple[list[tuple[int, int]], float]] = []
    if level == "token":
        for i in range(n):
            for s in range(t):
                if m[i][s]:
                    units.append(([(i, s)], math.exp(old[i][s] - samp[i][s])))
    elif level == "sequence":
        for i in range(n):
            toks = [(i, s) for s in range(t) if m[i][s]]
            if toks:
                units.append((toks, math.exp(_sum([old[i][s] - samp[i][s] for _, s in toks]))))
    else:
        raise ValueError(f"level {level!r}")
    weights = [[0.0] * t for _ in range(n)]
    mask_out = [list(row) for row in m]
    ws: list[float] = []
    flagged: list[bool] = []
    for toks, rho in units:
        if mode == "truncate":
            w = min(rho, cap)
            flagged.append(rho > cap)
        elif mode == "mask":
            keep = rho <= cap and (rho >= lower if lower else True)
            w = rho if keep else 0.0
            flagged.append(not keep)
            if not keep:
                for i, s in toks:
                    mask_out[i][s] = False
        else:
            raise ValueError(f"mode {mode!r}")
        ws.append(w)
        for i, s in toks:
            weights[i][s] = w
    if not ws:
        ess = 0.0
    else:
        sw = _sum(ws)
        sw2 = _sum([w * w for w in ws])
        ess = 0.0 if sw2 == 0 else sw * sw / (len(ws) * sw2)
    kls = [
        math.exp(old[i][s] - samp[i][s]) - 1.0 + (samp[i][s] - old[i][s])
        for i in range(n)
        for s in range(t)
        if m[i][s]
    ]
    return RefRolloutOut(
        weights=torch.tensor(weights, dtype=F64).reshape(n, t),
        mask=torch.tensor(mask_out, dtype=torch.bool).reshape(n, t),
        ratio_mean=_c(_fmean([rho for _, rho in units])),
        frac_clamped=_c(_fmean([1.0 if f else 0.0 for f in flagged])),
        ess=_c(ess),
        mismatch_kl=_c(_fmean(kls)),
    )
