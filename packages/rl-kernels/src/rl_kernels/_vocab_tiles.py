r"""Row chunks whose logits are also split over the vocabulary: ``[c, Vt]`` tiles.

With ``vocab_chunk`` set, the kernels never hold a ``[c, V]`` tile: :func:`tiled_stats` walks
the vocabulary in tiles of ``Vt`` columns with a running maximum (the online log-sum-exp, in
the tiles' base :math:`b`, 2 or e: ``u`` are logits in that base, see ``rl_kernels._core``),

.. math:: m' = \max(m, \max_v u_v), \qquad s' = s\,b^{m - m'} + \textstyle\sum_v b^{u_v - m'},
          \qquad \mathrm{lse}_b = m + \log_b s,

and :func:`tiled_grads` walks it again to add each tile's share of the input gradients from
:math:`\partial \log p_y / \partial z = e_y - p` and
:math:`\partial H / \partial z = -p (\log p + H)`. The entropy takes one more pass over the
tiles once the log-sum-exp is known (:math:`H = -\ln b \sum_v p_v (u_v - \mathrm{lse}_b)`, free
of the cancellation of :math:`\mathrm{lse} - \sum_v p_v z_v`). Shapes: ``c`` rows, ``H`` hidden,
``Vt`` columns per tile.
"""

from __future__ import annotations

import torch

from rl_kernels._core import LN2, HeadGemms, entropy_coeff_


def _tiles(vocab: int, vt: int) -> range:
    return range(0, vocab, vt)


def _target_columns(
    targets: torch.Tensor, vocab: int, vt: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(tile [c], column [c, 1], last [c, 1])``: where each row's target lies among the tiles.

    ``tile`` is the index of the tile that holds the target, ``column`` its column in that tile
    and ``last`` the same clamped into the last (possibly narrower) tile. Computed once per row
    chunk, so that a tile costs one comparison (``tile == k``); the callers leave the entries
    of the other rows alone. Masks instead of the rows' indices: no tile waits for the device
    to report how many rows it holds.
    """
    tile = torch.div(targets, vt, rounding_mode="floor")
    column = (targets - tile * vt)[:, None]
    width = vocab - (len(_tiles(vocab, vt)) - 1) * vt
    return tile, column, column.clamp(max=width - 1) if width < vt else column


def tiled_stats(
    h: torch.Tensor,
    gemms: HeadGemms,
    targets: torch.Tensor,
    temperature: float,
    vt: int,
    with_entropy: bool,
    with_spi: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    r"""``(logp, lse, entropy or None, sum_pi_squared or None)`` [c] of one row chunk.

    ``h`` [c, H] in the GEMMs' operand dtype; ``targets`` [c]. Log-probs and entropies in nats,
    ``lse`` in the tiles' base.
    :math:`\sum_v p_v^2 = \sum_v b^{2(u_v - m)} / s^2` accumulates online like ``s``.
    """
    c, vocab = h.shape[0], gemms.w.shape[0]
    m = torch.full((c,), float("-inf"), dtype=gemms.cd, device=h.device)
    s = torch.zeros(c, dtype=gemms.cd, device=h.device)
    q = torch.zeros(c, dtype=gemms.cd, device=h.device) if with_spi else None
    u_y = torch.zeros(c, dtype=gemms.cd, device=h.device)
    tile, column, last = _target_columns(targets, vocab, vt)
    for k, v0 in enumerate(_tiles(vocab, vt)):
        v1 = min(v0 + vt, vocab)
        u = gemms.logits(h, temperature, cols=slice(v0, v1))  # [c, Vt]
        col = column if v1 - v0 == vt else last
        u_y = torch.where(tile == k, u.gather(1, col).squeeze(1), u_y)
        top = torch.maximum(m, u.amax(dim=1))
        rescale = gemms.exp(m - top)  # 0 at the first tile (m = -inf)
        e = gemms.exp(u.sub_(top[:, None]), out=u)
        s.mul_(rescale).add_(e.sum(dim=1))
        if q is not None:
            q.mul_(rescale.square()).add_(torch.linalg.vecdot(e, e))
        m = top
        del u, e
    nats = LN2 if gemms.base2 else 1.0
    lse = m + (torch.log2(s) if gemms.base2 else torch.log(s))
    spi = q / s.square() if q is not None else None
    entropy = None
    if with_entropy:
        entropy = torch.zeros(c, dtype=gemms.cd, device=h.device)
        for v0 in _tiles(vocab, vt):
            v1 = min(v0 + vt, vocab)
            logp_all = gemms.logits(h, temperature, cols=slice(v0, v1)).sub_(lse[:, None])
            entropy.sub_(torch.linalg.vecdot(gemms.exp(logp_all), logp_all))
            del logp_all
        if gemms.base2:
            entropy.mul_(nats)
    logp = u_y - lse
    return (logp.mul_(nats) if gemms.base2 else logp), lse, entropy, spi


def tiled_grads(
    h: torch.Tensor,
    gemms: HeadGemms,
    targets: torch.Tensor,
    lse: torch.Tensor,
    g_logp: torch.Tensor,
    entropy: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
    vt: int,
    grad_h: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_b: torch.Tensor | None,
) -> None:
    r"""Add one row chunk's share to the input gradients, tile by tile.

    ``lse`` [c] are the rows' log-sum-exps in the tiles' base (:func:`tiled_stats`);
    ``g_logp`` [c] and ``g_entropy`` [c] are the gradients of the chunk's log-probs and
    entropies; ``grad_h`` [c, H] (in ``gemms.cd``, zeroed by the caller) receives the chunk's
    hidden-state gradient, ``grad_w`` [V, H] and ``grad_b`` [V] the rows of each tile. The
    gradient w.r.t. the raw logits is :math:`(g (e_y - p) - g_H\, p (\log p + H)) / \tau`.
    """
    vocab = gemms.w.shape[0]
    tile, column, last = _target_columns(targets, vocab, vt)
    neg_g = g_logp.neg()[:, None]
    for k, v0 in enumerate(_tiles(vocab, vt)):
        v1 = min(v0 + vt, vocab)
        cols = slice(v0, v1)
        logp_all = gemms.logits(h, temperature, cols=cols).sub_(lse[:, None])  # [c, Vt]
        if entropy is None or g_entropy is None:  # the probabilities in place: one tile
            grad = gemms.exp(logp_all, out=logp_all).mul_(neg_g)
        else:
            p = gemms.exp(logp_all)
            coeff = entropy_coeff_(logp_all, entropy, g_entropy, g_logp, gemms.base2)
            grad = p.mul_(coeff).neg_()
            del p, coeff
        del logp_all
        col = column if v1 - v0 == vt else last
        grad.scatter_add_(1, col, torch.where(tile == k, g_logp, 0.0)[:, None])
        if temperature != 1.0:
            grad.div_(temperature)
        if grad_h is not None:
            grad_h.add_(gemms.input_grad(grad, cols=cols))
        if grad_w is not None:
            gemms.add_weight_grad(grad_w[cols], grad, h)
        if grad_b is not None:
            grad_b[cols].add_(grad.sum(dim=0))
        del grad
