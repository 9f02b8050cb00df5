"""lm_head -> per-token log-prob, entropy and sum of squared probabilities, no full logits.

``fused_logprobs`` computes them chunk by chunk; ``sum_pi_squared`` is the last from logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from rl_kernels._checks import (
    check_chunk_rows,
    check_finite_rows,
    check_projection,
    check_targets,
    check_vocab_chunk,
    shape_str,
)
from rl_kernels._core import HeadGemms, chunk_ops, compute_dtype, half_gemms_default
from rl_kernels._vocab_tiles import tiled_grads, tiled_stats
from rl_kernels.chunking import DEFAULT_MEMORY_BUDGET, auto_chunk_rows

__all__ = ["fused_logprobs", "sum_pi_squared"]


class _FusedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
        upcast: bool,
        compile_body: bool,
        keep_probs: bool,
        project: bool,
        check_finite: bool,
        with_spi: bool,
        half: bool,
        vt: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        softmax_, _ = chunk_ops(compile_body)
        cd = compute_dtype(hidden.dtype, upcast)
        gemms = HeadGemms(weight, bias, cd, half)
        m = hidden.shape[0]
        logp = hidden.new_empty(m, dtype=cd)
        lse = hidden.new_empty(m, dtype=cd)  # in the tiles' base (rl_kernels._core)
        ent = hidden.new_empty(m if with_entropy else 0, dtype=cd)
        spi = hidden.new_empty(m if with_spi else 0, dtype=cd)
        if check_finite:
            check_finite_rows(hidden)  # once, not per chunk
        # a frozen head without entropies (``project``, set by fused_logprobs): the gradient of
        # the hidden states needs only p W per row, computed here; the backward is elementwise
        pw = hidden.new_empty((m, hidden.shape[1]), dtype=cd) if project else None
        # probabilities the caller allows to keep: the backward reads them instead of
        # recomputing the logits (one GEMM and two passes over each tile fewer)
        keep = keep_probs and not project and not with_entropy and not vt
        ctx.probs = [] if keep else None
        for s in range(0, m, chunk):
            e = min(s + chunk, m)
            if vt:  # tiles of vt vocabulary columns (rl_kernels._vocab_tiles)
                h = gemms.rows(hidden[s:e])
                lp, ls, en, sp = tiled_stats(
                    h, gemms, targets[s:e], temperature, vt, with_entropy, with_spi
                )
                logp[s:e], lse[s:e] = lp, ls
                if en is not None:
                    ent[s:e] = en
                if sp is not None:
                    spi[s:e] = sp
                continue
            z = gemms.logits(gemms.rows(hidden[s:e]), temperature)
            # else the probabilities are dropped here (the backward recomputes them): no division
            lp, ls, en, probs = softmax_(
                z, targets[s:e], with_entropy, keep or project, gemms.base2
            )
            logp[s:e], lse[s:e] = lp, ls
            if en is not None:
                ent[s:e] = en
            if with_spi:  # probs may be unnormalised (b^{u - max u}): divide by the squared sum
                spi[s:e] = torch.linalg.vecdot(probs, probs) / probs.sum(dim=1).square()
            if keep:
                ctx.probs.append(probs)
            if pw is not None:
                torch.mm(probs, gemms.w, out=pw[s:e])
            del z, probs  # free this tile before the next chunk allocates its own
        ctx.hidden_dtype = hidden.dtype
        if pw is not None:  # hidden and the tiles are not needed again
            ctx.save_for_backward(None, weight, None, targets, None, None, pw)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse, ent, None)
        ctx.temperature, ctx.chunk, ctx.with_entropy, ctx.cd = temperature, chunk, with_entropy, cd
        ctx.compile_body, ctx.half, ctx.vt = compile_body, half, vt
        ctx.mark_non_differentiable(lse, spi)
        return logp, ent, spi

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor | None, _g_spi: Any = None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, ent, pw = ctx.saved_tensors
        _, logits_grad_ = chunk_ops(ctx.compile_body)
        cd, chunk, temperature = ctx.cd, ctx.chunk, ctx.temperature
        if pw is not None:  # d log p_y / d h = (W_y - p W) / temperature, as _accumulate_probs
            g_raw = g_logp.to(cd) if temperature == 1.0 else g_logp.to(cd) / temperature
            w_y = weight.index_select(0, targets).to(cd)
            grad = (pw - w_y).mul_(g_raw.neg()[:, None]).to(ctx.hidden_dtype)
            return (grad, *(None,) * 14)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        gemms = HeadGemms(weight, bias, cd, ctx.half)
        # with half-precision GEMMs or vocabulary tiles each chunk's rows are written once,
        # converted on the write: the one rounding an fp32 buffer would get at the end, without
        # that [M, H] fp32 buffer (the other paths form the gradient in place, in ``cd``)
        h_dtype = hidden.dtype if (ctx.half or ctx.vt) else cd
        grad_h = torch.empty_like(hidden, dtype=h_dtype) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=cd) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=cd) if (need_b and bias is not None) else None
        use_ent = ctx.with_entropy and g_ent is not None and g_ent.numel() > 0
        g_logp = g_logp.to(cd)
        g_raw = g_logp if temperature == 1.0 else g_logp / temperature  # w.r.t. the raw logits
        for k, s in enumerate(range(0, hidden.shape[0], chunk)):
            e = min(s + chunk, hidden.shape[0])
            h = gemms.rows(hidden[s:e])
            if ctx.vt:
                gh = torch.zeros_like(h, dtype=cd) if grad_h is not None else None
                tiled_grads(
                    h, gemms, targets[s:e], lse[s:e], g_logp[s:e],
                    ent[s:e] if use_ent else None,
                    g_ent[s:e].to(cd) if (use_ent and g_ent is not None) else None,
                    temperature, ctx.vt, gh, grad_w, grad_b,
                )  # fmt: skip
                if grad_h is not None and gh is not None:
                    grad_h[s:e] = gh
                continue
            if ctx.probs is not None:  # kept by the forward: no recomputation
                p = ctx.probs[k]
                _accumulate_probs(p, h, gemms, targets[s:e], g_raw[s:e], grad_h, grad_w, grad_b, s)
                continue
            logits = gemms.logits(h, temperature)
            logits.sub_(lse[s:e, None])  # log-probabilities in the tiles' base
            if not use_ent:
                p = gemms.exp(logits, out=logits)
                _accumulate_probs(
                    p, h, gemms, targets[s:e], g_raw[s:e], grad_h, grad_w, grad_b, s, own=True
                )
                del p, logits  # free this tile before the next chunk allocates its own
                continue
            p = gemms.exp(logits)
            grad_z = logits_grad_(
                p,
                logits,
                targets[s:e],
                g_logp[s:e],
                ent[s:e],
                g_ent[s:e].to(cd) if g_ent is not None else None,
                temperature,
                gemms.base2,
            )
            _accumulate(grad_z, h, gemms, grad_h, grad_w, grad_b, s, e)
            del p, grad_z, logits  # free this tile before the next chunk allocates its own
        return (
            grad_h.to(hidden.dtype) if grad_h is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None, None, None, None, None, None, None, None, None,
        )  # fmt: skip


def _accumulate_probs(
    p: torch.Tensor,
    h: torch.Tensor,
    gemms: HeadGemms,
    targets: torch.Tensor,
    g: torch.Tensor,
    grad_h: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_b: torch.Tensor | None,
    s: int,
    own: bool = False,
) -> None:
    r"""Add one chunk's (rows ``s:``) share to the input gradients from its probabilities.

    ``p`` [c, V] are the chunk's probabilities and ``g`` [c] the gradient of its log-probs
    divided by the temperature, so the logits gradient is :math:`g (e_y - p)` and

    .. math:: \partial h = g \, (W_y - p W), \quad
              \partial W = \textstyle\sum_i g_i e_{y_i} h_i^\top - p^\top (g h), \quad
              \partial b = \textstyle\sum_i g_i e_{y_i} - p^\top g

    without forming that ``[c, V]`` gradient: the GEMMs read ``p`` as it is. With half-precision
    GEMMs the gradient is formed in place of ``p`` first (rounding ``p`` alone would lose
    :math:`W_y - p W` to cancellation where :math:`p_y \approx 1`), in place of ``p`` when the
    caller ``own``s it (else ``p``, kept by the forward, stays as it is).
    """
    if gemms.half:
        grad_z = p.mul_(g.neg()[:, None]) if own else p * g.neg()[:, None]
        grad_z[torch.arange(p.shape[0], device=p.device), targets] += g
        _accumulate(grad_z, h, gemms, grad_h, grad_w, grad_b, s, s + p.shape[0])
        return
    w = gemms.w
    if grad_h is not None:
        out = grad_h[s : s + p.shape[0]]
        torch.mm(p, w, out=out)
        out.sub_(w.index_select(0, targets)).mul_(g.neg()[:, None])
    if grad_w is not None or grad_b is not None:
        gh = h * g[:, None]
        if grad_w is not None:
            grad_w.addmm_(p.T, gh, alpha=-1.0)
            grad_w.index_add_(0, targets, gh)
        if grad_b is not None:
            grad_b.addmv_(p.T, g, alpha=-1.0)
            grad_b.index_add_(0, targets, g)


def _accumulate(
    grad_z: torch.Tensor,
    h: torch.Tensor,
    gemms: HeadGemms,
    grad_h: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_b: torch.Tensor | None,
    s: int,
    e: int,
) -> None:
    """Add one chunk's (rows ``s:e``) share to the input gradients, from its logits gradient."""
    if grad_h is not None:
        gemms.input_grad(grad_z, out=grad_h[s:e])
    if grad_w is not None:
        gemms.add_weight_grad(grad_w, grad_z, h)
    if grad_b is not None:
        grad_b.add_(grad_z.sum(dim=0))


