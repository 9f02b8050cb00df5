"""Entropy: the bonus term and the high-entropy ("forking") token mask."""

from __future__ import annotations

import torch

from rl_losses._checks import (
    as_mask,
    check_2d,
    check_choice,
    check_finite,
    check_float,
    zero_fill,
)
from rl_losses.aggregate import AGGREGATIONS, Aggregation, aggregate
from rl_losses.outputs import EntropyOutput

__all__ = ["entropy_bonus", "high_entropy_mask"]


def entropy_bonus(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
) -> EntropyOutput:
    r"""Entropy bonus as a loss term: :math:`-c \cdot \operatorname{agg}(H_t)`.

    :math:`H_t = -\sum_v \pi(v) \log\pi(v)` per token, as computed chunk-wise by rl-kernels
    (``with_entropy=True``). Minimising the returned loss raises the entropy (PPO, arXiv
    1707.06347, eq. 9; TRL ``entropy_coef``, verl ``entropy_coeff``). ``coef = 0`` only logs.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``entropy_coeff`` (sign: ours returns the loss term).
    * TRL 1.16.0: equal: ``entropy_coef`` (token mean).
    * No counterpart: OpenRLHF, Liger, AgileRL.

    Args:
        entropies: [N, T] per-token entropies (differentiable).
        mask: [N, T] bool.
        coef: Bonus coefficient :math:`c` (>= 0).
        aggregation: See :func:`rl_losses.aggregate`.
        normalizer: Global denominator.
        max_length: For ``seq_mean_token_sum_norm``.

    Returns:
        :class:`EntropyOutput`.
    """
    check_2d("entropies", entropies)
    check_float("entropies", entropies)
    m = as_mask(mask, "entropies", entropies)
    check_choice("aggregation", aggregation, AGGREGATIONS)
    check_finite("entropies", entropies, m)
    if not coef >= 0:
        raise ValueError(f"`coef` must be >= 0, got {coef}")
    loss = -coef * aggregate(entropies, m, aggregation, normalizer, max_length)
    with torch.no_grad():
        e = zero_fill(entropies.detach(), m)
        return EntropyOutput(loss=loss, entropy_mean=e.sum() / m.sum().clamp(min=1).to(e.dtype))


def high_entropy_mask(
    entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float = 0.2
) -> torch.Tensor:
    r"""Keep only the highest-entropy tokens (Wang et al., arXiv 2506.01939, "80/20").

    .. math:: \text{keep}_t = m_t \wedge H_t \ge Q_{1-\rho}(\{H_s : m_s\})

    with :math:`Q` the quantile (linear interpolation, ``torch.quantile``) over the valid
    tokens of the batch; :math:`\rho = 0.2` trains on the top 20 % "forking" tokens as in the
    paper; ``top_quantile=1`` keeps every valid token (TRL ``top_entropy_quantile``).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * TRL 1.16.0: equal with ``top_quantile=top_entropy_quantile``.
    * No counterpart: verl, OpenRLHF, Liger, AgileRL.

    Args:
        entropies: [N, T] per-token entropies.
        mask: [N, T] bool.
        top_quantile: :math:`\rho` in (0, 1].

    Returns:
        [N, T] bool: the new loss mask.
    """
    check_2d("entropies", entropies)
    m = as_mask(mask, "entropies", entropies)
    check_finite("entropies", entropies, m)
    if not 0 < top_quantile <= 1:
        raise ValueError(f"`top_quantile` must be in (0, 1], got {top_quantile}")
    valid = entropies.detach()[m]
    if valid.numel() == 0:
        return m.clone()
    if not valid.is_floating_point():
        values = valid.double()
    elif valid.dtype in (torch.float16, torch.bfloat16):  # torch.quantile takes fp32/fp64 only
        values = valid.float()
    else:
        values = valid
    threshold = torch.quantile(values, 1.0 - top_quantile)
    return m & (entropies.detach().to(values.dtype) >= threshold)
