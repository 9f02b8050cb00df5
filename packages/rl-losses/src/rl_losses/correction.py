r"""Rollout/trainer mismatch correction: importance weights from the sampler's log-probs.

The engine that samples (vLLM, or the HF engine in another precision) and the trainer compute
slightly different probabilities for the same tokens. The ratio
:math:`\rho = \pi_{old}(y) / \pi_{sampler}(y)` corrects the policy gradient for it.
"""

from __future__ import annotations

from typing import Literal

import torch

from rl_losses._checks import (
    as_mask,
    check_2d,
    check_choice,
    check_finite,
    check_same_shape,
    zero_fill,
)
from rl_losses.outputs import RolloutCorrection

__all__ = ["rollout_correction"]


def rollout_correction(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: Literal["token", "sequence"] = "token",
    mode: Literal["truncate", "mask"] = "truncate",
    cap: float = 2.0,
    lower: float | None = None,
) -> RolloutCorrection:
    r"""Importance weights for the sampler/trainer mismatch, detached, with metrics.

    .. math:: \rho_t = \exp(\log\pi_{old}(y_t) - \log\pi_{samp}(y_t)) \;\text{(token)},\qquad
              \rho_i = \exp\Big(\sum_t \log\pi_{old} - \log\pi_{samp}\Big) \;\text{(sequence)}

    * ``mode="truncate"``: truncated IS (TIS, Yao et al. 2025, "Your efficient RL framework
      secretly brings you off-policy RL training"): :math:`w = \min(\rho, C)`.
    * ``mode="mask"``: masked IS (IcePop / MIS): :math:`w = \rho` inside
      :math:`[C_{min}, C]`, and the token (or sequence) is dropped from the mask outside.

    Conventions: AgileRL caps token ratios at 2.0 (our default); TRL defaults to
    ``sequence_mask`` with cap 3.0; verl's ``rollout_is_threshold`` is 2.0; OpenRLHF's ``tis``
    clamps token ratios, ``icepop`` masks them.

    Args:
        old_logprobs: [N, T] trainer log-probs of the sampled tokens.
        sampling_logprobs: [N, T] the sampler's log-probs of the same tokens.
        mask: [N, T] bool.
        level: ``"token"`` or ``"sequence"`` (product of the token ratios).
        mode: ``"truncate"`` or ``"mask"``.
        cap: Upper bound :math:`C` > 0.
        lower: Lower bound :math:`C_{min}` < ``cap`` for ``mode="mask"``, or None.

    Returns:
        :class:`RolloutCorrection` with ``weights`` [N, T] (0 where masked) to multiply the
        per-token policy loss with (pass as ``is_weights``) and the narrowed ``mask``.
    """
    check_2d("old_logprobs", old_logprobs)
    check_same_shape("sampling_logprobs", sampling_logprobs, "old_logprobs", old_logprobs)
    m = as_mask(mask, "old_logprobs", old_logprobs)
    check_choice("level", level, ("token", "sequence"))
    check_choice("mode", mode, ("truncate", "mask"))
    check_finite("old_logprobs", old_logprobs, m)
    check_finite("sampling_logprobs", sampling_logprobs, m)
    if not cap > 0:
        raise ValueError(f"`cap` must be > 0, got {cap}")
    if lower is not None and not lower < cap:
        raise ValueError(f"`lower` must be < `cap` = {cap}, got {lower}")
    with torch.no_grad():
        delta = zero_fill(old_logprobs.detach() - sampling_logprobs.detach(), m)
        zero = delta.new_zeros(())
        if level == "token":
            rho = torch.exp(delta)
            unit_mask = m
        else:
            rho = torch.exp(delta.sum(dim=1, keepdim=True))  # [N, 1]
            unit_mask = m.any(dim=1, keepdim=True)
        if mode == "truncate":
            w_unit = rho.clamp(max=cap)
            affected = rho > cap
            keep = torch.ones_like(unit_mask)
        else:
            keep = rho <= cap
            if lower is not None:
                keep = keep & (rho >= lower)
            w_unit = torch.where(keep, rho, zero)
            affected = ~keep
        count = unit_mask.sum().clamp(min=1).to(delta.dtype)
        w_valid = zero_fill(w_unit, unit_mask)
        sq = (w_valid * w_valid).sum()
        ess = torch.where(sq > 0, w_valid.sum() ** 2 / (count * sq.clamp(min=1e-300)), zero)
        out_mask = m & keep.expand_as(m)
        weights = zero_fill(w_unit.expand_as(m), m)
        k3 = zero_fill(torch.expm1(delta) - delta, m)
        return RolloutCorrection(
            weights=weights,
            mask=out_mask,
            ratio_mean=zero_fill(rho, unit_mask).sum() / count,
            frac_clamped=zero_fill(affected.to(delta.dtype), unit_mask).sum() / count,
            ess=ess,
            mismatch_kl=k3.sum() / m.sum().clamp(min=1).to(delta.dtype),
        )
