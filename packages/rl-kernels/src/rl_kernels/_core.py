"""The per-chunk math shared by the fused kernels: logits, log-softmax and its gradient."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype, upcast: bool) -> torch.dtype:
    """fp32 (or fp64 for fp64 inputs) when ``upcast``, else the input dtype."""
    if not upcast:
        return dtype
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_logits(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """``(h @ w.T + b) / temperature`` for one chunk: [c, H] x [V, H] -> [c, V]."""
    z = torch.addmm(b, h, w.T) if b is not None else torch.mm(h, w.T)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def logprob_and_entropy(
    z: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets``, log-sum-exp and (optionally) entropy of a logits chunk."""
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(1, targets[:, None]).squeeze(1) - lse
    entropy = None
    if with_entropy:
        p = torch.exp(z - lse[:, None])
        entropy = lse - (p * z).sum(dim=-1)
    return logp, lse, entropy


def logits_grad_(
    z: torch.Tensor,
    lse: torch.Tensor,
    targets: torch.Tensor,
    g_logp: torch.Tensor,
    entropy: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    r"""Gradient w.r.t. the raw logits of one chunk, computed in place of ``z``.

    With :math:`\log p = z - \mathrm{lse}`, :math:`p = e^{\log p}`:

    .. math:: \frac{\partial \log p_y}{\partial z_k} = \mathbb 1[k = y] - p_k, \qquad
              \frac{\partial H}{\partial z_k} = -p_k(\log p_k + H)

    and the temperature divides both (the logits were ``raw / temperature``).
    """
    logp_all = z.sub_(lse[:, None])
    p = torch.exp(logp_all)
    if entropy is not None and g_entropy is not None:
        # coefficient of -p: g_logp + g_entropy * (log p + H), built in place of log p
        coeff = logp_all.add_(entropy[:, None]).mul_(g_entropy[:, None]).add_(g_logp[:, None])
        grad = p.mul_(coeff).neg_()
    else:
        grad = p.mul_(g_logp[:, None]).neg_()
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] += g_logp
    if temperature != 1.0:
        grad.div_(temperature)
    return grad
