"""The per-chunk math shared by the fused kernels: logits, log-softmax and its gradient.

Tiles are ``[c, V]``. Without entropies one tile suffices: the logits are turned into
probabilities in place, then into the logits gradient in place. Entropies need the raw
logits next to the probabilities (two tiles): computing them from ``log p`` instead would
give ``0 * -inf`` where a probability underflows.
"""

from __future__ import annotations

from typing import Any

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


def softmax_(
    z: torch.Tensor, targets: torch.Tensor, with_entropy: bool, normalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    r"""Log-prob of ``targets``, log-sum-exp, entropy and probabilities of a logits chunk.

    .. math:: \log p_y = z_y - \mathrm{lse}(z), \qquad H = -\sum_v p_v \log p_v

    Returns:
        ``(logp [c], lse [c], entropy [c] or None, p [c, V])``. Without ``with_entropy`` the
        probabilities overwrite ``z``. With it, ``z`` is overwritten by the log-probabilities
        :math:`z - \mathrm{lse}` (finite even where :math:`p` underflows, and free of the
        cancellation of :math:`\mathrm{lse} - \sum p z` on peaked rows) and ``p`` is a new tile.
        ``normalize=False`` (only without ``with_entropy``) skips the division by the row sums,
        a full pass over the tile, for a caller that reads only ``logp`` and ``lse``: ``p``
        then holds :math:`e^{z - \max z}`.
    """
    z_target = z.gather(1, targets[:, None]).squeeze(1)
    top = z.amax(dim=1)
    z.sub_(top[:, None])
    p = torch.exp(z) if with_entropy else z.exp_()
    total = p.sum(dim=1)
    log_total = torch.log(total)
    if normalize or with_entropy:
        p.div_(total[:, None])
    lse = top + log_total
    entropy = None
    if with_entropy:
        logp_all = z.sub_(log_total[:, None])
        entropy = -torch.linalg.vecdot(p, logp_all)
    return z_target - lse, lse, entropy, p


def logits_grad_(
    p: torch.Tensor,
    logp_all: torch.Tensor | None,
    targets: torch.Tensor,
    g_logp: torch.Tensor,
    entropy: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    r"""Gradient w.r.t. the raw logits of one chunk, computed in place of ``p`` (and ``logp_all``).

    .. math:: \frac{\partial \log p_y}{\partial z_k} = \mathbb 1[k = y] - p_k, \qquad
              \frac{\partial H}{\partial z_k} = -p_k(\log p_k + H)

    The temperature divides both (the logits were ``raw / temperature``). ``logp_all`` (the
    chunk's log-probabilities) is needed only for the entropy term.
    """
    if entropy is not None and g_entropy is not None:
        if logp_all is None:
            raise ValueError("the entropy gradient needs the log-probabilities `logp_all`")
        # coefficient of -p: g_logp + g_entropy * (log p + H), built in place of logp_all
        coeff = logp_all.add_(entropy[:, None]).mul_(g_entropy[:, None])
        grad = p.mul_(coeff.add_(g_logp[:, None])).neg_()
    else:
        grad = p.mul_(g_logp[:, None]).neg_()
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] += g_logp
    if temperature != 1.0:
        grad.div_(temperature)
    return grad


_COMPILED: dict[str, Any] = {}


def chunk_ops(compile_body: bool) -> tuple[Any, Any]:
    """``(softmax_, logits_grad_)``, or their ``torch.compile``-d versions (built once)."""
    if not compile_body:
        return softmax_, logits_grad_
    if not _COMPILED:
        _COMPILED["softmax_"] = torch.compile(softmax_, dynamic=True)
        _COMPILED["logits_grad_"] = torch.compile(logits_grad_, dynamic=True)
    return _COMPILED["softmax_"], _COMPILED["logits_grad_"]
