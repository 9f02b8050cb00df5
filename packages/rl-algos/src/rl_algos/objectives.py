"""The policy objective of an agent, resolved by name through :func:`rl_losses.get_policy_loss`.

An agent describes its loss as data, a :class:`PolicyObjective` (the registered loss name, its
options, the aggregation and the KL term), and :func:`policy_loss` /
:func:`fused_objective_loss` compute it for one micro-batch. No loss math lives here: the
policy term is the registered rl-losses function (or, fused, the same function called chunk by
chunk inside :func:`rl_kernels.fused_policy_loss`), the KL term :func:`rl_losses.kl_penalty`.

A user objective is one function registered with ``@rl_losses.register_policy_loss("name")``
taking ``(logprobs, old_logprobs, advantages, mask, *, aggregation, normalizer, max_length,
is_weights, **loss_kwargs)`` (plus ``level``, ``pooling``, ``turn_ids`` when the agent's
importance-sampling level is not ``"token"``, and ``unit_weight="tokens"`` there with
``aggregation="token_mean"``, see :func:`token_weighted_options`) and returning a
:class:`rl_losses.PolicyLossOutput` (or a scalar tensor); ``GRPO(loss_type="name",
loss_kwargs={...})`` then trains with it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from rl_kernels import FUSED_OBJECTIVES, fused_policy_loss
from rl_losses import Aggregation, KLKind, get_policy_loss, kl_penalty

from rl_algos.batch import MicroBatch, Normalizers
from rl_algos.scoring import Scorer

__all__ = [
    "LOSS_ALIASES",
    "UNCLIPPED_OBJECTIVES",
    "LossTerms",
    "PolicyObjective",
    "clip_options",
    "fused_objective_loss",
    "policy_loss",
    "resolve_loss_name",
    "token_weighted_options",
]

#: Agent-facing names of registered rl-losses objectives (GRPO's ``loss_type="grpo"`` is PPO's
#: clipped surrogate, ``rl_losses.get_policy_loss("ppo")``).
LOSS_ALIASES: Mapping[str, str] = {"grpo": "ppo"}
#: Registered objectives that never clip: their clip fractions are 0 by construction, so the
#: agents report no ``clip_fraction`` for them.
UNCLIPPED_OBJECTIVES: frozenset[str] = frozenset(
    {"reinforce", "cross_entropy", "importance_sampling", "sapo", "vespo", "dro", "kl_cov"}
)


def resolve_loss_name(loss_type: str) -> str:
    """The registry name of ``loss_type`` (an alias or a registered name), checked.

    Raises:
        ValueError: Not registered; the message lists the registered objectives.
    """
    name = LOSS_ALIASES.get(loss_type, loss_type)
    try:
        get_policy_loss(name)
    except KeyError as exc:
        raise ValueError(
            f"`loss_type` {loss_type!r} is not a registered policy loss ({exc.args[0]}); "
            "register yours with @rl_losses.register_policy_loss"
        ) from None
    return name


def clip_options(
    clip_coef: float | tuple[float, float] | None,
    clip_coef_high: float | None = None,
    default: float = 0.2,
) -> dict[str, Any]:
    """Clipped-surrogate options from AgileRL's ``clip_coef``.

    A tuple is absolute ratio bounds (``ratio_bounds``); a scalar ``c`` gives
    ``clip_low = c`` and ``clip_high = clip_coef_high`` (default ``c``); None uses ``default``.
    """
    if isinstance(clip_coef, tuple):
        return {"ratio_bounds": (float(clip_coef[0]), float(clip_coef[1]))}
    c = default if clip_coef is None else float(clip_coef)
    return {"clip_low": c, "clip_high": c if clip_coef_high is None else float(clip_coef_high)}


def token_weighted_options(
    loss: str, level: str | None, aggregation: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    """``options`` of ``loss`` with ``token_mean`` weighing every token of a turn or sequence.

    At ``level="turn"`` or ``"trajectory"`` a loss aggregates one loss per unit; with
    ``aggregation="token_mean"`` it gets ``unit_weight="tokens"`` (each unit's loss counted
    once per valid token, AgileRL's turn and trajectory levels, TRL's ``dapo`` with sequence
    ratios), so that the agent's token-count normaliser gives the whole-batch value under any
    micro-batching. ``gspo`` (``level`` None) gets ``gradient="token"`` (GSPO-token: the same
    sequence ratio, each sequence weighing by its length). An option already in ``options`` is
    kept; :meth:`PolicyObjective.policy_normalizer` divides accordingly.

    Args:
        loss: Registry name (:func:`rl_losses.get_policy_loss`).
        level: Importance-sampling unit (``"token"``, ``"turn"``, ``"trajectory"``), or None
            when the loss fixes its own (``gspo``).
        aggregation: The agent's aggregation.
        options: The loss's keyword arguments so far.

    Returns:
        A new dict of keyword arguments.

    Raises:
        ValueError: ``token_mean`` at a turn or trajectory level with a loss that takes no
            ``unit_weight``, or with ``unit_weight="unit"`` at the turn level (its unit count
            is not one of the agent's normalisers).
    """
    out = dict(options)
    if aggregation != "token_mean" or level == "token":
        return out
    if level is None:
        if loss == "gspo":
            out.setdefault("gradient", "token")
        return out
    params = inspect.signature(get_policy_loss(loss)).parameters.values()
    takes = any(p.name == "unit_weight" or p.kind is p.VAR_KEYWORD for p in params)
    if not takes:
        raise ValueError(
            f"loss_aggregation='token_mean' with importance_sampling_level={level!r} counts "
            f"each {level}'s loss once per valid token, but the policy loss {loss!r} takes no "
            "`unit_weight`: add a `unit_weight` parameter to it (see "
            "rl_losses.clipped_surrogate), or pass loss_aggregation='seq_mean_token_mean' or "
            "importance_sampling_level='token'"
        )
    out.setdefault("unit_weight", "tokens")
    if level == "turn" and out["unit_weight"] == "unit":
        raise ValueError(
            "loss_kwargs unit_weight='unit' with loss_aggregation='token_mean' and "
            "importance_sampling_level='turn' averages over turns, which no normaliser of the "
            "agent counts: pass unit_weight='tokens' (every token weighs the same) or "
            "loss_aggregation='seq_mean_token_mean'"
        )
    return out


@dataclass(frozen=True)
class LossTerms:
    """One micro-batch's loss and its detached diagnostics."""

    loss: torch.Tensor
    """Scalar, with gradient; already divided by the minibatch's global normaliser."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Diagnostics (``pg_loss``, ``clip_fraction``, ``approx_kl``, ``kl``, ...): only those
    computed for this loss (no ``kl`` without a KL term, no ``clip_fraction`` for an objective
    that never clips)."""


@dataclass(frozen=True)
class PolicyObjective:
    """A policy loss as data: which registered function, with which arguments."""

    loss: str
    """Registry name (:func:`rl_losses.get_policy_loss`), e.g. ``"ppo"``, ``"cispo"``."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of that function (clip bounds, clamps, user ``loss_kwargs``)."""
    aggregation: Aggregation = "token_mean"
    """How unit losses reduce (:func:`rl_losses.aggregate`)."""
    max_length: int | None = None
    """``L`` of ``seq_mean_token_sum_norm`` (Dr. GRPO)."""
    level: str | None = "token"
    """Importance-sampling unit (token / turn / trajectory); None: the loss fixes its own (GSPO)."""
    pooling: str = "sum"
    """Log-ratio pooling within a turn or trajectory (``"sum"`` or ``"mean"``)."""
    beta: float = 0.0
    """KL coefficient."""
    kl_kind: KLKind = "k3"
    """KL estimator (:func:`rl_losses.kl_estimate`)."""
    kl_in_loss: bool = True
    """Add ``beta`` x KL(pi || ref) to the loss (False when the KL is in the reward)."""
    ratio_metric: bool = False
    """Report ``ratio_mean`` (the GRPO family does)."""
    turns: int | None = None
    """With ``level="turn"``: the minibatch's turn count K, the width of the turn-level loss
    that ``seq_mean_token_sum_norm`` divides by when ``max_length`` is None (set per minibatch
    by :meth:`for_minibatch`, so that each micro-batch divides by it and not by its own)."""

    def for_minibatch(self, turn_ids: torch.Tensor | None) -> PolicyObjective:
        """This objective with :attr:`turns` read from ``turn_ids`` [M, T] of a minibatch's rows.

        Only where the loss's value depends on it (a turn-level ratio, ``max_length`` None,
        ``seq_mean_token_sum_norm``); K is the largest over processes, as on one process.
        """
        needed = self.level == "turn" and self.max_length is None
        if not needed or self.aggregation != "seq_mean_token_sum_norm" or turn_ids is None:
            return self
        k = turn_ids.max().reshape(1) + 1 if turn_ids.numel() else turn_ids.new_ones(1)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(k, op=torch.distributed.ReduceOp.MAX)
        return dataclasses.replace(self, turns=max(1, int(k.item())))

    @property
    def policy_max_length(self) -> int | None:
        """``max_length`` of the policy term: :attr:`turns` for a turn-level ratio without one."""
        if self.max_length is None and self.level == "turn":
            return self.turns
        return self.max_length

    def normalizer(self, norm: Normalizers) -> float:
        """The global denominator this aggregation divides a per-token term by (the KL)."""
        return norm.tokens if self.aggregation == "token_mean" else norm.sequences

    def policy_normalizer(self, norm: Normalizers) -> float:
        """The global denominator of the policy term.

        :meth:`normalizer`, except that ``token_mean`` over one loss per sequence (``gspo`` with
        ``gradient="sequence"``, a trajectory level with ``unit_weight="unit"``) divides by the
        sequence count, as the loss does on the whole batch (see
        :func:`token_weighted_options`).
        """
        if self.aggregation != "token_mean":
            return self.normalizer(norm)
        if self.level is None and self.loss == "gspo":
            per_sequence = self.options.get("gradient", "sequence") == "sequence"
        else:
            per_sequence = self.level == "trajectory" and self.options.get("unit_weight") in (
                None,
                "unit",
            )
        return norm.sequences if per_sequence else norm.tokens

    @property
    def clips(self) -> bool:
        """Whether it clips (reports a ``clip_fraction``): not in :data:`UNCLIPPED_OBJECTIVES`."""
        return self.loss not in UNCLIPPED_OBJECTIVES

    @property
    def fusable(self) -> bool:
        """Whether :func:`rl_kernels.fused_policy_loss` computes it (token-level objectives)."""
        return self.level == "token" and self.loss in FUSED_OBJECTIVES


def policy_loss(
    objective: PolicyObjective, mb: MicroBatch, logprobs: torch.Tensor, norm: Normalizers
) -> LossTerms:
    """The objective on ``mb`` with the current ``logprobs`` [M, T] (plain path).

    Without ``mb.old_logprobs`` (an on-policy update) the old log-probs are ``logprobs``
    detached: the ratio is 1 and its gradient that of the log-probs. The metrics hold what the
    loss computed: ``clip_fraction``, ``approx_kl`` and ``ratio_mean`` only where its output
    has them (a loss returning a bare tensor reports none) and ``clip_fraction`` only for an
    objective that clips.
    """
    if mb.advantages is None:
        raise ValueError("a policy objective needs advantages")
    old = logprobs.detach() if mb.old_logprobs is None else mb.old_logprobs
    normalizer = objective.normalizer(norm)
    kwargs: dict[str, Any] = {
        "aggregation": objective.aggregation,
        "normalizer": objective.policy_normalizer(norm),
        "max_length": objective.policy_max_length,
        "is_weights": mb.is_weights,
        **objective.options,
    }
    if objective.level not in (None, "token"):
        kwargs.update(level=objective.level, pooling=objective.pooling, turn_ids=mb.turn_ids)
    out = get_policy_loss(objective.loss)(logprobs, old, mb.advantages, mb.mask, **kwargs)
    loss: torch.Tensor = out.loss if hasattr(out, "loss") else out
    m = out.metrics() if hasattr(out, "metrics") else {}
    mask = mb.mask
    metrics: dict[str, float] = {"pg_loss": float(loss.detach())}
    clipped = [m[k] for k in ("clip_frac_low", "clip_frac_high") if k in m]
    if objective.clips and clipped:
        metrics["clip_fraction"] = sum(clipped)
    if "approx_kl" in m:
        metrics["approx_kl"] = m["approx_kl"]
    metrics["entropy"] = float(-(logprobs.detach() * mask).sum() / mask.sum().clamp(min=1))
    if objective.kl_in_loss and mb.ref_logprobs is not None and objective.beta > 0:
        kl = kl_penalty(
            logprobs,
            mb.ref_logprobs,
            mask,
            kind=objective.kl_kind,
            coef=objective.beta,
            aggregation=objective.aggregation,
            normalizer=normalizer,
            max_length=objective.max_length,
        )
        loss = loss + kl.loss
        metrics["kl"] = kl.metrics()["kl_mean"]
    if objective.ratio_metric and "ratio_mean" in m:
        metrics["ratio_mean"] = m["ratio_mean"]
    return LossTerms(loss, metrics)


def fused_objective_loss(
    objective: PolicyObjective, scorer: Scorer, mb: MicroBatch, norm: Normalizers
) -> LossTerms:
    """The objective by :func:`rl_kernels.fused_policy_loss` (``use_liger_loss=True``).

    The chunked kernel projects only the valid tokens and computes the gradient in its forward,
    so the ``[M, T, V]`` logits never exist; it equals :func:`policy_loss` (value and gradient)
    to float32 rounding. ``mb.old_logprobs`` None: on-policy (the kernel's ratio is 1).
    """
    if mb.advantages is None:
        raise ValueError("a policy objective needs advantages")
    hidden = scorer.hidden_states(mb.input_ids, mb.attention_mask, scored=mb.mask)
    use_ref = objective.kl_in_loss and mb.ref_logprobs is not None and objective.beta > 0
    weight, bias = scorer.head()
    out = fused_policy_loss(
        hidden,
        weight,
        mb.targets,
        mb.mask,
        mb.advantages,
        old_logprobs=mb.old_logprobs,
        ref_logprobs=mb.ref_logprobs if use_ref else None,
        bias=bias,
        temperature=scorer.temperature,
        kl_coef=objective.beta if use_ref else 0.0,
        kl_kind=objective.kl_kind,
        is_weights=mb.is_weights,
        chunk_rows=scorer.chunk_rows,
        objective=objective.loss,
        aggregation=objective.aggregation,
        normalizer=objective.normalizer(norm),
        max_length=objective.max_length,
        **objective.options,
    )
    metrics = {"pg_loss": float(out.policy_loss.detach())}
    if objective.clips:
        metrics["clip_fraction"] = float(out.clip_frac_low + out.clip_frac_high)
    metrics["approx_kl"] = float(out.approx_kl)
    if use_ref:
        metrics["kl"] = float(out.kl_loss.detach()) / objective.beta
    return LossTerms(out.loss, metrics)
