r"""``fused_policy_loss``: lm_head -> log-probs -> policy/KL/entropy loss, chunk by chunk.

The loss of a token-level objective aggregated over tokens is a weighted sum
:math:`L = \sum_t c_t\, \ell_t(\log p_t, H_t)` whose weights :math:`c_t` depend only on the mask,
the aggregation mode and the normaliser. So each chunk can compute its logits, its
log-probs, the per-token loss terms, their derivatives, and at once the chunk's share of the
gradients of ``hidden``, ``weight`` and ``bias`` (as Liger's chunked losses do). The backward
then only scales the stored gradients: one logits GEMM and two gradient GEMMs in all, the
same count as the naive path, with ``[chunk, V]`` tiles instead of ``[N*T, V]`` logits.

The per-token terms are the rl-losses functions themselves, called on each chunk with the
aggregation weights passed as ``is_weights``; no loss math is re-implemented here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from rl_losses import (
    Aggregation,
    KLKind,
    aggregate,
    get_policy_loss,
    kl_estimate,
    rollout_weights,
)
from torch.autograd.function import once_differentiable

from rl_kernels._checks import (
    as_mask,
    check_finite_rows,
    check_projection,
    check_targets,
    check_vocab_chunk,
    shape_str,
)
from rl_kernels._core import HeadGemms, chunk_ops, compute_dtype, half_gemms_default
from rl_kernels._policy_checks import (
    FUSED_OBJECTIVES,
    _check_log_probs,
    _check_options,
    _check_tokens,
)
from rl_kernels._vocab_tiles import tiled_grads, tiled_stats
from rl_kernels.chunking import DEFAULT_MEMORY_BUDGET, auto_chunk_rows

__all__ = ["FUSED_OBJECTIVES", "FusedPolicyLossOutput", "fused_policy_loss"]


@dataclass(frozen=True)
class FusedPolicyLossOutput:
    """The fused loss and its diagnostics (all detached except ``loss``)."""

    loss: torch.Tensor
    """Policy + KL + entropy terms (differentiable w.r.t. hidden, weight, bias)."""
    policy_loss: torch.Tensor
    """The policy term."""
    kl_loss: torch.Tensor
    """The KL term (0 without ``ref_logprobs``, which ``kl_coef > 0`` requires)."""
    entropy_loss: torch.Tensor
    """The entropy-bonus term (0 with ``entropy_coef = 0``)."""
    clip_frac_low: torch.Tensor
    """As in rl-losses' ``PolicyLossOutput``, over the valid tokens."""
    clip_frac_high: torch.Tensor
    """As in rl-losses' ``PolicyLossOutput``."""
    approx_kl: torch.Tensor
    """As in rl-losses' ``PolicyLossOutput``."""
    ratio_mean: torch.Tensor
    """As in rl-losses' ``PolicyLossOutput``."""
    ratio_max: torch.Tensor
    """As in rl-losses' ``PolicyLossOutput``."""
    kl_mean: torch.Tensor
    """Mean KL estimate over valid tokens (0 without ``ref_logprobs``)."""
    entropy_mean: torch.Tensor
    """Mean entropy over valid tokens (0 when entropies are not computed)."""
    logprobs: torch.Tensor
    """[N, T] fp32 log-probs of the targets, 0 at masked positions."""
    entropies: torch.Tensor | None
    """[N, T] entropies (0 at masked positions), when computed."""

    def metrics(self) -> dict[str, float]:
        """Scalar fields as Python floats."""
        return {
            f.name: float(getattr(self, f.name).detach())
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor) and getattr(self, f.name).ndim == 0
        }


