"""REINFORCE++ and the KL-in-reward convention of PPO-RLHF."""

from __future__ import annotations

import torch

from rl_advantages._checks import (
    NonFinite,
    as_float,
    bool_mask,
    check_finite_values,
    check_group_size,
    check_ndim,
    check_same_shape,
    check_tensor,
    check_unit_interval,
    float_dtype,
    shape_str,
)
from rl_advantages.returns import AdvantagesReturns, Gap, discount, steps
from rl_advantages.stats import masked_mean, whiten

__all__ = ["kl_in_reward", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def _last_valid_index(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] index of each row's last True, and [N] whether the row has any."""
    t = mask.shape[1]
    pos = torch.arange(t, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, -1).amax(dim=1) if t else mask.new_zeros(mask.shape[0]).long()
    return last.clamp(min=0), mask.any(dim=1) if t else mask.new_zeros(mask.shape[0])


def kl_in_reward(
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Token rewards with the KL penalty folded in and the task score on the last token.

    .. math:: r_t = -\beta\, \mathrm{KL}_t + \mathbb{1}[t = t_{\text{last}}]\, R

    The PPO-RLHF convention (Ouyang et al., arXiv 2203.02155, eq. 2; Stiennon et al.,
    arXiv 2009.01325) used by REINFORCE++ (arXiv 2501.03262, eq. 3), OpenRLHF, TRL's PPO and
    verl's ``use_kl_in_reward``. The score goes on the row's last valid token only, so that
    token-level returns do not grow with the remaining length (unlike AgileRL's single-turn
    path, which writes the score on every token). ``kl`` is whatever per-token estimator the
    caller uses (k1 = log pi - log pi_ref is the usual one here).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``use_kl_in_reward`` (score on the last token).
    * OpenRLHF 0.11.2: equal: ``compute_reward`` (valid tokens).
    * AgileRL 2.58.0: differs by design: AgileRL's single-turn REINFORCE writes the score on every
      token; ours on the last token (``broadcast_to_tokens(placement="all")`` for theirs).
    * No counterpart: TRL, Liger.

    Args:
        scores: [N] task reward per sequence.
        mask: [N, T] bool, True at valid (generated) tokens.
        kl: [N, T] per-token KL estimate, or None (no penalty).
        beta: KL coefficient (>= 0).
        nonfinite: ``"raise"`` on a NaN/inf score, or ``"mask"`` to drop that row's score.

    Returns:
        [N, T] token rewards, 0 at invalid tokens and on rows without valid tokens.
    """
    check_tensor("scores", scores)
    check_ndim("scores", scores, 1, "[N]")
    check_tensor("mask", mask)
    check_ndim("mask", mask, 2, "[N, T]")
    if mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"`scores` has shape {shape_str(scores)} but `mask` has shape {shape_str(mask)}; "
            "they must have the same number of rows N"
        )
    m = bool_mask("mask", mask)
    row_ok = check_finite_values(
        "scores", scores, torch.ones_like(scores, dtype=torch.bool), nonfinite
    )
    if not float(beta) >= 0:
        raise ValueError(f"`beta` must be >= 0, got {beta}")
    if kl is not None:
        check_tensor("kl", kl)
        check_same_shape("kl", kl, "mask", m)
    dtype = float_dtype(scores, kl)
    scores = scores.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=scores.device)
    rewards = torch.zeros(m.shape, dtype=dtype, device=scores.device)
    if kl is not None:
        penalty = torch.where(m, kl.to(dtype), zero)
        if not bool(torch.isfinite(penalty).all()):
            raise ValueError("`kl` holds non-finite values at valid tokens")
        rewards = rewards - beta * penalty
    last, has_any = _last_valid_index(m)
    score = torch.where(row_ok & has_any, scores, zero)
    if m.shape[1]:
        rewards = rewards.scatter_add(1, last[:, None], score[:, None])
    return rewards


def reinforce_plus_plus(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    *,
    nonfinite: NonFinite = "raise",
    unbiased: bool = True,
    eps: float = 1e-8,
    gap: Gap = "skip",
) -> AdvantagesReturns:
    r"""REINFORCE++ (Hu, arXiv 2501.03262, Sec. 3): token returns whitened over the batch.

    .. math:: G_t = \sum_{k \ge t} \gamma^{k-t} r_k, \qquad
              \hat A_t = \frac{G_t - \mu_B}{\sqrt{\sigma_B^2 + \epsilon}}

    with :math:`\mu_B, \sigma_B` over every valid token of the (global) batch. Build
    ``token_rewards`` with :func:`kl_in_reward`.

    Peers: verl's ``reinforce_plus_plus`` is the default (unbiased variance,
    :math:`\sqrt{\sigma^2 + 10^{-8}}`). OpenRLHF's ``reinforce`` uses the biased variance and
    ``rsqrt(clamp(var, 1e-8))``: ``unbiased=False, eps=0`` reproduces it wherever the variance
    is at least 1e-8 (about 2% apart from the default at 24 tokens).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``reinforce_plus_plus``, any gamma (gaps skipped as ours: ``gap="skip"``).
    * OpenRLHF 0.11.2: equal with ``unbiased=False, eps=0``; ``gap="carry"`` for gamma < 1 with gaps
      (OpenRLHF discounts across a masked gap, one step per masked token).
    * No counterpart: TRL, Liger, AgileRL.

    Args:
        token_rewards: [N, T] reward per token (KL folded in, score on the last token).
        mask: [N, T] bool, True at valid tokens.
        gamma: Discount in [0, 1] (1 in the paper's runs).
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to drop it.
        unbiased: Whitening variance with ``n - 1`` (True) or ``n`` (False, OpenRLHF).
        eps: Added to the variance inside the square root (>= 0; 0 for OpenRLHF).
        gap: What a gap between valid tokens means for the returns: ``"skip"`` (observation
            tokens cost no discount), ``"reset"`` or ``"carry"`` (see :func:`discounted_returns`).

    Returns:
        ``AdvantagesReturns(advantages [N, T], returns [N, T])``, 0 at invalid tokens.
    """
    r, m = steps(token_rewards, mask, nonfinite, name="token_rewards")
    returns = discount(r, m, gamma, gap=gap)
    return AdvantagesReturns(whiten(returns, m, unbiased=unbiased, eps=eps), returns)


def reinforce_plus_plus_baseline(
    scores: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
    gamma: float = 1.0,
    *,
    nonfinite: NonFinite = "raise",
    unbiased: bool = True,
    eps: float = 1e-8,
) -> AdvantagesReturns:
    r"""REINFORCE++-baseline (arXiv 2501.03262, Sec. 3.3): group mean, then global whitening.

    .. math:: R'_i = R_i - \operatorname{mean}(R_{\text{group}(i)}),\quad
              r_t = -\beta\,\mathrm{KL}_t + \mathbb 1[t = t_{\text{last}}] R'_i,\quad
              \hat A = \operatorname{whiten}_B(G)

    The group mean removes the prompt's difficulty; the global whitening keeps the scale
    stable without the per-group std that GRPO divides by. OpenRLHF's
    ``reinforce_baseline`` (which forces gamma = 1) and verl's
    ``reinforce_plus_plus_baseline`` (which spreads R' over every token with no KL; the same
    result for gamma = 1 and beta = 0). OpenRLHF whitens with the biased variance:
    ``unbiased=False, eps=0`` (see :func:`reinforce_plus_plus`).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``reinforce_plus_plus_baseline`` (advantages; verl's returns are the
      centred scores).
    * OpenRLHF 0.11.2: equal with ``unbiased=False, eps=0``.
    * No counterpart: TRL, Liger, AgileRL.

    Args:
        scores: [N] task reward per sequence, groups of G contiguous.
        mask: [N, T] bool, True at valid tokens.
        group_size: G >= 2.
        kl: [N, T] per-token KL estimate, or None.
        beta: KL coefficient (>= 0).
        gamma: Discount in [0, 1].
        nonfinite: ``"raise"`` on a NaN/inf score, or ``"mask"`` to drop that row.
        unbiased: Whitening variance with ``n - 1`` (True) or ``n`` (False, OpenRLHF).
        eps: Added to the variance inside the square root (>= 0).

    Returns:
        ``AdvantagesReturns(advantages [N, T], returns [N, T])``, 0 at invalid tokens.
    """
    check_tensor("scores", scores)
    check_ndim("scores", scores, 1, "[N]")
    b = check_group_size("scores", scores.shape[0], group_size)
    check_unit_interval("gamma", gamma)
    row_ok = check_finite_values(
        "scores", scores, torch.ones_like(scores, dtype=torch.bool), nonfinite
    )
    scores = as_float(scores)
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    s = torch.where(row_ok, scores, zero).view(b, group_size)
    ok = row_ok.view(b, group_size)
    centred = torch.where(ok, s - masked_mean(s, ok, dim=1, keepdim=True), zero).reshape(-1)
    check_tensor("mask", mask)
    check_ndim("mask", mask, 2, "[N, T]")
    token_mask = bool_mask("mask", mask) & row_ok[:, None]
    rewards = kl_in_reward(centred, token_mask, kl, beta)
    return reinforce_plus_plus(rewards, token_mask, gamma, unbiased=unbiased, eps=eps)