def fused_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = False,
    *,
    upcast: bool = True,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    compile: bool = False,
    check_finite: bool = True,
    with_sum_pi_squared: bool = False,
    half_gemms: bool | None = None,
    vocab_chunk: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    r"""Per-token log-probs (and entropies) straight from hidden states and the lm_head weight.

    .. math:: z = (h W^\top + b) / \tau, \qquad \log p_y = z_y - \log\sum_v e^{z_v}, \qquad
              H = -\sum_v p_v \log p_v

    computed ``chunk_rows`` rows at a time, so the ``[M, V]`` logits never exist: the peak
    extra memory is about two ``[chunk_rows, V]`` tiles. The backward accumulates the gradients
    of ``hidden``, ``weight`` and ``bias`` chunk by chunk
    (:math:`\partial \log p_y / \partial z = e_y - p`,
    :math:`\partial H / \partial z = -p (\log p + H)`), from probabilities kept by the forward
    where they fit an eighth of ``memory_budget``, else from logits recomputed (one extra GEMM
    against the naive path; :func:`rl_kernels.fused_policy_loss` avoids it). With a frozen head
    (only ``hidden`` needs a gradient, as under LoRA) and without entropies, the forward also
    computes :math:`p W` [M, H] chunk by chunk, since

    .. math:: \partial \log p_y / \partial h = (W_y - p W) / \tau,

    and the backward is elementwise: two GEMMs in all, as the naive path, and an ``[M, H]``
    buffer kept instead of ``[M, V]`` probabilities.

    Logits and reductions run in fp32 for half-precision inputs (``upcast=True``, the default);
    ``upcast=False`` keeps the input dtype throughout. Gradients come back in each input's
    dtype. How the fp32 logits are made from half-precision inputs is ``half_gemms``'s choice
    (:class:`rl_kernels._core.HeadGemms`): half-precision GEMMs that accumulate in fp32 (the
    default on CUDA), or an fp32 copy of ``weight`` (an extra ``V x H`` buffer) and fp32 GEMMs.

    Args:
        hidden: [M, H] last hidden states (M = N*T flattened tokens).
        weight: [V, H] lm_head weight.
        targets: [M] token ids in [0, V).
        bias: [V] lm_head bias, or None.
        temperature: Sampling temperature :math:`\tau` > 0 (divide the logits).
        chunk_rows: Rows per chunk (a positive int); None sizes it with
            :func:`rl_kernels.auto_chunk_rows`.
        with_entropy: Also return the entropy of each row's distribution.
        upcast: Compute in fp32 (True) or in the input dtype.
        memory_budget: Bytes for one fp32 logits tile when ``chunk_rows`` is None.
        compile: ``torch.compile`` the per-chunk softmax and gradient (opt-in, meant for
            CUDA; it works on CPU through inductor's C++ backend, but the first call spends
            10-45 s compiling and new shapes recompile).
        check_finite: Raise on a non-finite row of ``hidden`` (one pass over it); False for a
            caller that has checked them already.
        with_sum_pi_squared: Also return :math:`\sum_v p_v^2` of each row (no gradient; see
            :func:`sum_pi_squared`), from the same tiles as the log-probs (no extra GEMM).
        half_gemms: For fp16/bf16 inputs with ``upcast``: GEMMs on the half-precision operands
            with fp32 results (True), or on fp32 copies (False). None: True on CUDA.
        vocab_chunk: Also split each chunk's logits over the vocabulary, in tiles of this many
            columns (an online log-sum-exp, ``rl_kernels._vocab_tiles``): the tiles are
            ``[chunk_rows, vocab_chunk]`` and ``chunk_rows`` is sized for them. None: whole
            rows of the vocabulary. Costs one more pass over the logits with ``with_entropy``.

    Returns:
        ``logprobs`` [M], or ``(logprobs [M], entropies [M])`` with ``with_entropy``; with
        ``with_sum_pi_squared`` its ``sum_pi_squared`` [M] is appended to either
        (``(logprobs, sum_pi_squared)`` or ``(logprobs, entropies, sum_pi_squared)``).
    """
    check_projection(hidden, weight, bias, temperature)
    if hidden.ndim != 2:
        raise ValueError(f"`hidden` must have shape [M, H], got {shape_str(hidden)}")
    if targets.shape != (hidden.shape[0],):
        raise ValueError(
            f"`targets` has shape {shape_str(targets)} but `hidden` has shape "
            f"{shape_str(hidden)}; targets must be [M]"
        )
    targets = check_targets(targets, weight.shape[0], None)
    m = hidden.shape[0]
    vt = check_vocab_chunk(vocab_chunk, weight.shape[0])
    check_chunk_rows(chunk_rows)
    chunk = (
        auto_chunk_rows(vt or weight.shape[0], memory_budget, total_rows=m, cpu=hidden.is_cpu)
        if chunk_rows is None
        else chunk_rows
    )
    cd = compute_dtype(hidden.dtype, upcast)
    grads = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    keep = grads and m * weight.shape[0] * cd.itemsize <= memory_budget // 8
    half = half_gemms_default(hidden, weight, upcast) if half_gemms is None else half_gemms
    frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
    project = grads and frozen and not (with_entropy or vt or half)
    logp, ent, spi = _FusedLogProbs.apply(
        hidden, weight, bias, targets, float(temperature), int(chunk), with_entropy, upcast,
        compile, keep, project, check_finite, with_sum_pi_squared, bool(half), vt,
    )  # fmt: skip
    out: tuple[torch.Tensor, ...] = (logp, ent) if with_entropy else (logp,)
    if with_sum_pi_squared:
        out = (*out, spi)
    return out if len(out) > 1 else logp