def aggregation_weights(
    mask: torch.Tensor,
    mode: Aggregation,
    normalizer: float | torch.Tensor | None,
    max_length: int | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """[N, T] weight of each token in ``rl_losses.aggregate`` (it is linear in the loss)."""
    with torch.enable_grad():
        ones = torch.ones(mask.shape, dtype=dtype, device=mask.device, requires_grad=True)
        (weights,) = torch.autograd.grad(aggregate(ones, mask, mode, normalizer, max_length), ones)
    return weights


@dataclass
class _Plan:
    """Everything the chunk loop needs, flattened to the valid tokens."""

    index: torch.Tensor  # [Mv] flat positions of valid tokens
    targets: torch.Tensor  # [Mv]
    advantages: torch.Tensor  # [Mv]
    old: torch.Tensor | None  # [Mv]
    ref: torch.Tensor | None  # [Mv]
    policy_mask: torch.Tensor  # [Mv] bool (narrowed by mode="mask" correction)
    policy_weight: torch.Tensor  # [Mv] aggregation weight x IS weight
    other_weight: torch.Tensor  # [Mv] aggregation weight for the KL and entropy terms
    objective: Callable[..., Any]
    objective_kwargs: dict[str, Any]
    level_kw: dict[str, Any]  # {"level": "token"} for objectives that take a level
    kl_coef: float
    kl_kind: KLKind
    kl_clamp: float | None
    kl_grad_kind: KLKind | None
    entropy_coef: float
    need_entropy: bool
    temperature: float
    chunk: int
    upcast: bool
    half_gemms: bool
    vt: int
    compile_body: bool
    shape: tuple[int, int]
    results: dict[str, torch.Tensor]


class _FusedPolicyLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        plan: _Plan,
    ) -> torch.Tensor:
        softmax_, logits_grad_ = chunk_ops(plan.compile_body)
        cd = compute_dtype(hidden.dtype, plan.upcast)
        gemms = HeadGemms(weight, bias, cd, plan.half_gemms)
        flat = hidden.reshape(-1, hidden.shape[-1])
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        # in the input dtype: each row is written once, by its chunk, so rounding on the write
        # is the one rounding the fp32 buffer would get at the end (without its [M, H] fp32)
        grad_flat = torch.zeros_like(flat) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=cd) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=cd) if (need_b and bias is not None) else None
        n, t = plan.shape
        logp_out = torch.zeros(n * t, dtype=cd, device=hidden.device)
        ent_out = torch.zeros(n * t, dtype=cd, device=hidden.device) if plan.need_entropy else None
        sums = {k: torch.zeros((), dtype=cd, device=hidden.device) for k in _SUM_KEYS}
        ratio_max = torch.full((), float("-inf"), dtype=cd, device=hidden.device)
        total = plan.index.numel()
        for s in range(0, total, plan.chunk):
            e = min(s + plan.chunk, total)
            rows = plan.index[s:e]
            h = gemms.rows(flat[rows])
            check_finite_rows(h)
            tg = plan.targets[s:e]
            if plan.vt:  # tiles of vt vocabulary columns (rl_kernels._vocab_tiles)
                logp, lse, ent, _ = tiled_stats(
                    h, gemms, tg, plan.temperature, plan.vt, plan.need_entropy, False
                )
            else:
                u = gemms.logits(h, plan.temperature)  # in the tiles' base (rl_kernels._core)
                logp, _lse, ent, p = softmax_(u, tg, plan.need_entropy, True, gemms.base2)
            g_logp, g_ent, part = _chunk_terms(plan, s, e, logp, ent)
            for key, value in part.items():
                if key == "ratio_max":
                    ratio_max = torch.maximum(ratio_max, value)
                else:
                    sums[key] += value
            logp_out[rows] = logp
            if ent_out is not None and ent is not None:
                ent_out[rows] = ent
            if plan.vt:
                gh = torch.zeros_like(h, dtype=cd) if grad_flat is not None else None
                tiled_grads(
                    h, gemms, tg, lse, g_logp, ent, g_ent, plan.temperature, plan.vt,
                    gh, grad_w, grad_b,
                )  # fmt: skip
                if grad_flat is not None and gh is not None:
                    grad_flat[rows] = gh.to(grad_flat.dtype)
                continue
            grad_z = logits_grad_(
                p,
                u if ent is not None else None,
                tg,
                g_logp,
                ent,
                g_ent,
                plan.temperature,
                gemms.base2,
            )
            if grad_flat is not None:
                grad_flat[rows] = gemms.input_grad(grad_z).to(grad_flat.dtype)
            if grad_w is not None:
                gemms.add_weight_grad(grad_w, grad_z, h)
            if grad_b is not None:
                grad_b.add_(grad_z.sum(dim=0))
            del u, p, grad_z  # free this tile before the next chunk allocates its own
        _publish(plan, sums, ratio_max, logp_out, ent_out)
        ctx.save_for_backward(
            grad_flat.view_as(hidden) if grad_flat is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if (grad_b is not None and bias is not None) else None,
        )
        return sums["loss"].detach().clone()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        g_h, g_w, g_b = ctx.saved_tensors
        return (
            g_h * grad_out.to(g_h.dtype) if g_h is not None else None,
            g_w * grad_out.to(g_w.dtype) if g_w is not None else None,
            g_b * grad_out.to(g_b.dtype) if g_b is not None else None,
            None,
        )


