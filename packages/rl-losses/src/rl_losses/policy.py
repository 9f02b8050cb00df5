"""Policy objectives: PPO clip family, REINFORCE, GSPO, CISPO, SAPO, GMPO, Clip-Cov, KL-Cov.

Every objective takes per-token ``logprobs`` (current policy, with gradient), ``old_logprobs``
(the policy that generated or last scored the batch, no gradient), ``advantages`` ([N] per
sequence or [N, T] per token) and ``mask`` [N, T], chooses its importance-sampling unit
(``level``), computes a loss per unit and reduces it with :func:`rl_losses.aggregate`.
Optional ``is_weights`` [N, T] (from :func:`rl_losses.rollout_correction`) multiply the
per-unit loss, detached. Losses are to be minimised.
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
    check_same_shape,
    check_tensor,
    shape_str,
    zero_fill,
)
from rl_losses.aggregate import AGGREGATIONS, Aggregation, aggregate
from rl_losses.outputs import PolicyLossOutput
from rl_losses.units import Level, Pooling, to_units

__all__ = [
    "cispo_loss",
    "clip_cov_loss",
    "clipped_surrogate",
    "gmpo_loss",
    "gspo_loss",
    "kl_cov_loss",
    "reinforce_loss",
    "sapo_loss",
]


@dataclass(frozen=True)
class _Units:
    """Validated inputs pooled to units."""

    logratio: torch.Tensor  # [N, U] pooled log pi - log pi_old (differentiable)
    logprobs: torch.Tensor  # [N, U] pooled log pi (differentiable)
    advantages: torch.Tensor  # [N, U] mean-pooled, detached
    weights: torch.Tensor | None  # [N, U] mean-pooled is_weights, detached
    mask: torch.Tensor  # [N, U]


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
    m = as_mask(mask, "logprobs", logprobs)
    adv = _token_advantages(advantages, logprobs)
    check_finite("logprobs", logprobs, m)
    check_finite("old_logprobs", old_logprobs, m)
    check_finite("advantages", adv, m)
    lp = zero_fill(logprobs, m)
    logratio = lp - zero_fill(old_logprobs.detach(), m)
    ratio_u, mask_u = to_units(logratio, m, level, turn_ids, pooling)
    lp_u, _ = to_units(lp, m, level, turn_ids, pooling)
    adv_u, _ = to_units(adv.detach().to(lp.dtype), m, level, turn_ids, "mean")
    w_u = None
    if is_weights is not None:
        check_same_shape("is_weights", is_weights, "logprobs", logprobs)
        check_finite("is_weights", is_weights, m)
        w_u, _ = to_units(is_weights.detach().to(lp.dtype), m, level, turn_ids, "mean")
    return _Units(ratio_u, lp_u, adv_u, w_u, mask_u)


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
) -> PolicyLossOutput:
    check_choice("aggregation", aggregation, AGGREGATIONS)
    m = units.mask
    if units.weights is not None:
        loss_u = loss_u * units.weights
    loss = aggregate(loss_u, m, aggregation, normalizer, max_length)
    with torch.no_grad():
        r = ratio.detach()
        lr = logratio.detach()
        fdtype = r.dtype
        ratio_max = (
            torch.where(m, r, torch.full_like(r, float("-inf"))).amax()
            if m.any()
            else (r.new_zeros(()))
        )
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
        if not lo < hi:
            raise ValueError(
                f"`ratio_bounds` must be (low, high) absolute ratio bounds with low < high, got "
                f"{ratio_bounds}"
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


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Level = "token",
    pooling: Pooling = "sum",
    turn_ids: torch.Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    delta: float | None = None,
    ratio_bounds: tuple[float, float] | None = None,
) -> PolicyLossOutput:
    r"""PPO clipped surrogate (Schulman et al., arXiv 1707.06347, eq. 7) and its variants.

    .. math:: l_u = -\min\big(\min(r_u, \delta) A_u,\;
              \operatorname{clip}(r_u, 1 - \epsilon_{low}, 1 + \epsilon_{high}) A_u\big),
              \qquad r_u = \exp(\textstyle\text{pool}_u(\log\pi - \log\pi_{old}))

    * symmetric clip: ``clip_low`` (= ``clip_high``); GRPO (arXiv 2402.03300, eq. 3) is this
      objective with group-relative advantages.
    * clip-higher: ``clip_high > clip_low`` (DAPO, arXiv 2503.14476, eq. 10; 0.2 / 0.28).
    * ``ratio_bounds=(lo, hi)``: absolute ratio bounds instead (AgileRL's tuple ``clip_coef``).
    * dual-clip: for :math:`A < 0`, :math:`l = \min(l, -c A)` with ``dual_clip`` = c > 1
      (Ye et al., arXiv 1912.09729, eq. 5; verl ``clip_ratio_c`` = 3).
    * two-sided cap ``delta``: the unclipped ratio is capped at :math:`\delta`
      (INTELLECT-2, arXiv 2505.07291, Sec. 3.3; TRL ``delta``).

    Args:
        logprobs: [N, T] log-probs of the taken tokens under the current policy.
        old_logprobs: [N, T] log-probs under the behaviour policy (no gradient).
        advantages: [N] per sequence or [N, T] per token.
        mask: [N, T] bool, True at tokens that count.
        level: Importance-sampling unit: ``"token"``, ``"turn"`` or ``"trajectory"``.
        pooling: ``"sum"`` (product ratio) or ``"mean"`` (geometric) of log-ratios per unit.
        turn_ids: [N, T] turn index per token (-1 elsewhere); needed for ``level="turn"``.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator for gradient accumulation, see ``aggregate``.
        max_length: :math:`L` of ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached per-token weights (rollout correction), mean-pooled.
        clip_low: :math:`\epsilon_{low}` in [0, 1).
        clip_high: :math:`\epsilon_{high}` (default ``clip_low``).
        dual_clip: c > 1 for the dual clip, or None.
        delta: Cap of the unclipped ratio (> upper bound), or None.
        ratio_bounds: Absolute ``(lo, hi)`` bounds, overriding ``clip_low``/``clip_high``.

    Returns:
        :class:`PolicyLossOutput`.
    """
    lo, hi = _bounds(clip_low, clip_high, ratio_bounds)
    _check_clip_extras(hi, dual_clip, delta)
    u = _prepare(logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights)
    ratio = torch.exp(u.logratio)
    loss_u, low, high = _clip_objective(ratio, u.advantages, lo, hi, dual_clip, delta)
    return _finish(loss_u, u, ratio, u.logratio, low, high, aggregation, normalizer, max_length)


def reinforce_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Level = "token",
    pooling: Pooling = "sum",
    turn_ids: torch.Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    form: Literal["logprob", "ratio"] = "logprob",
) -> PolicyLossOutput:
    r"""Plain REINFORCE, no ratio and no clipping (Williams 1992; GPG, arXiv 2504.02546, eq. 5).

    .. math:: l_u = -A_u \log\pi(u) \;(\text{form="logprob"}), \qquad
              l_u = -A_u\, e^{\log\pi(u) - \operatorname{sg}(\log\pi(u))} \;(\text{form="ratio"})

    Both have the gradient :math:`-A_u \nabla \log\pi(u)`; the ``"ratio"`` form has the value
    :math:`-A_u`, which is what the clipped surrogate evaluates to at ratio 1 (on-policy). verl's
    ``gpg`` loss is the ``"logprob"`` form. ``old_logprobs`` feed only the diagnostics.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs (diagnostics only).
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        level: Unit, as in :func:`clipped_surrogate`.
        pooling: Pooling of log-probs per unit.
        turn_ids: [N, T] for ``level="turn"``.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        form: ``"logprob"`` or ``"ratio"``.

    Returns:
        :class:`PolicyLossOutput` (clip fractions are 0).
    """
    check_choice("form", form, ("logprob", "ratio"))
    u = _prepare(logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights)
    lp = u.logprobs
    score = lp if form == "logprob" else torch.exp(lp - lp.detach())
    loss_u = -u.advantages * score
    ratio = torch.exp(u.logratio)
    none = torch.zeros_like(u.mask)
    return _finish(loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    gradient: Literal["sequence", "token"] = "sequence",
) -> PolicyLossOutput:
    r"""Group Sequence Policy Optimization (Zheng et al., arXiv 2507.18071, eqs. 5-7 and 10).

    .. math:: s_i = \exp\Big(\frac{1}{|y_i|}\sum_t \log\frac{\pi(y_{i,t})}{\pi_{old}(y_{i,t})}
              \Big), \qquad l_i = -\min\big(s_i A_i, \operatorname{clip}(s_i, 1-\epsilon_l,
              1+\epsilon_h) A_i\big)

    Two gradient forms exist in the wild, chosen by ``gradient``:

    * ``"sequence"`` (the paper's GSPO, TRL ``importance_sampling_level="sequence"``,
      OpenRLHF, AgileRL ``trajectory`` level): one unit per sequence.
    * ``"token"`` (GSPO-token, eq. 10; verl's ``gspo``): per-token ratio
      :math:`s_{i,t} = \operatorname{sg}(s_i)\,\pi(y_{i,t}) / \operatorname{sg}(\pi(y_{i,t}))`,
      equal in value to :math:`s_i`, with per-token advantages allowed and a per-token
      reduction. With ``aggregation="seq_mean_token_mean"`` (verl forces it) and sequence
      advantages it matches the sequence form exactly, value and gradient.

    The paper's clip range is tiny (3e-4 / 4e-4) because :math:`s_i` is length-normalised.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T] (mean-pooled per sequence for ``"sequence"``).
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate` (over sequences or tokens).
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        clip_low: :math:`\epsilon_l` in [0, 1).
        clip_high: :math:`\epsilon_h` >= 0.
        gradient: ``"sequence"`` or ``"token"``.

    Returns:
        :class:`PolicyLossOutput` (diagnostics over sequences, or tokens for ``"token"``).
    """
    check_choice("gradient", gradient, ("sequence", "token"))
    lo, hi = _bounds(clip_low, clip_high, None)
    if gradient == "sequence":
        u = _prepare(
            logprobs, old_logprobs, advantages, mask, "trajectory", "mean", None, is_weights
        )
        ratio = torch.exp(u.logratio)
        loss_u, low, high = _clip_objective(ratio, u.advantages, lo, hi, None, None)
        return _finish(loss_u, u, ratio, u.logratio, low, high, aggregation, normalizer, max_length)
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    seq_logratio, _ = to_units(u.logratio, u.mask, "trajectory", None, "mean")  # [N, 1]
    lp = u.logprobs
    token_logratio = seq_logratio.detach() + lp - lp.detach()
    token_logratio = zero_fill(token_logratio, u.mask)
    ratio = torch.exp(token_logratio)
    loss_u, low, high = _clip_objective(ratio, u.advantages, lo, hi, None, None)
    return _finish(loss_u, u, ratio, token_logratio, low, high, aggregation, normalizer, max_length)


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Level = "token",
    pooling: Pooling = "sum",
    turn_ids: torch.Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    clamp: Literal["upper", "two_sided"] = "upper",
    eps_low: float = 0.2,
    eps_high: float = 4.0,
) -> PolicyLossOutput:
    r"""Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, eqs. 4-5).

    .. math:: l_u = -\operatorname{sg}\big(\hat r_u\big)\, A_u \log\pi(u), \qquad
              \hat r_u = \min(r_u, 1+\epsilon_{high}) \;\text{(upper)} \;\text{or}\;
              \operatorname{clip}(r_u, 1-\epsilon_{low}, 1+\epsilon_{high}) \;\text{(two-sided)}

    The importance weight is clipped and detached, so no token ever loses its gradient to
    clipping (unlike PPO). ``clamp="upper"`` follows the paper (which sets no lower bound),
    TRL, Liger and AgileRL 2.58; ``"two_sided"`` follows verl and AgileRL 2.9. TRL's
    ``epsilon_high`` is an absolute cap (5.0), i.e. our ``1 + eps_high`` with the default 4.0.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        level: Unit, as in :func:`clipped_surrogate`.
        pooling: Pooling of log-ratios and log-probs per unit.
        turn_ids: [N, T] for ``level="turn"``.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        clamp: ``"upper"`` or ``"two_sided"``.
        eps_low: Lower offset (two-sided only), in [0, 1).
        eps_high: Upper offset, >= 0.

    Returns:
        :class:`PolicyLossOutput`.
    """
    check_choice("clamp", clamp, ("upper", "two_sided"))
    lo, hi = _bounds(eps_low, eps_high, None)
    u = _prepare(logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights)
    ratio = torch.exp(u.logratio)
    if clamp == "upper":
        weight = ratio.clamp(max=hi)
        low = torch.zeros_like(u.mask)
    else:
        weight = ratio.clamp(lo, hi)
        low = ratio < lo
    loss_u = -weight.detach() * u.advantages * u.logprobs
    return _finish(
        loss_u, u, ratio, u.logratio, low, ratio > hi, aggregation, normalizer, max_length
    )


def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Level = "token",
    pooling: Pooling = "sum",
    turn_ids: torch.Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> PolicyLossOutput:
    r"""Soft Adaptive Policy Optimization (Gao et al., arXiv 2511.20347, eqs. 5-6).

    .. math:: l_u = -g_\tau(r_u) A_u, \qquad g_\tau(r) = \frac{4}{\tau}\,\sigma(\tau (r - 1)),
              \qquad \tau = \tau_{pos} \text{ if } A_u > 0 \text{ else } \tau_{neg}

    A smooth gate instead of a hard clip: at :math:`r = 1` the gradient equals the plain policy
    gradient, and it decays smoothly off-policy (faster for negative advantages with
    :math:`\tau_{neg} > \tau_{pos}`). Clip fractions are reported as 0.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        level: Unit, as in :func:`clipped_surrogate`.
        pooling: Pooling of log-ratios per unit.
        turn_ids: [N, T] for ``level="turn"``.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        tau_pos: Temperature for positive advantages (> 0).
        tau_neg: Temperature for non-positive advantages (> 0).

    Returns:
        :class:`PolicyLossOutput`.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"`tau_pos` and `tau_neg` must be > 0, got {tau_pos}, {tau_neg}")
    u = _prepare(logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights)
    ratio = torch.exp(u.logratio)
    tau = torch.full_like(ratio, tau_neg).masked_fill(u.advantages > 0, tau_pos)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    loss_u = -gate * u.advantages
    none = torch.zeros_like(u.mask)
    return _finish(loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length)


def gmpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
) -> PolicyLossOutput:
    r"""Geometric-Mean Policy Optimization (Zhao et al., arXiv 2507.20673, eq. 5).

    .. math:: R_i = \exp\Big(\frac{1}{|y_i|}\sum_t \operatorname{sgn}(A_i)\min\big(
              \operatorname{sgn}(A_i)\,\ell_t,\; \operatorname{sgn}(A_i)
              \operatorname{clip}(\ell_t, -\epsilon_l, \epsilon_h)\big)\Big),
              \qquad l_i = -A_i R_i

    with :math:`\ell_t = \log\pi - \log\pi_{old}`: a token-level, sign-aware clip in log space
    (the paper's range is :math:`(e^{-0.4}, e^{0.4})`), then the geometric mean of the token
    ratios, which is far less sensitive to outlier tokens than the arithmetic mean. One unit
    per sequence (verl's ``geo_mean``).

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T] (mean-pooled per sequence).
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate` (over sequences).
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        clip_low: :math:`\epsilon_l` >= 0, in log space.
        clip_high: :math:`\epsilon_h` >= 0, in log space.

    Returns:
        :class:`PolicyLossOutput`; ratios are the unclipped geometric means, clip fractions
        compare them with :math:`e^{-\epsilon_l}, e^{\epsilon_h}`.
    """
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(f"`clip_low` and `clip_high` must be >= 0, got {clip_low}, {clip_high}")
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    seq = _prepare(logprobs, old_logprobs, advantages, mask, "trajectory", "mean", None, is_weights)
    sign = torch.sign(seq.advantages)  # [N, 1]
    ell = u.logratio
    clipped = ell.clamp(-clip_low, clip_high)
    ell_min = sign * torch.minimum(sign * ell, sign * clipped)
    geo_log, _ = to_units(ell_min, u.mask, "trajectory", None, "mean")
    loss_u = -seq.advantages * torch.exp(geo_log)
    ratio = torch.exp(seq.logratio)
    low = (seq.logratio < -clip_low) & (seq.advantages < 0)
    high = (seq.logratio > clip_high) & (seq.advantages > 0)
    return _finish(loss_u, seq, ratio, seq.logratio, low, high, aggregation, normalizer, max_length)


def _centred_covariance(units: _Units) -> torch.Tensor:
    """Per-token (A - mean A)(log pi - mean log pi) over valid tokens, detached."""
    m = units.mask
    adv = units.advantages
    lp = units.logprobs.detach()
    return (adv - _masked_mean(adv, m)) * (lp - _masked_mean(lp, m))


def clip_cov_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    r"""Clip-Cov (Cui et al., arXiv 2505.22617, Sec. 5): detach high-covariance tokens.

    From "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models".

    Entropy collapses through tokens with a large covariance between log-prob and advantage,
    :math:`c_t = (A_t - \bar A)(\log\pi_t - \overline{\log\pi})`. Clip-Cov picks
    :math:`k = \max(1, \lfloor \rho\, n \rfloor)` tokens at random among those with
    :math:`lb < c_t < ub` and detaches their gradient; the rest get the clipped surrogate.
    Token level only.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        clip_low: PPO :math:`\epsilon_{low}`.
        clip_high: PPO :math:`\epsilon_{high}` (default ``clip_low``).
        clip_cov_ratio: :math:`\rho`, fraction of valid tokens to detach.
        clip_cov_lb: Lower covariance bound.
        clip_cov_ub: Upper covariance bound.
        generator: Random generator for the choice (reproducibility).

    Returns:
        :class:`PolicyLossOutput`.
    """
    lo, hi = _bounds(clip_low, clip_high, None)
    if not 0 < clip_cov_ratio <= 1:
        raise ValueError(f"`clip_cov_ratio` must be in (0, 1], got {clip_cov_ratio}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"`clip_cov_lb` must be < `clip_cov_ub`, got {clip_cov_lb}, {clip_cov_ub}")
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    ratio = torch.exp(u.logratio)
    loss_u, low, high = _clip_objective(ratio, u.advantages, lo, hi, None, None)
    cov = _centred_covariance(u)
    candidates = (u.mask & (cov > clip_cov_lb) & (cov < clip_cov_ub)).nonzero()
    k = max(1, int(clip_cov_ratio * int(u.mask.sum())))
    if len(candidates):
        order = torch.randperm(len(candidates), generator=generator).to(candidates.device)
        chosen = candidates[order[:k]]
        detach = torch.zeros_like(u.mask)
        detach[chosen[:, 0], chosen[:, 1]] = True
        loss_u = torch.where(detach, loss_u.detach(), loss_u)
    return _finish(loss_u, u, ratio, u.logratio, low, high, aggregation, normalizer, max_length)


def kl_cov_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    kl_cov_ratio: float = 2e-3,
    kl_coef: float = 1.0,
) -> PolicyLossOutput:
    r"""KL-Cov (Cui et al., arXiv 2505.22617, Sec. 5): a KL penalty on high-covariance tokens.

    .. math:: l_t = -r_t A_t + \mathbb 1[t \in \text{top-}k(c)]\; \beta\, |\log r_t|

    with :math:`c_t` the centred covariance of :func:`clip_cov_loss` and
    :math:`k = \max(1, \lfloor \rho\, n \rfloor)`. No ratio clipping. Token level only.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        kl_cov_ratio: :math:`\rho`, fraction of valid tokens penalised.
        kl_coef: :math:`\beta` (>= 0).

    Returns:
        :class:`PolicyLossOutput` (clip fractions are 0).
    """
    if not 0 < kl_cov_ratio <= 1:
        raise ValueError(f"`kl_cov_ratio` must be in (0, 1], got {kl_cov_ratio}")
    if not kl_coef >= 0:
        raise ValueError(f"`kl_coef` must be >= 0, got {kl_coef}")
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    ratio = torch.exp(u.logratio)
    loss_u = -ratio * u.advantages
    n_valid = int(u.mask.sum())
    if n_valid:
        k = max(1, int(kl_cov_ratio * n_valid))
        cov = torch.where(u.mask, _centred_covariance(u), float("-inf"))
        top = cov.reshape(-1).topk(k).indices
        chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
        chosen[top] = True
        penalty = kl_coef * u.logratio.abs()
        loss_u = loss_u + torch.where(chosen.view_as(cov), penalty, 0.0)
    none = torch.zeros_like(u.mask)
    return _finish(loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length)
