"""Optional backend: Liger-Kernel's chunked GRPO loss behind rl-kernels' argument names.

``pip install "rl-kernels[liger]"``. Liger's ``LigerFusedLinearGRPOLoss`` is pure torch on its
chunked path (so it runs on CPU too), with an optional ``torch.compile`` of the chunk body;
on CUDA some users prefer it. It covers a subset of :func:`rl_kernels.fused_policy_loss`:

=====================  ===============================================================
objective              aggregation (Liger ``loss_type``)
=====================  ===============================================================
``ppo``                ``token_mean`` (``dapo``, with ``normalizer`` as
                       ``num_items_in_batch``), ``seq_mean_token_mean`` (``grpo``),
                       ``seq_mean_token_sum_norm`` (``dr_grpo``)
``cispo``              ``token_mean`` (``cispo``; upper clamp only, cap = 1 + eps_high)
``sapo``               ``seq_mean_token_mean`` (``sapo``)
=====================  ===============================================================

KL is k3 only (Liger's estimator, the same direction as rl-losses'), advantages are one per
sequence, and there is no entropy bonus, dual clip or absolute ratio bounds. Liger's
``grpo``/``dr_grpo`` divide by all rows, empty ones included, where rl-losses divides by the
rows with a valid token: the two agree when no row is empty. Anything outside the subset
raises ``ValueError`` rather than silently computing something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rl_kernels._checks import as_mask, check_projection, check_targets, shape_str

__all__ = ["LigerPolicyLossOutput", "liger_policy_loss"]

_LOSS_TYPES: dict[tuple[str, str], str] = {
    ("ppo", "token_mean"): "dapo",
    ("ppo", "seq_mean_token_mean"): "grpo",
    ("ppo", "seq_mean_token_sum_norm"): "dr_grpo",
    ("cispo", "token_mean"): "cispo",
    ("sapo", "seq_mean_token_mean"): "sapo",
}


@dataclass(frozen=True)
class LigerPolicyLossOutput:
    """Liger's loss and the diagnostics it reports."""

    loss: torch.Tensor
    """Policy + k3 KL loss (differentiable)."""
    kl_mean: torch.Tensor
    """Mean k3 over valid tokens (0 without a KL term)."""
    clip_frac: torch.Tensor
    """Fraction of valid tokens clipped (low with A < 0, or high with A > 0)."""


def liger_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    objective: str = "ppo",
    aggregation: str = "token_mean",
    normalizer: float | None = None,
    max_length: int | None = None,
    kl_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    delta: float | None = None,
    eps_high: float = 4.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    chunk_size: int = 1,
    compiled: bool = False,
) -> LigerPolicyLossOutput:
    r"""The policy loss through Liger's ``LigerFusedLinearGRPOLoss`` (see the module table).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * Liger 0.8.5: equal: calls ``LigerFusedLinearGRPOLoss`` itself.
    * No counterpart: verl, OpenRLHF, TRL, AgileRL.

    Args:
        hidden: [N, T, H] last hidden states.
        weight: [V, H] lm_head weight.
        targets: [N, T] token ids (any value at masked positions).
        mask: [N, T] bool.
        advantages: [N] one per sequence.
        old_logprobs: [N, T] behaviour log-probs, or None (on-policy).
        ref_logprobs: [N, T] reference log-probs (needed when ``kl_coef > 0``).
        bias: [V] lm_head bias, or None.
        temperature: Logit temperature (> 0).
        objective: ``"ppo"``, ``"cispo"`` or ``"sapo"``.
        aggregation: See the module table.
        normalizer: Global token count for ``token_mean`` (Liger's ``num_items_in_batch``).
        max_length: :math:`L` of ``seq_mean_token_sum_norm`` (default T).
        kl_coef: k3 KL coefficient (Liger's ``beta``).
        is_weights: [N, T] detached per-token weights (Liger's ``vllm_is_ratio``).
        clip_low: PPO :math:`\epsilon_{low}`.
        clip_high: PPO :math:`\epsilon_{high}` (default ``clip_low``).
        delta: INTELLECT-2 cap of the unclipped ratio.
        eps_high: CISPO upper offset (cap ``1 + eps_high``, Liger's absolute ``epsilon_high``).
        tau_pos: SAPO temperature for positive advantages.
        tau_neg: SAPO temperature for negative advantages.
        chunk_size: Sequences per Liger chunk.
        compiled: Let Liger ``torch.compile`` its chunk body.

    Returns:
        :class:`LigerPolicyLossOutput`.
    """
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'liger_policy_loss needs liger-kernel: pip install "rl-kernels[liger]"'
        ) from exc
    check_projection(hidden, weight, bias, temperature)
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2] or mask.shape != targets.shape:
        raise ValueError(
            f"`hidden` {shape_str(hidden)}, `targets` {shape_str(targets)} and `mask` "
            f"{shape_str(mask)} must be [N, T, H], [N, T], [N, T]"
        )
    n, t = targets.shape
    if advantages.shape != (n,):
        raise ValueError(
            f"`advantages` must be [N] = [{n}] for the Liger backend, got {shape_str(advantages)}"
        )
    loss_type = _LOSS_TYPES.get((objective, aggregation))
    if loss_type is None:
        supported = ", ".join(f"{o}/{a}" for o, a in _LOSS_TYPES)
        raise ValueError(
            f"`objective`={objective!r} with `aggregation`={aggregation!r} is not available "
            f"in the Liger backend (supported: {supported}); use fused_policy_loss"
        )
    if normalizer is not None and aggregation != "token_mean":
        raise ValueError("`normalizer` is supported only with aggregation='token_mean' in Liger")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("`ref_logprobs` is required when `kl_coef` > 0")
    m = as_mask(mask, "targets", targets, "is_weights")
    targets = check_targets(targets, weight.shape[0], m)
    high = clip_low if clip_high is None else clip_high
    kwargs: dict[str, Any] = {
        "beta": float(kl_coef),
        "compiled": compiled,
        "use_ref_model": kl_coef > 0,
        "chunk_size": chunk_size,
        "loss_type": loss_type,
        "temperature": float(temperature),
        "max_completion_length": max_length if max_length is not None else t,
        "delta": delta,
        "sapo_temperature_pos": tau_pos,
        "sapo_temperature_neg": tau_neg,
    }
    if objective == "cispo":
        kwargs.update(epsilon_low=0.0, epsilon_high=1.0 + eps_high)
    else:
        kwargs.update(epsilon_low=clip_low, epsilon_high=high)
    loss_fn = LigerFusedLinearGRPOLoss(**kwargs)
    # Liger multiplies by the mask, so masked rows must hold finite values and valid ids.
    h = torch.where(m[..., None], hidden, torch.zeros((), dtype=hidden.dtype))
    ids = torch.where(m, targets, 0)
    loss, metrics = loss_fn(
        h,
        weight,
        ids,
        m.to(hidden.dtype),
        advantages.detach().to(hidden.dtype),
        bias=bias,
        ref_per_token_logps=ref_logprobs.detach()
        if kl_coef > 0 and ref_logprobs is not None
        else None,
        old_per_token_logps=old_logprobs.detach() if old_logprobs is not None else None,
        vllm_is_ratio=is_weights.detach() if is_weights is not None else None,
        num_items_in_batch=normalizer,
    )
    kl_mean = metrics[0] if kl_coef > 0 else loss.new_zeros(())
    return LigerPolicyLossOutput(
        loss=loss, kl_mean=kl_mean.detach(), clip_frac=metrics[-1].detach()
    )
