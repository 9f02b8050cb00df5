r"""ILQL: offline, value-guided RL for causal LMs (Snell et al., arXiv 2206.11871).

The agent learns from a fixed set of ``(sequence, reward)`` pairs with no generation: Q, target
Q and V heads (:class:`rl_adapters.ILQLHeads`) on the policy's hidden states are fitted with
:func:`rl_losses.ilql_loss` (TD, expectile, CQL and AWAC terms; the LM itself is the
behaviour model :math:`\pi_\beta`, trained by the AWAC term), and decoding perturbs the LM with
the learned advantage, :math:`\log\pi_\beta + \beta (Q - V)`
(:func:`rl_rollout.value_guided_decoding`). It reuses :class:`~rl_algos.LLMAlgorithm`'s
policy (LoRA or full fine-tuning), engine, optimizer step (micro-batching with global
normalisers, gradient clipping, the non-finite guard), checkpoints and clones.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from rl_adapters import ILQLHeads
from rl_losses import ilql_loss
from rl_rollout import value_guided_decoding

from rl_algos.base import LLMAlgorithm
from rl_algos.batch import (
    ActionResult,
    Batch,
    Estimates,
    MicroBatch,
    Normalizers,
    attention_from_mask,
    stack_rows,
    unpack_experiences,
)
from rl_algos.config import AgentConfig
from rl_algos.distributed import deepspeed_plugin
from rl_algos.generation import generate_actions, prompt_ids
from rl_algos.learner import broadcast_module, summarize
from rl_algos.microbatch import RowSplit
from rl_algos.objectives import LossTerms
from rl_algos.scoring import Scorer

__all__ = ["ILQL", "ILQLConfig", "pack_actions", "shape_rewards"]

HEADS_NAME = "ilql_heads"


def pack_actions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices that pack each row's action positions to the left.

    Args:
        mask: [N, T] bool, True at action positions.

    Returns:
        ``(index [N, A], packed_mask [N, A])`` with ``A`` the most actions in a row:
        ``x.gather(1, index)`` lists row n's action positions in order, then padding
        (``packed_mask`` False). Only the actions' states need Q-values over the vocabulary, so
        the ``[N, A, V]`` tensor is as small as the data allows.
    """
    counts = mask.sum(dim=1)
    A = int(counts.max()) if mask.numel() else 0
    positions = torch.arange(mask.shape[1], device=mask.device)
    key = torch.where(mask, positions, positions + mask.shape[1])
    order = key.argsort(dim=1, stable=True)[:, :A]
    packed = torch.arange(A, device=mask.device)[None] < counts[:, None]
    return order, packed


_EMPTY = (
    "`completion_ids` is empty: the offline dataset has no sequences; pass at least one "
    "(sample, reward) pair"
)


def _unpack(experiences: Any) -> tuple[Any, Any, Any]:
    """``(completion_ids, action_masks, rewards)`` from a tuple or a dict, checked."""
    comp, masks, rewards = unpack_experiences(experiences)
    if rewards is None:
        raise ValueError(
            "`rewards` is None: ILQL learns from (sample, reward) pairs; pass one reward per "
            "sequence [N] or per-token rewards [N, L - 1]"
        )
    if isinstance(comp, list | tuple) and not comp:
        raise ValueError(_EMPTY)
    return comp, masks, rewards


