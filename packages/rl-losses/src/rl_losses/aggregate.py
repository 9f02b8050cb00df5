"""Loss aggregation: how per-token (or per-unit) losses become one scalar.

The GRPO-family variants differ mostly here, so the weighting is an explicit argument.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

import torch

from rl_losses._checks import as_mask, check_2d, check_choice, check_float, zero_fill

__all__ = ["AGGREGATIONS", "Aggregation", "aggregate"]

Aggregation = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
]
AGGREGATIONS: tuple[str, ...] = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


def _denominator(
    normalizer: float | torch.Tensor | None, default: torch.Tensor, like: torch.Tensor
) -> torch.Tensor:
    if normalizer is None:
        return default.to(like.dtype)
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(
                f"`normalizer` must be a number or a 1-element tensor, got shape "
                f"{list(normalizer.shape)}"
            )
        _check_normalizer(float(normalizer.detach()), normalizer)  # one host synchronisation
        return normalizer.detach().to(dtype=like.dtype, device=like.device).reshape(())
    _check_normalizer(float(normalizer), normalizer)
    return torch.tensor(float(normalizer), dtype=like.dtype, device=like.device)


def _check_normalizer(value: float, normalizer: object) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"`normalizer` must be finite and > 0 (the global token or sequence count), got "
            f"{normalizer}"
        )


def _check_max_length(max_length: int | None) -> None:
    if max_length is None:
        return
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral):
        raise ValueError(
            f"`max_length` must be a positive int (L of seq_mean_token_sum_norm) or None, got "
            f"{max_length!r}"
        )
    if max_length < 1:
        raise ValueError(f"`max_length` must be >= 1, got {max_length}")


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
) -> torch.Tensor:
    r"""Reduce a per-token loss [N, T] to a scalar with an explicit weighting.

    With :math:`m` the mask, :math:`n_i = \sum_t m_{i,t}` and :math:`S` the rows with
    :math:`n_i > 0`:

    * ``"token_mean"``: :math:`\sum_{i,t} m l / D`, :math:`D = \sum m`. Every token weighs the
      same, so long completions weigh more (DAPO, arXiv 2503.14476, eq. 12; verl's default
      ``token-mean``; TRL ``dapo``/``bnpo``).
    * ``"seq_mean_token_mean"``: :math:`\sum_{i \in S} \frac{1}{n_i}\sum_t m l / D`,
      :math:`D = |S|`. Every sequence weighs the same (the GRPO paper, arXiv 2402.03300,
      eq. 3; TRL ``grpo``; AgileRL's ``micro_batch``).
    * ``"seq_mean_token_sum"``: :math:`\sum_{i,t} m l / D`, :math:`D = |S|`.
    * ``"seq_mean_token_sum_norm"``: :math:`\sum_{i,t} m l / (D \cdot L)`, :math:`D = |S|`,
      :math:`L` = ``max_length`` (default T): a constant normaliser that removes the length
      bias (Dr. GRPO, arXiv 2503.20783, Sec. 3.1). verl 0.9.1's ``seq-mean-token-sum-norm``
      divides by the non-empty sequence count and then by ``loss_scale_factor``: our default
      with ``max_length=loss_scale_factor``. TRL's ``dr_grpo`` divides by every row
      (``per_token_loss.size(0)``), empty ones included: pass ``normalizer=N``.

    ``normalizer`` replaces :math:`D` by a global count: the valid tokens (``token_mean``) or
    sequences (the ``seq_*`` modes) of the whole gradient-accumulation window, across
    processes. Summing the micro-batch losses then gives the full-batch loss exactly, which a
    per-micro-batch mean does not.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``agg_loss`` (verl 0.9.1 ``seq-mean-token-sum-norm`` = ours,
      ``max_length=loss_scale_factor``).
    * OpenRLHF 0.11.2: equal: ``aggregate_loss``.
    * TRL 1.16.0: equal with ``normalizer=N`` for ``grpo``/``sapo``/``dr_grpo``/``luspo`` (TRL
      divides by every row, empty ones included; ours by rows with a valid token).
    * Liger 0.8.5: equal with as TRL.
    * AgileRL 2.58.0: equal with ``micro_batch``: ``normalizer=N`` (AgileRL divides by every row,
      empty ones included; ours by rows with a valid token).

    Args:
        loss: [N, T] per-token (or [N, U] per-unit) loss.
        mask: [N, T] bool, True where the token counts.
        mode: The weighting, one of the four above.
        normalizer: Global :math:`D` (finite, > 0; a tensor is read once on the host to check
            it), or None for the local count.
        max_length: :math:`L` (an int >= 1) for ``seq_mean_token_sum_norm``; default T.
            The other modes do not read it.

    Returns:
        The scalar loss; 0 (with zero gradient) when nothing is valid, never NaN.
    """
    check_2d("loss", loss, "[N, T]")
    check_float("loss", loss)
    m = as_mask(mask, "loss", loss)
    check_choice("mode", mode, AGGREGATIONS)
    _check_max_length(max_length)
    lz = zero_fill(loss, m)
    counts = m.sum(dim=1)
    rows = (counts > 0).sum()
    if mode == "token_mean":
        num = lz.sum()
        den = _denominator(normalizer, m.sum(), lz)
    elif mode == "seq_mean_token_mean":
        num = (lz.sum(dim=1) / counts.clamp(min=1).to(lz.dtype)).sum()
        den = _denominator(normalizer, rows, lz)
    elif mode == "seq_mean_token_sum":
        num = lz.sum()
        den = _denominator(normalizer, rows, lz)
    else:
        length = max(loss.shape[1], 1) if max_length is None else int(max_length)
        num = lz.sum()
        den = _denominator(normalizer, rows, lz) * length
    return num / den.clamp(min=torch.finfo(lz.dtype).tiny)