def sum_pi_squared(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    r""":math:`\sum_v \pi(v)^2` of the softmax over the last dimension of ``logits`` (no grad).

    .. math:: \sum_v \pi(v)^2 = \exp\big(\mathrm{lse}(2z) - 2\,\mathrm{lse}(z)\big), \qquad
              z = \text{logits} / \tau

    the collision probability of the distribution: :math:`1/V` for uniform logits, 1 for a
    one-hot one. With the sampled token's probability :math:`\pi_y` it gives the squared norm
    of the score with respect to the logits, :math:`\|e_y - \pi\|^2 = 1 - 2\pi_y + \sum_v
    \pi(v)^2`, which verl's optimal token baseline (``rl_advantages.optimal_token_baseline``,
    verl#4678) accumulates along each path. This is the plain path, for a caller that holds
    the logits; :func:`fused_logprobs` (``with_sum_pi_squared=True``) computes the same from
    the hidden states chunk by chunk, without the ``[M, V]`` logits.

    Args:
        logits: [..., V] logits (any float dtype; reduced in fp32 at least).
        temperature: :math:`\tau` > 0 dividing the logits (the sampler's).

    Returns:
        [...] in fp32 (fp64 for fp64 logits).
    """
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"`logits` must have shape [..., V] with V >= 1, got {shape_str(logits)}")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0, got {temperature}")
    with torch.no_grad():
        z = logits.to(compute_dtype(logits.dtype, True))
        if temperature != 1.0:
            z = z / temperature
        return torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1))
