"""Policy objectives with a divergence trust region or penalty instead of a ratio clip: DPPO, DRO.

Same conventions as :mod:`rl_losses.policy`: per-token ``logprobs``, ``old_logprobs``,
``advantages`` ([N] or [N, T]) and ``mask`` [N, T] (True where a token counts), a per-token loss
reduced with :func:`rl_losses.aggregate`, optional detached ``is_weights``; losses are to be
minimised. Both are token level only: DPPO's divergence is between the two policies' token
probabilities, DRO's penalty is per token.
"""

from __future__ import annotations

from typing import Literal

import torch

from rl_losses._checks import check_choice
from rl_losses._policy_common import _finish, _prepare
from rl_losses.aggregate import Aggregation
from rl_losses.outputs import PolicyLossOutput

__all__ = ["dppo_loss", "dro_loss"]

Divergence = Literal["tv", "kl"]


def _binary_kl(old_logprobs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    r""":math:`D_{KL}(\mathrm{Bern}(\mu) \| \mathrm{Bern}(\pi))` from two log-probabilities."""
    p_old = torch.exp(old_logprobs)
    first = p_old * (old_logprobs - logprobs)
    rest = (1 - p_old) * (torch.log1p(-p_old) - torch.log1p(-torch.exp(logprobs)))
    return first + torch.where(p_old < 1, rest, torch.zeros_like(rest))


def dppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    divergence: Divergence = "tv",
    delta_low: float = 0.2,
    delta_high: float | None = None,
    ratio_cap: float | None = 20.0,
) -> PolicyLossOutput:
    r"""Divergence PPO, binary approximation (Qi et al., arXiv 2602.04879).

    From "Rethinking the Trust Region in LLM Reinforcement Learning": the DPPO objective with
    its mask is eq. 12 of arXiv 2602.04879v3, the binary TV and binary KL divergences eqs. 13
    and 14. With :math:`\pi_t = e^{\log\pi_t}`, :math:`\mu_t = e^{\log\pi_{old,t}}` and
    :math:`r_t = \pi_t / \mu_t`:

    .. math:: l_t = -M_t\, \operatorname{sg}\big(\min(r_t, C)\big)\, A_t \log\pi_t

    so the gradient is the importance-weighted policy gradient
    :math:`-\min(r_t, C) A_t \nabla\log\pi_t` (truncated IS, Sec. 5.4), and the trust region
    is the detached mask :math:`M_t \in \{0, 1\}`, which drops a token whose update already left
    the region in the direction its advantage pushes:

    * ``divergence="tv"`` (DPPO-Binary-TV): the signed total variation of the binary
      distribution (sampled token vs. the rest), :math:`\pi_t - \mu_t`. :math:`M_t = 0` iff
      :math:`A_t > 0` and :math:`\pi_t - \mu_t > \delta_{high}`, or :math:`A_t \le 0` and
      :math:`\pi_t - \mu_t < -\delta_{low}`.
    * ``divergence="kl"`` (DPPO-Binary-KL): :math:`D_t = \mu_t \log\frac{\mu_t}{\pi_t} +
      (1 - \mu_t)\log\frac{1 - \mu_t}{1 - \pi_t}`. :math:`M_t = 0` iff :math:`A_t > 0`,
      :math:`\pi_t > \mu_t` and :math:`D_t > \delta_{high}`, or :math:`A_t \le 0`,
      :math:`\pi_t < \mu_t` and :math:`D_t > \delta_{low}`.

    Unlike the ratio clip, a rare token may move far in ratio (1e-5 to 1e-3 is a ratio of 100
    but a TV of 1e-3), and a likely one is stopped by a small ratio change. Clip fractions
    report the dropped tokens (``high``: :math:`A > 0`; ``low``: :math:`A < 0`).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``divergence="tv"`` for ``dppo_tv``, ``"kl"`` for ``dppo_kl``,
      ``delta_low=clip_ratio_low``, ``delta_high=clip_ratio_high``, ``ratio_cap=clip_ratio_c``
      (verl's ``ActorConfig`` default is 3.0); verl's binary KL adds 1e-8 inside the second
      logarithm, which moves the mask only for a token within about 1e-8 of the threshold.
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs :math:`\log\mu`.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        divergence: ``"tv"`` or ``"kl"``.
        delta_low: :math:`\delta_{low}` > 0, the region for :math:`A \le 0`.
        delta_high: :math:`\delta_{high}` > 0, the region for :math:`A > 0` (default
            ``delta_low``).
        ratio_cap: :math:`C` > 0 of the truncated importance weight, or None for no cap.

    Returns:
        :class:`PolicyLossOutput`.
    """
    check_choice("divergence", divergence, ("tv", "kl"))
    high = delta_low if delta_high is None else delta_high
    if not (delta_low > 0 and high > 0):
        raise ValueError(f"`delta_low` and `delta_high` must be > 0, got {delta_low}, {delta_high}")
    if ratio_cap is not None and not ratio_cap > 0:
        raise ValueError(f"`ratio_cap` must be > 0 or None, got {ratio_cap}")
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    ratio = torch.exp(u.logratio)
    with torch.no_grad():
        lp = u.logprobs.detach()
        old = lp - u.logratio.detach()
        up = u.advantages > 0
        if divergence == "tv":
            moved = torch.exp(lp) - torch.exp(old)
            out_high = moved > high
            out_low = moved < -delta_low
        else:
            d = _binary_kl(old, lp)
            out_high = (d > high) & (lp > old)
            out_low = (d > delta_low) & (lp < old)
        dropped = torch.where(up, out_high, out_low) & u.mask
        weight = ratio.detach() if ratio_cap is None else ratio.detach().clamp(max=ratio_cap)
    loss_u = -(weight * u.advantages * u.logprobs).masked_fill(dropped, 0.0)
    low_frac = dropped & (u.advantages < 0)
    high_frac = dropped & up
    return _finish(
        loss_u, u, ratio, u.logratio, low_frac, high_frac, aggregation, normalizer, max_length
    )


