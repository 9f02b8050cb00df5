r"""KL estimators against a reference policy, as a loss term or per-token for the reward.

One direction everywhere: estimates of :math:`\mathrm{KL}(\pi \,\|\, \pi_{ref})` from
tokens sampled from :math:`\pi`, with :math:`\ell = \log\pi - \log\pi_{ref}` (Schulman,
"Approximating KL divergence", 2020):

* ``k1`` = :math:`\ell` (unbiased, high variance, can be negative);
* ``k2`` = :math:`\tfrac12 \ell^2` (biased, low variance; its gradient is the unbiased
  gradient of the KL);
* ``k3`` = :math:`e^{-\ell} - 1 + \ell` (unbiased, low variance, >= 0; GRPO's estimator,
  arXiv 2402.03300, eq. 4);
* ``abs`` = :math:`|\ell|`.

For KL in the reward, hand ``kl_estimate(...)`` to ``rl_advantages.kl_in_reward``.
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
from rl_losses.aggregate import AGGREGATIONS, Aggregation, aggregate
from rl_losses.outputs import KLOutput

__all__ = ["KLKind", "kl_estimate", "kl_penalty"]

KLKind = Literal["k1", "k2", "k3", "abs"]
_KINDS = ("k1", "k2", "k3", "abs")


def _estimator(ell: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "k1":
        return ell
    if kind == "k2":
        return 0.5 * ell * ell
    if kind == "k3":
        return torch.expm1(-ell) + ell
    return ell.abs()


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: KLKind = "k3",
    *,
    clamp: float | None = None,
    grad_kind: KLKind | None = None,
) -> torch.Tensor:
    r"""Per-token estimate of :math:`\mathrm{KL}(\pi \| \pi_{ref})` from samples of :math:`\pi`.

    See the module docstring for the four estimators. ``clamp`` limits the value to
    :math:`[-c, c]` (verl clamps ``low_var_kl`` to 10). ``grad_kind`` gives the straight-through
    estimator: the value of ``kind`` with the gradient of ``grad_kind``,
    :math:`e_g + \operatorname{sg}(e_{kind} - e_g)` (verl's ``k3+``: value k3, gradient k2).

    Peers: TRL and Liger compute k3 as ``exp(ref - logp) - (ref - logp) - 1``, the same as
    ours; AgileRL's older standard path swapped the arguments (agilerl-llm notes, 2.7).

    Args:
        logprobs: [N, T] log-probs of the sampled tokens under the policy (differentiable).
        ref_logprobs: [N, T] log-probs under the reference policy.
        kind: ``"k1"``, ``"k2"``, ``"k3"`` or ``"abs"``.
        clamp: Bound c > 0 on the value, or None.
        grad_kind: Estimator whose gradient to use, or None.

    Returns:
        [N, T] estimates (elementwise; mask them yourself or use :func:`kl_penalty`).
    """
    check_2d("logprobs", logprobs)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    check_choice("kind", kind, _KINDS)
    if grad_kind is not None:
        check_choice("grad_kind", grad_kind, _KINDS)
    if clamp is not None and not clamp > 0:
        raise ValueError(f"`clamp` must be > 0, got {clamp}")
    ell = logprobs - ref_logprobs.detach()
    value = _estimator(ell, kind)
    if clamp is not None:
        value = value.clamp(-clamp, clamp)
    if grad_kind is None:
        return value
    surrogate = _estimator(ell, grad_kind)
    return surrogate + (value - surrogate).detach()


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: KLKind = "k3",
    coef: float = 1.0,
    clamp: float | None = None,
    grad_kind: KLKind | None = None,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
) -> KLOutput:
    r"""KL to the reference as a loss term: :math:`\beta \cdot \operatorname{agg}(\hat{KL}_t)`.

    GRPO adds it to the policy loss (arXiv 2402.03300, eq. 3, with k3); TRL ``beta``, verl
    ``use_kl_loss`` / ``kl_loss_coef``, OpenRLHF ``--algo.kl.use_loss``.

    Args:
        logprobs: [N, T] policy log-probs (differentiable).
        ref_logprobs: [N, T] reference log-probs.
        mask: [N, T] bool.
        kind: Estimator, see :func:`kl_estimate`.
        coef: :math:`\beta` (>= 0).
        clamp: Value bound, see :func:`kl_estimate`.
        grad_kind: Straight-through gradient estimator, see :func:`kl_estimate`.
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.

    Returns:
        :class:`KLOutput`.
    """
    check_2d("logprobs", logprobs)
    m = as_mask(mask, "logprobs", logprobs)
    check_choice("aggregation", aggregation, AGGREGATIONS)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    check_finite("logprobs", logprobs, m)
    check_finite("ref_logprobs", ref_logprobs, m)
    if not coef >= 0:
        raise ValueError(f"`coef` must be >= 0, got {coef}")
    est = kl_estimate(
        zero_fill(logprobs, m), zero_fill(ref_logprobs, m), kind, clamp=clamp, grad_kind=grad_kind
    )
    loss = coef * aggregate(est, m, aggregation, normalizer, max_length)
    with torch.no_grad():
        e = zero_fill(est.detach(), m)
        count = m.sum().clamp(min=1).to(e.dtype)
        big = torch.where(m, e, float("-inf")).amax() if bool(m.any()) else e.new_zeros(())
        return KLOutput(loss=loss, kl_mean=e.sum() / count, kl_max=big)
