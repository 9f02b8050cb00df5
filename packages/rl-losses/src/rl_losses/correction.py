r"""Rollout/trainer mismatch correction and off-policy masks, from the sampler's log-probs.

The engine that samples (vLLM, or the HF engine in another precision) and the trainer compute
slightly different probabilities for the same tokens. The ratio
:math:`\rho = \pi_{old}(y) / \pi_{sampler}(y)` corrects the policy gradient for it.
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
    zero_fill,
)
from rl_losses.outputs import RolloutCorrection

__all__ = ["off_policy_mask", "rollout_correction", "rollout_weights"]


def rollout_correction(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Literal["token", "sequence"] = "token",
    mode: Literal["truncate", "mask"] = "truncate",
    cap: float = 2.0,
    lower: float | None = None,
    statistic: Literal["product", "geometric_mean"] = "product",
    weights: Literal["unit", "token"] = "unit",
) -> RolloutCorrection:
    r"""Importance weights for the sampler/trainer mismatch, detached, with metrics.

    .. math:: \rho_t = \exp(\log\pi_{old}(y_t) - \log\pi_{samp}(y_t)) \;\text{(token)},\qquad
              \rho_i = \exp\Big(\sum_t \log\pi_{old} - \log\pi_{samp}\Big) \;\text{(sequence)}

    and with ``statistic="geometric_mean"`` the sequence statistic is
    :math:`\rho_i = \exp\big(\frac{1}{|y_i|}\sum_t \log\pi_{old} - \log\pi_{samp}\big)`.

    * ``mode="truncate"``: truncated IS (TIS, Yao et al. 2025, "Your efficient RL framework
      secretly brings you off-policy RL training"): :math:`w = \min(\rho, C)`, or
      :math:`\operatorname{clip}(\rho, C_{min}, C)` when ``lower`` is given.
    * ``mode="mask"``: masked IS (IcePop / MIS): :math:`w = \rho` inside
      :math:`[C_{min}, C]`, and the token (or sequence) is dropped from the mask outside.
    * ``weights="token"`` (sequence level, ``mode="mask"``): the sequence statistic only gates,
      and the kept tokens carry their own :math:`\rho_t` (OpenRLHF's ``seq-mask-tis``).

    Conventions, per peer (the call that reproduces it):

    * AgileRL 2.58: token ratios capped at 2.0, our default.
    * TRL 1.16: ``vllm_importance_sampling_mode="sequence_mask"`` (its default), cap 3.0 is
      ``level="sequence", mode="mask", cap=3.0`` (``lower`` = its ``..._clip_min``);
      ``token_truncate`` is ``level="token", cap=...``.
    * verl 0.9.1: ``rollout_is_threshold`` 2.0, token or sequence (product) level.
    * OpenRLHF 0.11.2 (thresholds ``(low, high)``, default (0.5, 5.0)): token ``clip`` (TIS) is
      ``mode="truncate", lower=low, cap=high``; token ``mask`` (IcePop) is
      ``mode="mask", lower=low, cap=high``; ``seq`` ``mask`` (seq-mask-tis) is
      ``level="sequence", statistic="geometric_mean", weights="token", mode="mask"``.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``rollout_is`` token / sequence (product), threshold 2.0.
    * OpenRLHF 0.11.2: equal with token ``clip``: ``mode="truncate", lower=low, cap=high``;
      ``mask``: ``mode="mask"``; ``seq`` mask: ``level="sequence", statistic="geometric_mean",
      weights="token"``.
    * TRL 1.16.0: equal with ``token_truncate``: ``cap=3.0``; ``sequence_mask``: ``level="sequence",
      mode="mask", cap=3.0``.
    * AgileRL 2.58.0: equal: token TIS, cap 2.0.
    * No counterpart: Liger (takes `vllm_is_ratio` from the trainer).

    Args:
        old_logprobs: [N, T] trainer log-probs of the sampled tokens.
        sampling_logprobs: [N, T] the sampler's log-probs of the same tokens.
        mask: [N, T] bool.
        level: ``"token"`` or ``"sequence"`` (product of the token ratios).
        mode: ``"truncate"`` or ``"mask"``.
        cap: Upper bound :math:`C` > 0.
        lower: Lower bound :math:`C_{min}` < ``cap``, or None: the band's lower edge for
            ``mode="mask"``, a lower clamp for ``mode="truncate"``.
        statistic: Sequence-level statistic: ``"product"`` of the token ratios (default) or
            their ``"geometric_mean"``. Ignored at token level.
        weights: ``"unit"``: each unit's (clamped) statistic is its tokens' weight;
            ``"token"``: the statistic gates only and kept tokens keep their own
            :math:`\rho_t` (needs ``mode="mask"``).

    Returns:
        :class:`RolloutCorrection` with ``weights`` [N, T] (0 where masked) to multiply the
        per-token policy loss with (pass as ``is_weights``) and the narrowed ``mask``.
    """
    r = _ratios(old_logprobs, sampling_logprobs, mask, level, mode, cap, lower, statistic, weights)
    with torch.no_grad():
        m, unit_mask, rho, delta = r.mask, r.unit_mask, r.rho, r.delta
        zero = delta.new_zeros(())
        if mode == "truncate":
            affected = (rho > cap) | (rho < lower) if lower is not None else rho > cap
        else:
            affected = ~r.keep
        count = unit_mask.sum().clamp(min=1).to(delta.dtype)
        w_valid = zero_fill(r.unit_weights, unit_mask)
        sq = (w_valid * w_valid).sum()
        ess = torch.where(sq > 0, w_valid.sum() ** 2 / (count * sq.clamp(min=1e-300)), zero)
        k3 = zero_fill(torch.expm1(delta) - delta, m)
        return RolloutCorrection(
            weights=r.weights,
            mask=r.out_mask,
            ratio_mean=zero_fill(rho, unit_mask).sum() / count,
            frac_clamped=zero_fill(affected.to(delta.dtype), unit_mask).sum() / count,
            ess=ess,
            mismatch_kl=k3.sum() / m.sum().clamp(min=1).to(delta.dtype),
        )


def rollout_weights(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Literal["token", "sequence"] = "token",
    mode: Literal["truncate", "mask"] = "truncate",
    cap: float = 2.0,
    lower: float | None = None,
    statistic: Literal["product", "geometric_mean"] = "product",
    weights: Literal["unit", "token"] = "unit",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [N, T], mask [N, T])`` of :func:`rollout_correction`, without its metrics.

    The same arguments, checks and values (``RolloutCorrection.weights`` and ``.mask``), for a
    caller that reads no diagnostics, such as a weighing per micro-batch: the metrics (ESS,
    mismatch KL, clamped fraction) take most of :func:`rollout_correction`'s operations.
    """
    r = _ratios(old_logprobs, sampling_logprobs, mask, level, mode, cap, lower, statistic, weights)
    return r.weights, r.out_mask


@dataclass(frozen=True)
class _Ratios:
    """What :func:`rollout_correction` and :func:`rollout_weights` share (all detached)."""

    mask: torch.Tensor  # [N, T] the input mask, bool
    delta: torch.Tensor  # [N, T] log(pi_old / pi_sampler), 0 off the mask
    rho: torch.Tensor  # [N, T] token or [N, 1] sequence ratios
    unit_mask: torch.Tensor  # like rho: the units with a valid token
    keep: torch.Tensor  # like rho: the units kept (all, with mode="truncate")
    unit_weights: torch.Tensor  # like rho: each unit's weight
    out_mask: torch.Tensor  # [N, T] the mask, narrowed by mode="mask"
    weights: torch.Tensor  # [N, T] the weights, 0 where masked


def _ratios(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    mode: str,
    cap: float,
    lower: float | None,
    statistic: str,
    weights: str,
) -> _Ratios:
    check_2d("old_logprobs", old_logprobs)
    check_same_shape("sampling_logprobs", sampling_logprobs, "old_logprobs", old_logprobs)
    m = as_mask(mask, "old_logprobs", old_logprobs)
    check_choice("level", level, ("token", "sequence"))
    check_choice("mode", mode, ("truncate", "mask"))
    check_float("old_logprobs", old_logprobs)
    check_float("sampling_logprobs", sampling_logprobs)
    check_finite("old_logprobs", old_logprobs, m)
    check_finite("sampling_logprobs", sampling_logprobs, m)
    if not cap > 0:
        raise ValueError(f"`cap` must be > 0, got {cap}")
    if lower is not None and not lower < cap:
        raise ValueError(f"`lower` must be < `cap` = {cap}, got {lower}")
    check_choice("statistic", statistic, ("product", "geometric_mean"))
    check_choice("weights", weights, ("unit", "token"))
    if weights == "token" and mode != "mask":
        raise ValueError(
            "`weights='token'` keeps each token's own ratio where the unit passes the gate, which "
            "needs mode='mask'; use weights='unit' with mode='truncate'"
        )
    with torch.no_grad():
        delta = zero_fill(old_logprobs.detach() - sampling_logprobs.detach(), m)
        if level == "token":
            rho = torch.exp(delta)
            unit_mask = m
        else:
            log_rho = delta.sum(dim=1, keepdim=True)  # [N, 1]
            if statistic == "geometric_mean":
                log_rho = log_rho / m.sum(dim=1, keepdim=True).clamp(min=1).to(delta.dtype)
            rho = torch.exp(log_rho)
            unit_mask = m.any(dim=1, keepdim=True)
        if mode == "truncate":
            w_unit = rho.clamp(min=lower, max=cap)
            keep = torch.ones_like(unit_mask)
        else:
            keep = rho <= cap
            if lower is not None:
                keep = keep & (rho >= lower)
            w_unit = torch.where(keep, rho, 0.0)
        out_mask = m & keep.expand_as(m)
        if weights == "token":
            w_tok = zero_fill(torch.exp(delta), out_mask)
        else:
            w_tok = zero_fill(w_unit.expand_as(m), m)
        return _Ratios(m, delta, rho, unit_mask, keep, w_unit, out_mask, w_tok)


def off_policy_mask(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_bounds: tuple[float, float] | None = None,
    sequence_threshold: float | None = None,
) -> torch.Tensor:
    r"""Tokens to keep, given how far the current policy has moved from the behaviour policy.

    With :math:`\ell_t = \log\pi_\theta(y_t) - \log\mu(y_t)` (``behaviour_logprobs`` =
    :math:`\log\mu`, the sampler's or the old policy's log-probs):

    * token band (IcePop-style; AgileRL ``off_policy_token_mask_bounds``): drop valid tokens with
      :math:`e^{\ell_t} \notin [lo, hi]`.
    * sequence mask (DeepSeek-V3.2, arXiv 2512.02556, Sec. 3.1, eq. 9 as cited by TRL): drop the
      negative-advantage tokens of a row whose mean drift
      :math:`\frac{1}{|y_i|}\sum_t -\ell_t = \frac{1}{|y_i|}\sum_t \log\mu - \log\pi_\theta`
      exceeds :math:`\delta` (TRL ``off_policy_mask_threshold``, AgileRL
      ``off_policy_sequence_mask_threshold``).

    TRL and AgileRL multiply the per-token loss by the result and keep the aggregation's
    denominator: pass ``is_weights=keep.to(logprobs.dtype)`` (times any rollout-correction
    weights) to reproduce them; ``mask=mask & keep`` would also drop the tokens from the
    denominator. AgileRL also removes the dropped tokens' KL term: pass the same weights to
    :func:`rl_losses.kl_penalty` (``is_weights``). Computed without gradient.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * TRL 1.16.0: equal with ``sequence_threshold=off_policy_mask_threshold`` with the sampler's
      log-probs, as ``is_weights``.
    * AgileRL 2.58.0: equal with ``token_bounds``, ``sequence_threshold``, as ``is_weights`` of the
      policy and KL terms.
    * No counterpart: verl, OpenRLHF, Liger.

    Args:
        logprobs: [N, T] current-policy log-probs (detached here).
        behaviour_logprobs: [N, T] log-probs of the policy that sampled the tokens.
        advantages: [N] per sequence or [N, T] per token (the sign decides, per token).
        mask: [N, T] bool, True where a token counts.
        token_bounds: ``(lo, hi)`` ratio band with 0 <= lo < 1 < hi, or None.
        sequence_threshold: :math:`\delta` >= 0, or None.

    Returns:
        [N, T] bool, True where the token counts and is kept; False at invalid tokens.
    """
    check_2d("logprobs", logprobs)
    check_same_shape("behaviour_logprobs", behaviour_logprobs, "logprobs", logprobs)
    m = as_mask(mask, "logprobs", logprobs)
    check_float("logprobs", logprobs)
    check_float("behaviour_logprobs", behaviour_logprobs)
    check_finite("logprobs", logprobs, m)
    check_finite("behaviour_logprobs", behaviour_logprobs, m)
    n, t = logprobs.shape
    if advantages.shape == (n,):
        adv = advantages[:, None].expand(n, t)
    elif advantages.shape == (n, t):
        adv = advantages
    else:
        raise ValueError(
            f"`advantages` has shape {list(advantages.shape)} but `logprobs` has shape "
            f"{[n, t]}; pass [N] (one per sequence) or [N, T]"
        )
    check_float("advantages", adv)
    if token_bounds is not None:
        lo, hi = (float(b) for b in token_bounds)
        if not 0.0 <= lo < 1.0 < hi:
            raise ValueError(
                f"`token_bounds` must be (lo, hi) with 0 <= lo < 1 < hi (AgileRL uses (0.5, 5.0)), "
                f"got {token_bounds}"
            )
    if sequence_threshold is not None and not sequence_threshold >= 0:
        raise ValueError(f"`sequence_threshold` must be >= 0, got {sequence_threshold}")
    with torch.no_grad():
        ell = zero_fill(logprobs.detach() - behaviour_logprobs.detach(), m)
        keep = m.clone()
        if token_bounds is not None:
            ratio = torch.exp(ell)
            keep = keep & (ratio >= lo) & (ratio <= hi)
        if sequence_threshold is not None:
            count = m.sum(dim=1, keepdim=True).clamp(min=1).to(ell.dtype)
            drift = -ell.sum(dim=1, keepdim=True) / count
            negative = zero_fill(adv.detach(), m) < 0
            keep = keep & ~(negative & (drift > sequence_threshold))
        return keep