def dro_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    beta: float = 1.0,
) -> PolicyLossOutput:
    r"""Direct Reward Optimisation's policy term (Richemond et al., arXiv 2405.19107), per token.

    .. math:: l_t = -A_t \log\pi_t + \frac{\beta}{2}\big(\log\pi_t - \log\pi_{old,t}\big)^2

    A policy gradient with a quadratic log-ratio penalty instead of a clip: the gradient is
    :math:`-(A_t - \beta \log r_t)\nabla\log\pi_t`, the plain policy gradient at ratio 1. In
    the paper (arXiv 2405.19107v1) this is the policy gradient of the DRO loss (eq. 4), eq. 8,
    divided by :math:`\tau` as DRO-V does (Algorithm 1), with :math:`\beta = \tau` and
    :math:`A = r - V`. The paper regularises towards a reference policy; pass its log-probs as
    ``old_logprobs`` for that form (verl's ``dro`` uses the behaviour policy). Clip fractions
    are 0.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``beta=dro_beta`` (``dro`` policy loss).
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.
    * Tinker (its documented formula, read, not run): ``dro`` is ours with
      ``aggregation="seq_mean_token_sum", normalizer=1`` (a sum over tokens).

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] log-probs the penalty pulls towards (no gradient).
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        beta: :math:`\beta` > 0.

    Returns:
        :class:`PolicyLossOutput` (clip fractions are 0).
    """
    if not beta > 0:
        raise ValueError(f"`beta` must be > 0, got {beta}")
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    ratio = torch.exp(u.logratio)
    loss_u = -u.advantages * u.logprobs + 0.5 * beta * u.logratio.square()
    none = torch.zeros_like(u.mask)
    return _finish(loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length)