def shape_rewards(rewards: Any, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards [N, T] and per-sequence totals [N] from [N] or [N, T] rewards.

    A reward per sequence goes on its last action token (trlX); per-token rewards must be 0
    off the action tokens. Raises ``ValueError`` naming ``rewards`` for a wrong count or
    shape, rewards off the actions, or NaN / inf.

    Args:
        rewards: [N] per sequence (or [N, 1], or [B, G] with B * G = N), or [N, T] per token.
        mask: [N, T] bool action mask (every row has an action).
    """
    N, T = mask.shape
    r = torch.as_tensor(rewards, dtype=torch.float32).to(mask.device)
    if r.numel() == 0:
        raise ValueError(
            f"`rewards` is empty but there are {N} sequences: pass one reward per sequence"
        )
    if r.dim() == 2 and r.shape != mask.shape and r.numel() == N:
        r = r.reshape(N)  # [N, 1], or [B, G] from a grouped rollout (prompt-major)
    if r.dim() == 1:
        if r.shape[0] != N:
            raise ValueError(
                f"`rewards` has {r.shape[0]} entries for {N} sequences in `completion_ids`: "
                "pass exactly one reward per sequence (or per-token rewards [N, L - 1])"
            )
        last = torch.where(mask, torch.arange(T, device=mask.device), -1).amax(dim=1)
        token_rewards = torch.zeros(mask.shape, device=mask.device)
        token_rewards[torch.arange(N, device=mask.device), last] = r
    elif r.dim() == 2 and r.shape == mask.shape:
        off = (r != 0) & ~mask
        if bool(off.any()):
            first = off.nonzero()[0].tolist()
            raise ValueError(
                f"per-token `rewards` are nonzero at {int(off.sum())} non-action position(s) "
                f"(first at {first}): put each reward on an action token of `action_masks`"
            )
        token_rewards = r
    else:
        raise ValueError(
            f"per-token `rewards` has shape {list(r.shape)} but `action_masks` has shape "
            f"{list(mask.shape)}; they must match (or pass one reward per sequence [N])"
        )
    bad = ~torch.isfinite(token_rewards)
    if bool(bad.any()):
        rows = bad.any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"`rewards` has NaN or inf for sequence(s) {rows[:5]}: fix the reward function or "
            "drop those samples before learning"
        )
    return token_rewards, token_rewards.sum(dim=1)


@dataclass
class ILQLConfig(AgentConfig):
    """:class:`~rl_algos.config.AgentConfig` plus ILQL's settings (trlX's defaults)."""

    temperature: float = 1.0
    """Sampling temperature of value-guided decoding."""
    top_k: int = 20
    """Top-k of value-guided sampling."""
    top_p: float = 1.0
    """Nucleus mass of value-guided sampling."""
    use_separate_reference_adapter: bool = False
    """ILQL has no reference policy."""
    gamma: float = 0.99
    """Discount in [0, 1]."""
    tau: float = 0.7
    """Expectile of the V loss in (0, 1)."""
    cql_scale: float = 0.1
    """Weight of the CQL term."""
    awac_scale: float = 1.0
    """Weight of the AWAC (LM) term."""
    awac_beta: float = 0.0
    """AWAC inverse temperature (0: behaviour cloning)."""
    awac_max_weight: float | None = None
    """Clip of the AWAC weight, or None."""
    two_qs: bool = True
    """Two Q heads (clipped double-Q) instead of one."""
    alpha: float = 0.001
    """Polyak rate of the target heads."""
    steps_for_target_q_sync: int = 5
    """Optimizer steps between target updates."""
    head_mlp: bool = True
    """trlX's two-layer heads (False: linear heads)."""
    heads_lr: float | None = None
    """Learning rate of the heads (default ``lr``)."""
    target_reduction: Literal["min", "mean"] = "min"
    """``"min"`` or ``"mean"`` over the (target) Q heads, in the loss and for decoding."""
    decode_beta: float = 1.0
    """Guidance strength of decoding (>= 0)."""
    decode_q: Literal["target", "online"] = "target"
    """``"target"`` (trlX) or ``"online"`` Q heads for decoding."""

    def __post_init__(self) -> None:
        """Check the values (each error names the argument)."""
        super().__post_init__()
        checks = [
            ("gamma", 0 <= self.gamma <= 1, "in [0, 1]"),
            ("tau", 0 < self.tau < 1, "in (0, 1)"),
            ("cql_scale", self.cql_scale >= 0, ">= 0"),
            ("awac_scale", self.awac_scale >= 0, ">= 0"),
            ("awac_beta", self.awac_beta >= 0, ">= 0"),
            ("decode_beta", self.decode_beta >= 0, ">= 0"),
            ("alpha", 0 <= self.alpha <= 1, "in [0, 1]"),
            ("steps_for_target_q_sync", self.steps_for_target_q_sync >= 1, ">= 1"),
            ("awac_max_weight", self.awac_max_weight is None or self.awac_max_weight > 0,
             "> 0 or None"),
            ("heads_lr", self.heads_lr is None or self.heads_lr >= 0, ">= 0 or None"),
        ]  # fmt: skip
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"`{name}` must be {rule}, got {getattr(self, name)!r}")
        if self.target_reduction not in ("min", "mean"):
            raise ValueError(
                f"`target_reduction` must be 'min' or 'mean', got {self.target_reduction!r}"
            )
        if self.decode_q not in ("target", "online"):
            raise ValueError(f"`decode_q` must be 'target' or 'online', got {self.decode_q!r}")

    def ignored_options(self) -> dict[str, str]:
        """:meth:`AgentConfig.ignored_options` plus the online agents' options ILQL never reads.

        ILQL has no importance ratio (``clip_coef``, the sampler-mismatch correction) and no
        fused policy loss (``use_liger_loss``).
        """
        out = super().ignored_options()
        unread = {
            "clip_coef": (0.2, "ILQL has no importance ratio to clip"),
            "use_liger_loss": (False, "ILQL's loss is not a policy loss (rl_losses.ilql_loss)"),
            "vllm_importance_sampling_correction": (True, "ILQL reads no sampling log-probs"),
            "vllm_importance_sampling_cap": (2.0, "ILQL reads no sampling log-probs"),
            "clip_against_sampler": (False, "ILQL reads no sampling log-probs"),
        }
        for key, (default, why) in unread.items():
            if getattr(self, key) != default:
                out[key] = f"`{key}` has no effect on ILQL ({why}): leave it unset"
        return out


