"""Sequence-weighted objectives from TRL 1.16: LUSPO (length-weighted GSPO) and VESPO.

Same conventions as :mod:`rl_losses.policy` (which re-exports both): per-token ``logprobs``,
``old_logprobs``, ``advantages`` ([N] or [N, T]) and ``mask`` [N, T], a per-token loss reduced
with :func:`rl_losses.aggregate`, optional detached ``is_weights``; losses are minimised.
"""

from __future__ import annotations

import math

import torch

from rl_losses._checks import zero_fill
from rl_losses._policy_common import _finish, _prepare
from rl_losses.aggregate import Aggregation
from rl_losses.outputs import PolicyLossOutput
from rl_losses.policy import gspo_loss
from rl_losses.units import to_units

__all__ = ["luspo_loss", "vespo_loss"]

_LOG_W_BOUNDS = (math.log(1e-8), 20.0)


def luspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "seq_mean_token_sum",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> PolicyLossOutput:
    r"""Length-Unbiased Sequence Policy Optimization (Liu et al., arXiv 2602.05261).

    GSPO's clipped sequence objective (arXiv 2507.18071, eq. 5), each sequence's loss scaled by
    its length :math:`|y_i|`, then averaged over sequences:

    .. math:: s_i = \exp\Big(\frac{1}{|y_i|}\sum_t \log\frac{\pi(y_{i,t})}
              {\pi_{old}(y_{i,t})}\Big), \qquad
              \mathcal L = \frac{1}{D}\sum_i |y_i| \cdot
              \big(-\min(s_i A_i, \operatorname{clip}(s_i, 1-\epsilon_l, 1+\epsilon_h) A_i)\big)

    GSPO's plain sequence mean gives each token of a long answer less weight, which the paper
    shows shrinks responses; the length factor removes that bias. Computed as the GSPO-token
    form (:func:`rl_losses.gspo_loss` with ``gradient="token"``) summed per sequence, which has
    the same value and gradient, and admits per-token advantages and ``is_weights``.

    The definition is the one TRL 1.16.0 implements (``loss_type="luspo"``, which needs
    ``importance_sampling_level="sequence"``): ``(per_token_loss * mask).sum(-1).mean()``, a
    mean over every row: ``normalizer=N`` reproduces it (ours, :math:`D`, counts rows with a
    valid token). Defaults of the clip range follow GSPO; TRL's are its ``epsilon`` (0.2) and
    ``epsilon_high``. No peer other than TRL ships it.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * TRL 1.16.0: equal with ``normalizer=N``, clip ``epsilon``/``epsilon_high``.
    * Liger 0.8.5: equal with as TRL.
    * No counterpart: verl (only in the LUSPO authors' verl fork), OpenRLHF, AgileRL.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate`; ``"seq_mean_token_sum"`` is LUSPO's.
        normalizer: Global denominator (``N`` for TRL).
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        clip_low: :math:`\epsilon_l` in [0, 1).
        clip_high: :math:`\epsilon_h` >= 0.

    Returns:
        :class:`PolicyLossOutput` (diagnostics over tokens).
    """
    return gspo_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        aggregation=aggregation,
        normalizer=normalizer,
        max_length=max_length,
        is_weights=is_weights,
        clip_low=clip_low,
        clip_high=clip_high,
        gradient="token",
    )


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"`{name}` must be > 0, got {value}")


def vespo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> PolicyLossOutput:
    r"""Variational Sequence-level Soft Policy Optimization (Shen et al., arXiv 2602.10693).

    A smooth Gamma-shaped kernel of the *sequence* importance weight (product ratio, no length
    normalisation) scales a REINFORCE gradient:

    .. math:: w_i = \exp\Big(\sum_t \log\frac{\pi(y_{i,t})}{\pi_{old}(y_{i,t})}\Big),\qquad
              \phi(w) = e^{\lambda}\, w^{k}\, e^{-\lambda w},\qquad
              l_{i,t} = -\operatorname{sg}(\phi(w_i))\, A_{i,t} \log\pi(y_{i,t})

    with :math:`(k, \lambda) = (k_{pos}, \lambda_{pos})` where :math:`A \ge 0` and
    :math:`(k_{neg}, \lambda_{neg})` elsewhere. :math:`\phi(1) = 1`; it decays for small
    :math:`w` (power :math:`k`) and large :math:`w` (rate :math:`\lambda`), replacing hard
    clipping. :math:`\log w` is clamped to :math:`[\log 10^{-8}, 20]` before the kernel
    (:math:`\phi` is negligible beyond); :math:`\phi` is computed in log space.

    The definition is the one TRL 1.16.0 implements (``loss_type="vespo"``,
    ``importance_sampling_level="token"``, ``GRPOTrainer.get_gamma_weights``) with its defaults
    (2, 3, 3, 2) and its ``dapo`` normaliser (token mean, our default). TRL folds its vLLM
    importance ratio into :math:`w` instead of multiplying the loss by it; here rollout
    correction stays a separate ``is_weights`` factor (a deliberate difference, only with vLLM
    correction on). TRL also clamps each token's log-ratio to [-20, 20] (never binding for
    finite log-probs of sampled tokens above e^-20).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * TRL 1.16.0: equal: ``vespo`` (without vLLM correction; with it TRL folds the ratio into w,
      ours keeps it a separate ``is_weights`` factor: differs by design).
    * Liger 0.8.5: equal: as TRL.
    * No counterpart: verl, OpenRLHF, AgileRL.

    Args:
        logprobs: [N, T] current log-probs.
        old_logprobs: [N, T] behaviour log-probs.
        advantages: [N] or [N, T].
        mask: [N, T] bool.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.
        is_weights: [N, T] detached weights.
        k_pos: Power :math:`k` for :math:`A \ge 0` (> 0).
        lambda_pos: Rate :math:`\lambda` for :math:`A \ge 0` (> 0).
        k_neg: Power :math:`k` for :math:`A < 0` (> 0).
        lambda_neg: Rate :math:`\lambda` for :math:`A < 0` (> 0).

    Returns:
        :class:`PolicyLossOutput` (token diagnostics; clip fractions are 0).
    """
    _check_positive(k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)
    u = _prepare(logprobs, old_logprobs, advantages, mask, "token", "sum", None, is_weights)
    with torch.no_grad():
        log_w, _ = to_units(u.logratio.detach(), u.mask, "trajectory", None, "sum")  # [N, 1]
        log_w = log_w.clamp(*_LOG_W_BOUNDS)
        nonneg = u.advantages >= 0
        # built in log_w's dtype: a Python-scalar torch.where would round them to float32
        k = torch.full_like(u.advantages, k_neg, dtype=log_w.dtype).masked_fill(nonneg, k_pos)
        lam = torch.full_like(u.advantages, lambda_neg, dtype=log_w.dtype).masked_fill(
            nonneg, lambda_pos
        )
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        phi = zero_fill(phi, u.mask)
    loss_u = -phi * u.advantages * u.logprobs
    ratio = torch.exp(u.logratio)
    none = torch.zeros_like(u.mask)
    return _finish(loss_u, u, ratio, u.logratio, none, none, aggregation, normalizer, max_length)
