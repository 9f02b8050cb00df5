"""Policy objectives: PPO clip family, REINFORCE, GSPO, CISPO, SAPO, GMPO, Clip-Cov, KL-Cov.

Every objective takes per-token ``logprobs`` (current policy, with gradient), ``old_logprobs``
(the policy that generated or last scored the batch, no gradient), ``advantages`` ([N] per
sequence or [N, T] per token) and ``mask`` [N, T], chooses its importance-sampling unit
(``level``), computes a loss per unit and reduces it with :func:`rl_losses.aggregate`.
Optional ``is_weights`` [N, T] (from :func:`rl_losses.rollout_correction`) multiply the
per-unit loss, detached. Losses are to be minimised.

The PPO clip family, REINFORCE, GSPO and CISPO are defined here; SAPO, GMPO, Clip-Cov and
KL-Cov live in :mod:`rl_losses.policy_variants` (re-exported here); LUSPO and VESPO, which build
on GSPO, in :mod:`rl_losses.policy_sequence`. Every objective can be imported from
``rl_losses``. The shared helpers are in ``rl_losses._policy_common``.
"""

from __future__ import annotations

from typing import Literal

import torch

from rl_losses._checks import check_choice, zero_fill
from rl_losses._policy_common import (
    UnitWeight,
    _bounds,
    _check_clip_extras,
    _clip_objective,
    _finish,
    _prepare,
)
from rl_losses.aggregate import Aggregation
from rl_losses.outputs import PolicyLossOutput
from rl_losses.policy_variants import clip_cov_loss, gmpo_loss, kl_cov_loss, sapo_loss
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
    unit_weight: UnitWeight = "unit",
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

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``clip_low``, ``clip_high``, ``dual_clip=3.0`` (``clip_ratio_c``);
      ``aggregation`` per ``loss_agg_mode``.
    * OpenRLHF 0.11.2: equal with token mean; ``token_level_loss=False``:
      ``aggregation="seq_mean_token_mean"``; ``dual_clip``; rollout correction through
      ``is_weights``.
    * TRL 1.16.0: equal with ``dapo``/``bnpo``: token mean; ``grpo``: ``seq_mean_token_mean,
      normalizer=N``; ``dr_grpo``: ``seq_mean_token_sum_norm, normalizer=N,
      max_length=max_completion_length``; ``delta``; off-policy mask and vLLM ratio as
      ``is_weights``.
    * Liger 0.8.5: equal with as TRL (``grpo`` with ``normalizer=N``).
    * AgileRL 2.58.0: equal with ``clip_low=c``; window token mean; ``micro_batch``:
      ``seq_mean_token_mean, normalizer=N``; turn / trajectory levels: ``pooling="mean",
      unit_weight="tokens"``; masks and TIS as ``is_weights``.

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
        unit_weight: ``"unit"``: each turn / trajectory counts once in the aggregation (and
            ``is_weights`` are mean-pooled to it); ``"tokens"``: each unit's loss counts once per
            valid token, times that token's ``is_weights``, as AgileRL 2.58 does at its turn and
            trajectory levels (the unit's loss broadcast over its tokens). Same at token level.
        clip_low: :math:`\epsilon_{low}` in [0, 1).
        clip_high: :math:`\epsilon_{high}` (default ``clip_low``).
        dual_clip: c > 1 for the dual clip, or None.
        delta: Cap of the unclipped ratio (> upper bound), or None.
        ratio_bounds: Absolute ``(lo, hi)`` bounds with :math:`0 \le lo \le 1 \le hi`,
            :math:`lo < hi` (``hi`` may be ``inf``), overriding ``clip_low``/``clip_high``.

    Returns:
        :class:`PolicyLossOutput`.
    """
    lo, hi = _bounds(clip_low, clip_high, ratio_bounds)
    _check_clip_extras(hi, dual_clip, delta)
    u = _prepare(logprobs, old_logprobs, advantages, mask, level, pooling, turn_ids, is_weights)
    ratio = torch.exp(u.logratio)
    loss_u, low, high = _clip_objective(ratio, u.advantages, lo, hi, dual_clip, delta)
    return _finish(
        loss_u, u, ratio, u.logratio, low, high, aggregation, normalizer, max_length, unit_weight
    )


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
    unit_weight: UnitWeight = "unit",
    form: Literal["logprob", "ratio"] = "logprob",
) -> PolicyLossOutput:
    r"""Plain REINFORCE, no ratio and no clipping (Williams 1992; GPG, arXiv 2504.02546, eq. 5).

    .. math:: l_u = -A_u \log\pi(u) \;(\text{form="logprob"}), \qquad
              l_u = -A_u\, e^{\log\pi(u) - \operatorname{sg}(\log\pi(u))} \;(\text{form="ratio"})

    Both have the gradient :math:`-A_u \nabla \log\pi(u)`; the ``"ratio"`` form has the value
    :math:`-A_u`, which is what the clipped surrogate evaluates to at ratio 1 (on-policy). verl's
    ``gpg`` loss is the ``"logprob"`` form. ``old_logprobs`` feed only the diagnostics.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``gpg`` policy loss (``form="logprob"``).
    * AgileRL 2.58.0: equal: REINFORCE's policy-gradient term.
    * No counterpart: OpenRLHF, TRL, Liger.

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
        unit_weight: See :func:`clipped_surrogate`.
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
    return _finish(
        loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length, unit_weight
    )


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

    * ``"sequence"`` (the paper's GSPO; OpenRLHF ``policy_loss_type="gspo"``): one unit per
      sequence, each counting once.
    * ``"token"`` (GSPO-token, eq. 10; verl's ``gspo``): per-token ratio
      :math:`s_{i,t} = \operatorname{sg}(s_i)\,\pi(y_{i,t}) / \operatorname{sg}(\pi(y_{i,t}))`,
      equal in value to :math:`s_i`, with per-token advantages allowed and a per-token
      reduction. With ``aggregation="seq_mean_token_mean"`` (verl forces it) and sequence
      advantages it matches the sequence form exactly, value and gradient. With
      ``"token_mean"`` each sequence weighs by its length, which is what TRL
      (``importance_sampling_level="sequence"``, ``loss_type="dapo"``: the sequence loss
      broadcast over its tokens) and AgileRL 2.58 (``importance_sampling_level="trajectory"``)
      compute; TRL's ``luspo`` is ``"seq_mean_token_sum"`` with ``normalizer=N``.

    The paper's clip range is tiny (3e-4 / 4e-4) because :math:`s_i` is length-normalised.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``gradient="token", aggregation="seq_mean_token_mean"``.
    * OpenRLHF 0.11.2: equal with ``aggregation="seq_mean_token_mean"`` (sequence form).
    * TRL 1.16.0: equal with ``importance_sampling_level="sequence"``: ``gradient="token"`` with
      ``dapo``: token mean (each sequence weighs by its length); ``grpo``: ``seq_mean_token_mean,
      normalizer=N``.
    * Liger 0.8.5: equal with as TRL.
    * AgileRL 2.58.0: equal with trajectory level = ``gradient="token", aggregation="token_mean"``.

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
    unit_weight: UnitWeight = "unit",
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

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``clamp="two_sided"``.
    * TRL 1.16.0: equal with ``eps_high = epsilon_high - 1`` (TRL's cap is absolute).
    * Liger 0.8.5: equal with as TRL.
    * AgileRL 2.58.0: equal with ``eps_high = clip_coef_max - 1`` (upper clamp).
    * No counterpart: OpenRLHF.

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
        unit_weight: See :func:`clipped_surrogate`.
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
        loss_u,
        u,
        ratio,
        u.logratio,
        low,
        ratio > hi,
        aggregation,
        normalizer,
        max_length,
        unit_weight,
    )