class ILQL(LLMAlgorithm):
    r"""Implicit Language Q-Learning (arXiv 2206.11871; trlX's ``AccelerateILQLTrainer``).

    ``learn((completion_ids, action_masks, rewards))`` takes offline experience: ``[N, L]``
    token ids (right-padded), ``[N, L - 1]`` action masks (True where token t + 1 is an action,
    e.g. the completion) and either one reward per sequence (``[N]``, placed on the sequence's
    last action token, as trlX does) or per-token rewards ``[N, L - 1]`` aligned with the
    masks. Each minibatch step minimises :func:`rl_losses.ilql_loss` over the action tokens
    (heads and trunk together), and every ``steps_for_target_q_sync`` optimizer steps the
    target Q heads move towards the Q heads by Polyak averaging (``alpha``).

    ``get_action`` decodes with :func:`rl_rollout.value_guided_decoding`:
    ``log_softmax(logits) + decode_beta * (Q - V)`` with ``Q`` the ``target_reduction`` of the
    target heads (``decode_q="target"``, trlX) or of the online heads, then ``top_k`` and
    ``temperature`` for sampling (``training=True``) or greedy (``training=False``).

    Defaults are trlX's: ``tau`` 0.7, ``gamma`` 0.99, ``cql_scale`` 0.1, ``awac_scale`` 1,
    ``awac_beta`` 0 (the AWAC term is then the paper's behaviour cloning of
    :math:`\pi_\beta`), ``alpha`` 0.001, ``steps_for_target_q_sync`` 5, ``two_qs`` True, and for
    decoding ``decode_beta`` 1, ``top_k`` 20, ``temperature`` 1. ``beta`` (the KL coefficient of
    the online agents) must stay 0: ILQL has no reference policy.

    Settings: :class:`ILQLConfig` (constructor keywords, AgileRL's shared ones included).
    """

    algo_name: ClassVar[str] = "ilql"
    config_class: ClassVar[type[AgentConfig]] = ILQLConfig
    config: ILQLConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("beta", 0.0):
            raise ValueError(
                f"`beta` (the KL coefficient of the online agents) must be 0 for ILQL, got "
                f"{kwargs['beta']}: ILQL has no reference policy. Use `awac_beta` for the AWAC "
                "weight and `decode_beta` for value-guided decoding"
            )
        if kwargs.get("use_vllm"):
            raise ValueError(
                "ILQL decodes with its Q/V heads inside the generation loop, which vLLM does not "
                "run: use the Hugging Face engine (use_vllm=False)"
            )
        if kwargs.get("vllm_config") is not None:
            raise ValueError(
                "`vllm_config` configures the colocated vLLM engine, and vLLM is not used by "
                "ILQL (it decodes with its Q/V heads on the Hugging Face engine): leave "
                "vllm_config unset"
            )
        if deepspeed_plugin(kwargs.get("accelerator")) is not None:
            raise ValueError(
                "ILQL under DeepSpeed is not supported (its Q/V heads live outside the policy "
                "module DeepSpeed wraps): use DDP or one process"
            )
        kwargs["beta"] = 0.0
        super().__init__(*args, **kwargs)
        cfg = self.config
        heads = ILQLHeads.for_model(
            self.policy.causal_lm,
            seed=cfg.seed + 2,
            two_qs=cfg.two_qs,
            alpha=cfg.alpha,
            sync_every=cfg.steps_for_target_q_sync,
            mlp=cfg.head_mlp,
        ).to(self.device)
        self.extra_modules = {HEADS_NAME: heads}
        broadcast_module(heads)
        self.learner = self.build_learner()

    def _build_routers(self) -> tuple[None, None]:
        """ILQL trains its Q heads and the model by its own loss, with no old log-probs: no
        load-balancing loss, and no routes to replay.

        Raises:
            ValueError: ``router_aux_loss_coef > 0`` or ``router_replay`` set (names it).
        """  # noqa: D205
        coef, mode = self.config.router_aux_loss_coef, self.config.router_replay
        if coef:
            raise ValueError(
                f"ILQL(router_aux_loss_coef={coef}): ILQL's loss has no load-balancing term; "
                "leave router_aux_loss_coef unset"
            )
        if mode is not None:
            raise ValueError(
                f"ILQL(router_replay={mode!r}): ILQL has no forward that scores old log-probs, "
                "whose routes the update would replay; leave router_replay unset"
            )
        return None, None

    @property
    def heads(self) -> ILQLHeads:
        """The Q, target-Q and V heads (:class:`rl_adapters.ILQLHeads`)."""
        heads: ILQLHeads = self.extra_modules[HEADS_NAME]  # type: ignore[assignment]
        return heads

    @property
    def heads_lr(self) -> float:
        """Learning rate of the ILQL heads (defaults to ``lr``)."""
        return self.config.lr if self.config.heads_lr is None else self.config.heads_lr

    def param_groups(self) -> list[dict[str, Any]]:
        """The actor's group (``lr``) and, once built, the heads' (``heads_lr``)."""
        groups = [{"params": self.actor_parameters(), "lr": self.config.lr}]
        if HEADS_NAME in self.extra_modules:
            groups.append({"params": self.heads.trainable_parameters(), "lr": self.heads_lr})
        return groups

    @property
    def scorer(self) -> Scorer:
        """The behaviour LM's log-probs at temperature 1 (the AWAC term's)."""
        cfg = self.config
        split = RowSplit(micro_batch_tokens=cfg.micro_batch_tokens)
        chunk, packing = cfg.fused_logprobs_chunk_rows, cfg.use_sequence_packing
        share = cfg.share_prompt_prefix
        return Scorer(self.policy, 1.0, chunk, 0, packing, split, self.packing_report, share)

    # -- data ------------------------------------------------------------------------------------

    def parse_offline(self, experiences: Any) -> tuple[Batch, torch.Tensor]:
        """``(batch, token_rewards [N, T])`` from offline experience (see :meth:`learn`)."""
        comp, masks, rewards = _unpack(experiences)
        ids = stack_rows("completion_ids", comp, self.pad_token_id, torch.long).to(self.device)
        mask = stack_rows("action_masks", masks, False, torch.bool).to(self.device)
        N, L = ids.shape
        if N == 0:
            raise ValueError(_EMPTY)
        if mask.shape != (N, L - 1):
            raise ValueError(
                f"`action_masks` has shape {list(mask.shape)} but `completion_ids` has shape "
                f"{[N, L]}: it must be [N, L - 1] = {[N, L - 1]} (position t marks token t + 1)"
            )
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"`action_masks` rows {empty[:5]} ({len(empty)} of {N}) have no action token, so "
                "their reward has nowhere to go: drop those samples or mark their completion "
                "tokens"
            )
        token_rewards, seq_rewards = shape_rewards(rewards, mask)
        attention = attention_from_mask(ids, mask, self.pad_token_id)
        return Batch(ids, attention, mask, seq_rewards, None, None), token_rewards

    # -- the loss --------------------------------------------------------------------------------

    def micro_loss(self, mb: MicroBatch, norm: Normalizers) -> LossTerms | None:
        """:func:`rl_losses.ilql_loss` of one micro-batch: one trunk forward feeds LM and heads.

        None when the log-probs are not finite (the learner's guard raises or skips).
        """
        cfg = self.config
        self.policy.eval()
        mask = mb.mask
        hidden = self.scorer.hidden_states(mb.input_ids, mb.attention_mask, scored=mask)
        lp = self.scorer.from_hidden(hidden, mb.input_ids, mask)
        if not bool(torch.isfinite(lp[mask]).all()):
            return None
        index, packed = pack_actions(mask)
        H = hidden.shape[-1]
        h = hidden.gather(1, index[..., None].expand(-1, -1, H))
        out = self.heads(h)
        heads_out = [*out.qs, *out.target_qs, out.values]
        if not all(bool(torch.isfinite(t[packed]).all()) for t in heads_out):
            # non-finite head outputs: a NaN loss with a connected graph, so the learner's
            # guard raises (or skips with skip_nonfinite) and nothing is applied
            zero = sum((t.nan_to_num().sum() * 0.0 for t in heads_out), h.new_zeros(()))
            return LossTerms(zero + math.nan)
        assert mb.token_rewards is not None
        result = ilql_loss(
            lp.gather(1, index),
            list(out.qs),
            list(out.target_qs),
            out.values,
            mb.targets.gather(1, index),
            mb.token_rewards.gather(1, index),
            packed,
            gamma=cfg.gamma,
            tau=cfg.tau,
            cql_scale=cfg.cql_scale,
            awac_scale=cfg.awac_scale,
            awac_beta=cfg.awac_beta,
            awac_max_weight=cfg.awac_max_weight,
            target_reduction=cfg.target_reduction,
            aggregation="token_mean",
            normalizer=norm.tokens,
        )
        info = result.metrics()
        info.pop("loss", None)
        if cfg.awac_beta == 0:  # every AWAC weight is exp(0) = 1 (or awac_max_weight): a constant
            info.pop("awac_weight_mean", None)
        # the terms are normalised by the whole minibatch's token count; report them as this
        # micro-batch's means (the learner weighs micro-batches by their token share)
        share = norm.tokens / max(1.0, float(mask.sum()))
        for key in ("q_loss", "v_loss", "cql_loss", "awac_loss"):
            info[key] *= share
        return LossTerms(result.loss, info)

    # -- learn -----------------------------------------------------------------------------------

    def learn(
        self,
        experiences: Any,
        turn_ids: torch.Tensor | None = None,
        sampling_logps: Any = None,
    ) -> dict[str, float]:
        """One offline update from ``(completion_ids, action_masks, rewards)``; returns metrics.

        Phases: 1. parse the offline data (rewards placed on tokens); 2. update:
        ``update_epochs`` passes over the rows in shuffled minibatches of ``batch_size``, each
        one learner step (accumulated over ``micro_batch_size_per_gpu`` rows) of
        :meth:`micro_loss`; 3. Polyak-update the target Q heads every
        ``steps_for_target_q_sync`` steps. ``turn_ids`` and ``sampling_logps`` are accepted for
        the loops' signature and unused (ILQL's transitions are the action tokens; there is no
        importance ratio). Rows must be right-padded (the attention covers each row up to its
        last real token). The last action of every row is terminal (V after it is 0), also for
        outputs cut off by a length limit, as in trlX. The metrics: the loss terms and head
        means of :func:`rl_losses.ilql_loss` averaged over the steps (``awac_weight_mean`` only
        with ``awac_beta > 0``: otherwise every weight is the same constant), ``loss`` (the
        last step's), ``mean_loss`` over several steps, ``grad_norm``, ``mean_reward`` and
        ``target_syncs``, the target updates this call made.

        Raises:
            ValueError: bad offline data (empty, mismatched lengths, missing or NaN rewards,
                rows without actions), naming the argument and the fix.
            FloatingPointError: a non-finite loss (weights untouched), unless
                ``skip_nonfinite``.
        """
        del turn_ids, sampling_logps
        batch, token_rewards = self.parse_offline(experiences)  # 1. parse
        estimates = Estimates(token_rewards=token_rewards)
        metrics: dict[str, list[float]] = {}
        syncs = 0
        for rows in self.minibatches(batch.num_rows):  # 2. update
            mbs = self.micro_batches(batch, None, estimates, rows)
            norm = self.learner.normalizers(batch.mask[rows], None)
            before = self.steps
            with self.policy.lean_lora():  # one autograd node per LoRA layer
                step = self.learner.step(
                    mbs, partial(self.micro_loss, norm=norm), norm, self._where()
                )
            self._apply(step, metrics)
            if self.steps > before and self.heads.maybe_sync(self.steps):  # 3. targets
                syncs += 1
        out = summarize(metrics, batch.rewards)
        out["target_syncs"] = float(syncs)
        return out

    # -- decoding --------------------------------------------------------------------------------

    def _heads_fn(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target = self.config.decode_q == "target"
        q = self.heads.reduced_q(hidden, self.config.target_reduction, target=target)
        return q, self.heads.values(hidden)

    def get_action(
        self,
        obs: Any,
        training: bool = True,
        repeat_prompts: bool = True,
        **kwargs: Any,
    ) -> ActionResult:
        """Value-guided completions: ``log_softmax(logits) + decode_beta * (Q - V)``.

        Sampled with ``top_k`` and ``temperature`` when ``training``, greedy otherwise; same
        return value as :meth:`LLMAlgorithm.get_action`.
        """
        ids = prompt_ids(obs)
        params = self.sampling_params(training)
        with (
            torch.no_grad(),
            value_guided_decoding(
                self.policy.causal_lm, self._heads_fn, beta=self.config.decode_beta
            ) as hook,
        ):
            guided = dataclasses.replace(params, logits_processor=hook)
            return generate_actions(self.engine, ids, guided, repeat_prompts, self.pad_token_id)
