"""Policy objectives beyond the PPO/REINFORCE/GSPO/CISPO core: SAPO, GMPO, Clip-Cov, KL-Cov.

Same conventions as :mod:`rl_losses.policy` (which re-exports all of them): per-token
``logprobs``, ``old_logprobs``, ``advantages`` ([N] or [N, T]) and ``mask`` [N, T], a loss per
importance-sampling unit reduced with :func:`rl_losses.aggregate`, optional detached
``is_weights``; losses are to be minimised.
"""

from __future__ import annotations

import torch

from rl_losses._policy_common import (
    UnitWeight,
    _bounds,
    _clip_objective,
    _finish,
    _masked_mean,
    _prepare,
    _Units,
)
from rl_losses.aggregate import Aggregation
from rl_losses.outputs import PolicyLossOutput
from rl_losses.units import Level, Pooling, to_units

__all__ = ["clip_cov_loss", "gmpo_loss", "kl_cov_loss", "sapo_loss"]


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
    unit_weight: UnitWeight = "unit",
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> PolicyLossOutput:
    r"""Soft Adaptive Policy Optimization (Gao et al., arXiv 2511.20347, eqs. 5-6).

    .. math:: l_u = -g_\tau(r_u) A_u, \qquad g_\tau(r) = \frac{4}{\tau}\,\sigma(\tau (r - 1)),
              \qquad \tau = \tau_{pos} \text{ if } A_u > 0 \text{ else } \tau_{neg}

    A smooth gate instead of a hard clip: at :math:`r = 1` the gradient equals the plain policy
    gradient, and it decays smoothly off-policy (faster for negative advantages with
    :math:`\tau_{neg} > \tau_{pos}`). Clip fractions are reported as 0.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``aggregation="seq_mean_token_mean"`` (verl forces it).
    * TRL 1.16.0: equal with ``aggregation="seq_mean_token_mean", normalizer=N``.
    * Liger 0.8.5: equal with as TRL.
    * No counterpart: OpenRLHF, AgileRL.

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
        unit_weight: See :func:`clipped_surrogate`.
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
    return _finish(
        loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length, unit_weight
    )


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

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``normalizer=N`` (``geo_mean`` divides by every row, empty ones
      included; ours by rows with a valid token).
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

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

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: differs by design: gradients equal (checked); the logged loss value differs:
      verl multiplies the detached tokens' loss by 0, ours keeps their (gradient-free) value in.
      verl also skips tokens its PPO clip already clipped, which have no gradient either way.
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

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

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``kl_cov_ratio``, ``kl_coef=ppo_kl_coef``.
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

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
