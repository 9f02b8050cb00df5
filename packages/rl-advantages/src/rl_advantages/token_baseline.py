"""verl's optimal token baseline: a per-step group baseline weighted by the path variance."""

from __future__ import annotations

import torch

from rl_advantages._checks import (
    NonFinite,
    as_mask,
    check_finite_values,
    check_group_size,
    check_ndim,
    check_same_shape,
    check_tensor,
    float_dtype,
)
from rl_advantages.returns import AdvantagesReturns

__all__ = ["optimal_token_baseline"]


def optimal_token_baseline(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    group_size: int,
    is_weights: torch.Tensor | None = None,
    zero_tail: bool = True,
    eps: float = 1e-8,
    *,
    nonfinite: NonFinite = "raise",
) -> AdvantagesReturns:
    r"""Optimal token baseline (verl#4678): a per-step, variance-weighted group baseline.

    Per step, the return baseline that minimises the policy-gradient variance, with the squared
    score norm computed from the probabilities.

    .. math:: G_{i,t} = \sum_{s \ge t} m_{i,s} r_{i,s}, \quad
              w_{i,t} = 1 - 2\pi_{i,t} + \textstyle\sum_v \pi_{i,t}(v)^2, \quad
              W_{i,t} = \sum_{s \le t} m_{i,s} w_{i,s}\,\rho_{i,s}^2

    .. math:: B_t = \frac{\sum_{i \in g} m_{i,t} G_{i,t} W_{i,t}}
              {\sum_{i \in g} m_{i,t} W_{i,t} + \epsilon}, \qquad
              \hat A_{i,t} = m_{i,t} (G_{i,t} - B_t)

    :math:`w_t = \|\nabla_z \log \pi(y_t)\|^2` is the squared norm of the score with respect to
    the logits (:math:`\pi_t` the sampled token's probability, ``sum_pi_squared`` the sum of
    the squared probabilities over the vocabulary); :math:`W_t` accumulates it along the path
    (times :math:`\rho^2` of the rollout-correction ``is_weights``), so :math:`B_t =
    E[G_t W_t] / E[W_t]` weights high-variance paths more (the variance-minimising baseline
    of Greensmith et al., JMLR 2004, per step). With ``zero_tail``, the steps of a group's
    single longest row beyond the second-longest length (a count of valid steps) get baseline
    0: no other row estimates them.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``optimal_token_baseline`` (``old_log_probs`` as ``logprobs``).
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

    Args:
        token_rewards: [N, T] rewards per step, groups of G contiguous rows.
        mask: [N, T] bool, True at valid steps (weights go in ``is_weights``, not here).
        logprobs: [N, T] log-probabilities of the sampled tokens (the behaviour policy's);
            finite at valid steps (anything, NaN included, at invalid ones).
        sum_pi_squared: [N, T] :math:`\sum_v \pi_t(v)^2` per step; finite at valid steps.
        group_size: G >= 2.
        is_weights: [N, T] rollout-correction weights :math:`\rho`, or None; finite at valid
            steps.
        zero_tail: Zero the baseline on a lone longest row's unshared tail.
        eps: :math:`\epsilon` in the denominator.
        nonfinite: ``"raise"`` on a NaN/inf reward at a valid step, or ``"mask"`` to drop it.

    Returns:
        :class:`AdvantagesReturns`: advantages and the returns :math:`G`, both 0 at invalid
        steps.
    """
    check_tensor("token_rewards", token_rewards)
    check_ndim("token_rewards", token_rewards, 2, "[N, T]")
    n, t = token_rewards.shape
    b = check_group_size("token_rewards", n, group_size)
    m = as_mask("mask", mask, "token_rewards", token_rewards, weights="is_weights")
    m = check_finite_values("token_rewards", token_rewards, m, nonfinite)
    others = {"logprobs": logprobs, "sum_pi_squared": sum_pi_squared, "is_weights": is_weights}
    for name, x in others.items():
        if x is None:
            continue
        check_tensor(name, x)
        check_same_shape(name, x, "token_rewards", token_rewards)
        if x.is_floating_point() and bool((m & ~torch.isfinite(x)).any()):
            raise ValueError(f"`{name}` holds non-finite values at valid steps")
    dtype = float_dtype(token_rewards, logprobs, sum_pi_squared, is_weights)
    zero = torch.zeros((), dtype=dtype, device=token_rewards.device)
    r, lp, spi = (
        torch.where(m, x.to(dtype), zero) for x in (token_rewards, logprobs, sum_pi_squared)
    )
    mf = m.to(dtype)
    with torch.no_grad():
        returns = (r * mf).flip(-1).cumsum(-1).flip(-1)
        w = 1 - 2 * torch.exp(lp) + spi
        if is_weights is not None:
            w = w * torch.where(m, is_weights.to(dtype), zero) ** 2
        cum = (w * mf).cumsum(-1)
        g_ret, g_cum, g_m = (x.view(b, group_size, t) for x in (returns, cum, mf))
        num = (g_ret * g_cum * g_m).sum(1, keepdim=True)
        den = (g_cum * g_m).sum(1, keepdim=True) + eps
        base = (num / den).expand(b, group_size, t).clone()
        if zero_tail:
            lengths = g_m.sum(-1)  # [B, G]
            top2 = lengths.topk(2, dim=1).values
            for k in range(b):
                longest = (lengths[k] == top2[k, 0]).nonzero()
                if len(longest) == 1 and top2[k, 0] > top2[k, 1]:
                    base[k, int(longest[0]), int(top2[k, 1]) :] = 0.0
        adv = torch.where(m, returns - base.reshape(n, t), zero)
    return AdvantagesReturns(adv, torch.where(m, returns, zero))
