"""Reward transforms that need only lengths: DAPO's overlong shaping."""

from __future__ import annotations

import torch

from rl_advantages._checks import as_float, check_ndim, check_tensor

__all__ = ["overlong_penalty"]


def overlong_penalty(
    lengths: torch.Tensor,
    max_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    r"""DAPO soft overlong punishment (Yu et al., arXiv 2503.14476, eq. 13).

    .. math:: R_{\text{length}}(y) = \begin{cases}
              0, & |y| \le L_{\max} - L_{\text{cache}} \\
              \frac{(L_{\max} - L_{\text{cache}}) - |y|}{L_{\text{cache}}},
                 & L_{\max} - L_{\text{cache}} < |y| \le L_{\max} \\
              -1, & |y| > L_{\max}
              \end{cases}

    scaled by ``penalty_factor`` (OpenRLHF's ``overlong_penalty_factor``, verl's
    ``overlong_buffer.penalty_factor``). Add the result to the task reward.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: DAPO recipe's overlong buffer.
    * OpenRLHF 0.11.2: equal: ``overlong_buffer_len`` / ``overlong_penalty_factor``.
    * TRL 1.16.0: equal: ``get_soft_overlong_punishment``.
    * No counterpart: Liger, AgileRL.

    Args:
        lengths: [N] completion lengths in tokens.
        max_length: :math:`L_{\max}`, the generation budget.
        buffer_length: :math:`L_{\text{cache}}` (> 0 and <= ``max_length``).
        penalty_factor: Scale of the penalty (>= 0).

    Returns:
        [N] penalties in ``[-penalty_factor, 0]``, in ``lengths``' float dtype (torch's
        default float dtype for integer lengths).
    """
    check_tensor("lengths", lengths)
    check_ndim("lengths", lengths, 1, "[N]")
    if not 0 < buffer_length <= max_length:
        raise ValueError(
            f"`buffer_length` must be in (0, max_length = {max_length}], got {buffer_length}"
        )
    if not penalty_factor >= 0:
        raise ValueError(f"`penalty_factor` must be >= 0, got {penalty_factor}")
    length = as_float(lengths)
    start = max_length - buffer_length
    ramp = (start - length) / buffer_length
    penalty = torch.where(length <= start, 0.0, torch.where(length <= max_length, ramp, -1.0))
    return penalty * penalty_factor
