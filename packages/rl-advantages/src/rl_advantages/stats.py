"""Masked statistics: sums, means, variances and whitening over the valid entries.

``mask`` is True where an entry counts. Entries where it is False never influence a result,
even when they hold NaN or infinity.
"""

from __future__ import annotations

import torch

from rl_advantages._checks import as_float, as_mask, check_nonnegative, check_tensor

__all__ = ["masked_mean", "masked_sum", "masked_var", "whiten"]


def _reduce_sum(x: torch.Tensor, dim: int | None, keepdim: bool) -> torch.Tensor:
    if dim is None:
        total = x.sum()
        return total.reshape([1] * x.ndim) if keepdim else total
    return x.sum(dim=dim, keepdim=keepdim)


def _prepare(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_tensor("x", x)
    m = as_mask("mask", mask, "x", x)
    x = as_float(x)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)), m


def masked_sum(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False
) -> torch.Tensor:
    r"""Sum of the valid entries: :math:`\sum_i m_i x_i`.

    Args:
        x: Values, any shape.
        mask: Bool, same shape as ``x``; True where the entry counts.
        dim: Dimension to reduce; ``None`` reduces everything.
        keepdim: Keep the reduced dimension(s) with size 1.

    Returns:
        The sum, 0 where no entry is valid.
    """
    xz, _ = _prepare(x, mask)
    return _reduce_sum(xz, dim, keepdim)


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False
) -> torch.Tensor:
    r"""Mean of the valid entries: :math:`\sum_i m_i x_i / \sum_i m_i`.

    Args:
        x: Values, any shape.
        mask: Bool, same shape as ``x``; True where the entry counts.
        dim: Dimension to reduce; ``None`` reduces everything.
        keepdim: Keep the reduced dimension(s) with size 1.

    Returns:
        The mean; 0 (not NaN) where no entry is valid.
    """
    xz, m = _prepare(x, mask)
    count = _reduce_sum(m.to(xz.dtype), dim, keepdim)
    return _reduce_sum(xz, dim, keepdim) / count.clamp(min=1)


def masked_var(
    x: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    keepdim: bool = False,
    unbiased: bool = True,
) -> torch.Tensor:
    r"""Variance of the valid entries.

    .. math:: \bar x = \frac{\sum_i m_i x_i}{n},\quad
              \mathrm{Var} = \frac{\sum_i m_i (x_i - \bar x)^2}{n - 1 \text{ (unbiased) or } n}

    with :math:`n = \sum_i m_i`. ``unbiased=True`` is Bessel's correction, as ``torch.std``
    and every peer's group std use (TRL, verl, OpenRLHF, AgileRL).

    Args:
        x: Values, any shape.
        mask: Bool, same shape as ``x``; True where the entry counts.
        dim: Dimension to reduce; ``None`` reduces everything.
        keepdim: Keep the reduced dimension(s) with size 1.
        unbiased: Divide by ``n - 1`` (True) or ``n`` (False).

    Returns:
        The variance; 0 where fewer than 2 (unbiased) or 1 (biased) entries are valid.
    """
    xz, m = _prepare(x, mask)
    count = _reduce_sum(m.to(xz.dtype), dim, True)
    mean = _reduce_sum(xz, dim, True) / count.clamp(min=1)
    dev = torch.where(m, xz - mean, torch.zeros((), dtype=xz.dtype, device=xz.device))
    sq = _reduce_sum(dev * dev, dim, keepdim)
    if not keepdim:
        count = count.reshape(sq.shape)
    denom = count - 1 if unbiased else count
    var = sq / denom.clamp(min=1)
    return torch.where(denom > 0, var, torch.zeros((), dtype=var.dtype, device=var.device))


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    r"""Whiten the valid entries with statistics over all of them (the whole batch).

    .. math:: w_i = \frac{x_i - \bar x}{\sqrt{\mathrm{Var}(x) + \epsilon}}
              \;(+\,\bar x \text{ if not shift\_mean})

    This is the ``masked_whiten`` of TRL, verl and AgileRL: REINFORCE++ (arXiv 2501.03262,
    Sec. 3) whitens token returns this way over the global batch, and PPO implementations
    whiten GAE advantages with it. With ``shift_mean=False`` the mean is restored after
    scaling (TRL/verl convention), which keeps the sign of rewards.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``masked_whiten``.
    * OpenRLHF 0.11.2: equal with ``unbiased=False, eps=0`` (``masked_normalize``; equal while var
      >= 1e-8).
    * TRL 1.16.0: equal: ``masked_whiten``.
    * AgileRL 2.58.0: equal: ``masked_whiten``.
    * No counterpart: Liger.

    Args:
        x: Values, any shape (typically ``[N, T]`` or ``[N, K]``).
        mask: Bool, same shape as ``x``; True where the entry counts.
        shift_mean: Leave the result centred at 0 (True) or at the original mean (False).
        unbiased: Variance with ``n - 1`` (True) or ``n`` (False).
        eps: Added to the variance inside the square root.

    Returns:
        Same shape as ``x``; 0 at invalid entries. With fewer than 2 valid entries there is
        no spread to normalise and ``x`` is returned unchanged at the valid entries; with
        zero variance and ``eps = 0`` the centred values (all 0) are returned, never NaN.
    """
    check_nonnegative("eps", eps)
    xz, m = _prepare(x, mask)
    mean = masked_mean(xz, m)
    var = masked_var(xz, m, unbiased=unbiased)
    denom = var + eps
    scale = torch.where(denom > 0, torch.rsqrt(denom.clamp(min=torch.finfo(denom.dtype).tiny)), 0.0)
    w = (xz - mean) * scale
    if not shift_mean:
        w = w + mean
    w = torch.where(m.sum() >= 2, w, xz)
    return torch.where(m, w, torch.zeros((), dtype=w.dtype, device=w.device))