_SUM_KEYS = (
    "loss", "policy", "kl", "entropy", "clip_low", "clip_high", "approx_kl", "ratio",
    "kl_value", "entropy_value", "policy_count",
)  # fmt: skip


def _chunk_terms(
    plan: _Plan, s: int, e: int, logp: torch.Tensor, ent: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """Loss terms of one chunk and their derivatives w.r.t. its log-probs and entropies."""
    with torch.enable_grad():
        lp = logp.detach().requires_grad_()
        col = lp[:, None]
        old = plan.old[s:e][:, None] if plan.old is not None else col.detach()
        pmask = plan.policy_mask[s:e][:, None]
        out = plan.objective(
            col,
            old,
            plan.advantages[s:e][:, None],
            pmask,
            **plan.level_kw,
            aggregation="token_mean",
            normalizer=1.0,
            is_weights=plan.policy_weight[s:e][:, None],
            **plan.objective_kwargs,
        )
        policy = out.loss
        kl = lp.new_zeros(())
        kl_values = lp.new_zeros(())
        if plan.ref is not None:
            est = kl_estimate(
                col,
                plan.ref[s:e][:, None],
                plan.kl_kind,
                clamp=plan.kl_clamp,
                grad_kind=plan.kl_grad_kind,
            ).squeeze(1)
            kl = plan.kl_coef * (plan.other_weight[s:e] * est).sum()
            kl_values = est.detach().sum()
        entropy = lp.new_zeros(())
        ent_var = None
        if ent is not None:
            ent_var = ent.detach().requires_grad_()
            entropy = -plan.entropy_coef * (plan.other_weight[s:e] * ent_var).sum()
        total = policy + kl + entropy
        inputs = [lp] if ent_var is None else [lp, ent_var]
        grads = torch.autograd.grad(total, inputs, allow_unused=True)
    g_logp = grads[0] if grads[0] is not None else torch.zeros_like(lp)
    g_ent = None
    if ent_var is not None:
        g_ent = grads[1] if grads[1] is not None else torch.zeros_like(ent_var)
    count = pmask.sum().to(lp.dtype)
    part = {
        "loss": total.detach(),
        "policy": policy.detach(),
        "kl": kl.detach(),
        "entropy": entropy.detach(),
        "clip_low": out.clip_frac_low * count,
        "clip_high": out.clip_frac_high * count,
        "approx_kl": out.approx_kl * count,
        "ratio": out.ratio_mean * count,
        "kl_value": kl_values,
        "entropy_value": ent.detach().sum() if ent is not None else lp.new_zeros(()),
        "policy_count": count,
    }
    # the objective's ratio_max is 0 where the chunk has no policy token; ratios are positive,
    # so taking it always leaves the batch maximum as it is (and needs no host sync)
    part["ratio_max"] = out.ratio_max
    return g_logp.detach(), g_ent, part


def _publish(
    plan: _Plan,
    sums: dict[str, torch.Tensor],
    ratio_max: torch.Tensor,
    logp: torch.Tensor,
    ent: torch.Tensor | None,
) -> None:
    n, t = plan.shape
    count = sums["policy_count"].clamp(min=1)
    valid = max(plan.index.numel(), 1)
    r = plan.results
    r["policy_loss"], r["kl_loss"], r["entropy_loss"] = sums["policy"], sums["kl"], sums["entropy"]
    r["clip_frac_low"] = sums["clip_low"] / count
    r["clip_frac_high"] = sums["clip_high"] / count
    r["approx_kl"] = sums["approx_kl"] / count
    r["ratio_mean"] = sums["ratio"] / count
    r["ratio_max"] = torch.where(torch.isfinite(ratio_max), ratio_max, 0.0)  # no host sync
    r["kl_mean"] = sums["kl_value"] / valid
    r["entropy_mean"] = sums["entropy_value"] / valid
    r["logprobs"] = logp.view(n, t)
    if ent is not None:
        r["entropies"] = ent.view(n, t)


def fused_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    objective: str = "ppo",
    aggregation: Aggregation = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
    kl_clamp: float | None = None,
    kl_grad_kind: KLKind | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
    correction_level: str = "token",
    correction_mode: str = "truncate",
    correction_cap: float = 2.0,
    correction_lower: float | None = None,
    chunk_rows: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    return_entropy: bool = False,
    upcast: bool = True,
    compile: bool = False,
    half_gemms: bool | None = None,
    vocab_chunk: int | None = None,
    **objective_kwargs: Any,
) -> FusedPolicyLossOutput:
    r"""The whole token-level policy loss from hidden states, without materialising logits.

    Equals, value and gradient (to fp32 rounding), the naive composition

    .. code-block:: python

        logp, ent = log_softmax((hidden @ weight.T + bias) / temperature).gather(targets), H
        policy = rl_losses.get_policy_loss(objective)(logp, old_logprobs or logp.detach(),
                     advantages, mask, aggregation=..., is_weights=w, **objective_kwargs)
        kl = rl_losses.kl_penalty(logp, ref_logprobs, mask, kind=kl_kind, coef=kl_coef, ...)
        ent_bonus = rl_losses.entropy_bonus(ent, mask, coef=entropy_coef, ...)
        loss = policy.loss + kl.loss + ent_bonus.loss

    where ``w`` is ``is_weights``, or the weights of ``rl_losses.rollout_correction(old_logprobs,
    sampling_logprobs, mask, ...)`` when ``sampling_logprobs`` is given (whose narrowed mask
    then applies to the policy term). Only valid tokens are projected: padding costs nothing.

    Objectives are the token-level ones (``FUSED_OBJECTIVES``: ``ppo`` with every clip
    variant, ``cispo``, ``reinforce``, ``sapo``, ``dppo_tv``, ``dppo_kl``, ``dro``,
    ``importance_sampling``, ``cross_entropy``). Turn- and trajectory-level importance sampling
    (GSPO, turn-level PPO) couple the tokens of a unit: for those, compute
    ``rl_kernels.fused_logprobs`` (still memory-bounded) and pass the log-probs to the rl-losses
    objective. Values for a critic come from a value head on the same hidden states
    and need no kernel (rl-algos adds ``rl_losses.value_loss`` to this loss).

    For gradient accumulation, pass the global ``normalizer`` (see ``rl_losses.aggregate``);
    the micro-batch losses then sum to the full-batch loss.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * Liger 0.8.5: equal with as ``clipped_surrogate`` / ``cispo_loss`` with Liger's ``loss_type``
      mapping.
    * No counterpart: verl, OpenRLHF, TRL, AgileRL (AgileRL's fused path is Liger's kernel).

    Args:
        hidden: [N, T, H] last hidden states (before the lm_head).
        weight: [V, H] lm_head weight.
        targets: [N, T] token ids (the completion tokens); any value at masked positions.
        mask: [N, T] bool, True at tokens that count (or 0/1; weights go in ``is_weights``).
        advantages: [N] or [N, T].
        old_logprobs: [N, T] behaviour log-probs, or None (on-policy: ratio 1).
        ref_logprobs: [N, T] reference log-probs for the KL term (finite at valid tokens);
            required when ``kl_coef > 0``, else None.
        sampling_logprobs: [N, T] the sampler's log-probs for the mismatch correction, or None.
        bias: [V] lm_head bias, or None.
        temperature: Sampling temperature (> 0).
        objective: One of ``FUSED_OBJECTIVES``.
        aggregation: See ``rl_losses.aggregate``.
        normalizer: Global denominator for gradient accumulation.
        max_length: For ``seq_mean_token_sum_norm``.
        kl_coef: KL coefficient (>= 0).
        kl_kind: KL estimator, see ``rl_losses.kl_estimate``.
        kl_clamp: KL value clamp.
        kl_grad_kind: Straight-through gradient estimator.
        entropy_coef: Entropy bonus coefficient (>= 0).
        is_weights: [N, T] precomputed importance weights (overrides the correction).
        correction_level: ``rollout_correction`` level (``"token"``/``"sequence"``).
        correction_mode: ``rollout_correction`` mode (``"truncate"``/``"mask"``).
        correction_cap: ``rollout_correction`` cap (> 0).
        correction_lower: ``rollout_correction`` lower bound (< ``correction_cap``), or None.
            The four are checked even without ``sampling_logprobs``.
        chunk_rows: Tokens per chunk (a positive int); None sizes it with ``auto_chunk_rows``.
        memory_budget: Bytes for one fp32 logits tile when ``chunk_rows`` is None.
        return_entropy: Compute and return per-token entropies even without a bonus.
        upcast: Compute logits and reductions in fp32 for half-precision inputs.
        compile: ``torch.compile`` the per-chunk softmax and gradient (opt-in, meant for
            CUDA; see ``fused_logprobs``).
        half_gemms: For fp16/bf16 inputs with ``upcast``: GEMMs on the half-precision operands
            with fp32 results (True), or on fp32 copies (False); see ``fused_logprobs``.
            None: True on CUDA.
        vocab_chunk: Also split each chunk's logits over the vocabulary, in tiles of this many
            columns (see ``fused_logprobs``). None: whole rows of the vocabulary.
        **objective_kwargs: Passed to the objective (``clip_low``, ``clip_high``,
            ``dual_clip``, ``delta``, ``ratio_bounds``, ``clamp``, ``eps_low``, ``eps_high``,
            ``form``, ``tau_pos``, ``tau_neg``). ``level`` may only be ``"token"``.

    Returns:
        :class:`FusedPolicyLossOutput`.
    """
    check_projection(hidden, weight, bias, temperature)
    if hidden.ndim != 3:
        raise ValueError(f"`hidden` must have shape [N, T, H], got {shape_str(hidden)}")
    if targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"`targets` has shape {shape_str(targets)} but `hidden` has shape "
            f"{shape_str(hidden)}; targets must be [N, T]"
        )
    _check_tokens("mask", mask, targets)
    for name, x in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        _check_tokens(name, x, targets)
    _check_tokens("sampling_logprobs", sampling_logprobs, targets)
    _check_tokens("is_weights", is_weights, targets)
    _check_options(
        objective, objective_kwargs, kl_coef, entropy_coef, ref_logprobs, chunk_rows,
        (correction_level, correction_mode, correction_cap, correction_lower),
    )  # fmt: skip
    m = as_mask(mask, "targets", targets, "is_weights")
    targets = check_targets(targets, weight.shape[0], m)
    n, t = targets.shape
    if advantages.shape == (n,):
        adv = advantages[:, None].expand(n, t)
    elif advantages.shape == (n, t):
        adv = advantages
    else:
        raise ValueError(
            f"`advantages` has shape {shape_str(advantages)} but `targets` has shape "
            f"{shape_str(targets)}; pass [N] or [N, T]"
        )
    _check_log_probs(adv, old_logprobs, ref_logprobs, sampling_logprobs, m)
    cd = compute_dtype(hidden.dtype, upcast)
    policy_mask, w = m, is_weights
    if is_weights is None and sampling_logprobs is not None:
        if old_logprobs is None:
            raise ValueError(
                "`old_logprobs` is required with `sampling_logprobs`: the correction compares "
                "the trainer's log-probs with the sampler's"
            )
        w, policy_mask = rollout_weights(
            old_logprobs, sampling_logprobs, m, level=correction_level,  # type: ignore[arg-type]
            mode=correction_mode, cap=correction_cap, lower=correction_lower,  # type: ignore[arg-type]
        )  # fmt: skip
    policy_agg = aggregation_weights(policy_mask, aggregation, normalizer, max_length, cd)
    other_agg = aggregation_weights(m, aggregation, normalizer, max_length, cd)
    if w is not None:
        policy_agg = policy_agg * torch.where(policy_mask, w.detach().to(cd), 0.0)
    index = m.reshape(-1).nonzero().squeeze(1)
    vt = check_vocab_chunk(vocab_chunk, weight.shape[0])
    chunk = (
        auto_chunk_rows(
            vt or weight.shape[0], memory_budget, total_rows=int(index.numel()), cpu=hidden.is_cpu
        )
        if chunk_rows is None
        else chunk_rows
    )

    def pick(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.reshape(-1)[index].detach().to(cd)

    fn = get_policy_loss(objective)
    plan = _Plan(
        index=index,
        targets=targets.reshape(-1)[index],
        advantages=adv.reshape(-1)[index].detach().to(cd),
        old=pick(old_logprobs),
        ref=pick(ref_logprobs),
        policy_mask=policy_mask.reshape(-1)[index],
        policy_weight=policy_agg.reshape(-1)[index],
        other_weight=other_agg.reshape(-1)[index],
        objective=fn,
        objective_kwargs=dict(objective_kwargs),
        # DPPO and DRO are token level by definition and take no `level`
        level_kw={"level": "token"} if "level" in inspect.signature(fn).parameters else {},
        kl_coef=float(kl_coef),
        kl_kind=kl_kind,
        kl_clamp=kl_clamp,
        kl_grad_kind=kl_grad_kind,
        entropy_coef=float(entropy_coef),
        need_entropy=entropy_coef > 0 or return_entropy,
        temperature=float(temperature),
        chunk=int(chunk),
        upcast=upcast,
        half_gemms=bool(
            half_gemms_default(hidden, weight, upcast) if half_gemms is None else half_gemms
        ),
        vt=vt,
        compile_body=compile,
        shape=(n, t),
        results={},
    )
    loss = _FusedPolicyLoss.apply(hidden, weight, bias, plan)
    r = plan.results
    return FusedPolicyLossOutput(
        loss=loss,
        policy_loss=r["policy_loss"],
        kl_loss=r["kl_loss"],
        entropy_loss=r["entropy_loss"],
        clip_frac_low=r["clip_frac_low"],
        clip_frac_high=r["clip_frac_high"],
        approx_kl=r["approx_kl"],
        ratio_mean=r["ratio_mean"],
        ratio_max=r["ratio_max"],
        kl_mean=r["kl_mean"] if ref_logprobs is not None else torch.zeros((), dtype=cd),
        entropy_mean=r["entropy_mean"] if plan.need_entropy else torch.zeros((), dtype=cd),
        logprobs=r["logprobs"],
        entropies=r.get("entropies"),
    )
