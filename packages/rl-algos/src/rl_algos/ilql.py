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

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from rl_adapters import ILQLHeads, load_checkpoint, save_checkpoint
from rl_kernels import fused_logprobs
from rl_losses import ilql_loss
from rl_rollout import SamplingParams, value_guided_decoding

from rl_algos.base import Batch, LLMAlgorithm, _stack
from rl_algos.config import ActionResult, cosine_schedule

__all__ = ["ILQL", "pack_actions", "shape_rewards"]

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
    if isinstance(experiences, dict):
        keys = ("completion_ids", "action_masks", "rewards")
        missing = [k for k in keys if k not in experiences]
        if missing:
            raise ValueError(
                f"`experiences` lacks {missing}: pass completion_ids [N, L], action_masks "
                "[N, L - 1] and rewards [N] (or [N, L - 1])"
            )
        experiences = tuple(experiences[k] for k in keys)
    if not isinstance(experiences, tuple | list) or len(experiences) != 3:
        raise ValueError(
            "`experiences` must be (completion_ids [N, L], action_masks [N, L - 1], rewards)"
        )
    comp, masks, rewards = experiences
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

    Args:
        gamma: Discount in [0, 1].
        tau: Expectile of the V loss in (0, 1).
        cql_scale: Weight of the CQL term.
        awac_scale: Weight of the AWAC (LM) term.
        awac_beta: AWAC inverse temperature (0: behaviour cloning).
        awac_max_weight: Clip of the AWAC weight, or None.
        two_qs: Two Q heads (clipped double-Q) instead of one.
        alpha: Polyak rate of the target heads.
        steps_for_target_q_sync: Optimizer steps between target updates.
        head_mlp: trlX's two-layer heads (False: linear heads).
        heads_lr: Learning rate of the heads (default ``lr``).
        target_reduction: ``"min"`` or ``"mean"`` over the (target) Q heads, in the loss and
            for decoding.
        decode_beta: Guidance strength :math:`\beta` of decoding (>= 0).
        decode_q: ``"target"`` (trlX) or ``"online"`` Q heads for decoding.
        *args: See :class:`~rl_algos.LLMAlgorithm`.
        **kwargs: See :class:`~rl_algos.LLMAlgorithm`.
    """

    algo_name: ClassVar[str] = "ilql"

    def __init__(
        self,
        *args: Any,
        gamma: float = 0.99,
        tau: float = 0.7,
        cql_scale: float = 0.1,
        awac_scale: float = 1.0,
        awac_beta: float = 0.0,
        awac_max_weight: float | None = None,
        two_qs: bool = True,
        alpha: float = 0.001,
        steps_for_target_q_sync: int = 5,
        head_mlp: bool = True,
        heads_lr: float | None = None,
        target_reduction: Literal["min", "mean"] = "min",
        decode_beta: float = 1.0,
        decode_q: Literal["target", "online"] = "target",
        **kwargs: Any,
    ) -> None:
        checks = [
            ("gamma", 0 <= gamma <= 1, "in [0, 1]"),
            ("tau", 0 < tau < 1, "in (0, 1)"),
            ("cql_scale", cql_scale >= 0, ">= 0"),
            ("awac_scale", awac_scale >= 0, ">= 0"),
            ("awac_beta", awac_beta >= 0, ">= 0"),
            ("decode_beta", decode_beta >= 0, ">= 0"),
            ("alpha", 0 <= alpha <= 1, "in [0, 1]"),
            ("steps_for_target_q_sync", steps_for_target_q_sync >= 1, ">= 1"),
            ("awac_max_weight", awac_max_weight is None or awac_max_weight > 0, "> 0 or None"),
            ("heads_lr", heads_lr is None or heads_lr >= 0, ">= 0 or None"),
        ]  # fmt: skip
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"`{name}` must be {rule}, got {locals()[name]!r}")
        if target_reduction not in ("min", "mean"):
            raise ValueError(
                f"`target_reduction` must be 'min' or 'mean', got {target_reduction!r}"
            )
        if decode_q not in ("target", "online"):
            raise ValueError(f"`decode_q` must be 'target' or 'online', got {decode_q!r}")
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
        from rl_algos.distributed import deepspeed_plugin

        if deepspeed_plugin(kwargs.get("accelerator")) is not None:
            raise ValueError(
                "ILQL under DeepSpeed is not supported (its Q/V heads live outside the policy "
                "module DeepSpeed wraps): use DDP or one process"
            )
        kwargs["beta"] = 0.0
        for name, value in (("temperature", 1.0), ("top_k", 20), ("top_p", 1.0)):
            kwargs.setdefault(name, value)
        kwargs.setdefault("use_separate_reference_adapter", False)  # no reference needed
        self.gamma, self.tau = gamma, tau
        self.cql_scale, self.awac_scale = cql_scale, awac_scale
        self.awac_beta, self.awac_max_weight = awac_beta, awac_max_weight
        self.target_reduction: Literal["min", "mean"] = target_reduction
        self.decode_beta, self.decode_q = decode_beta, decode_q
        self._heads_lr = heads_lr
        self._hook: Any = None
        self._hidden: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        self.heads = ILQLHeads.for_model(
            self.policy.causal_lm,
            seed=self.seed + 2,
            two_qs=two_qs,
            alpha=alpha,
            sync_every=steps_for_target_q_sync,
            mlp=head_mlp,
        ).to(self.device)
        self._broadcast_weights(self.heads)
        self._build_optimizers()

    # -- optimisation state ----------------------------------------------------------------------

    @property
    def heads_lr(self) -> float:
        """Learning rate of the ILQL heads (defaults to ``lr``)."""
        return self.lr if self._heads_lr is None else self._heads_lr

    def _build_optimizers(self) -> None:
        heads = getattr(self, "heads", None)
        groups: list[dict[str, Any]] = [{"params": self.actor_parameters(), "lr": self.lr}]
        if heads is not None:
            groups.append({"params": heads.trainable_parameters(), "lr": self.heads_lr})
        self.optimizer = torch.optim.AdamW(groups, lr=self.lr, weight_decay=0.0)
        self.lr_scheduler = (
            cosine_schedule(self.optimizer, self.cosine_lr_schedule_config)
            if self.cosine_lr_schedule_config is not None
            else None
        )

    # -- data ------------------------------------------------------------------------------------

    def _parse_offline(self, experiences: Any) -> tuple[Batch, torch.Tensor, torch.Tensor]:
        """``(batch, token_rewards [N, T], sequence_rewards [N])`` from offline experience."""
        comp, masks, rewards = _unpack(experiences)
        ids = _stack("completion_ids", comp, self.pad_token_id, torch.long).to(self.device)
        mask = _stack("action_masks", masks, False, torch.bool).to(self.device)
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
        real = ids != self.pad_token_id
        real[:, 1:] |= mask
        last_real = torch.where(real, torch.arange(L, device=ids.device), 0).amax(1)
        attention = (torch.arange(L, device=ids.device)[None] <= last_real[:, None]).long()
        batch = Batch(ids, attention, mask, seq_rewards, None, None)
        return batch, token_rewards, seq_rewards

    # -- forward and loss ------------------------------------------------------------------------

    def _logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        role: str = "actor",
    ) -> torch.Tensor:
        """[N, T] log-probs (temperature 1) of the action tokens; keeps the hidden states.

        The shared optimizer step calls this and then :meth:`_loss` on the same micro-batch,
        which reads the kept hidden states: one trunk forward feeds the LM and the heads.
        """
        hidden = self.policy.hidden_states(input_ids, attention_mask, role=role)[:, :-1]
        self._hidden = hidden
        out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        rows = hidden[mask]
        if not bool(torch.isfinite(rows).all()):
            return out.masked_fill(mask, math.nan) + 0.0 * rows.nan_to_num().sum()
        picked = fused_logprobs(
            rows,
            self.policy.lm_head_weight,
            input_ids[:, 1:][mask],
            bias=self.policy.lm_head_bias,
            chunk_rows=self.fused_logprobs_chunk_rows,
        )
        assert isinstance(picked, torch.Tensor)
        return out.masked_scatter(mask, picked.float())

    def _loss(
        self, mb: dict[str, Any], lp: torch.Tensor, norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        hidden, self._hidden = self._hidden, None
        mask = mb["mask"]
        if hidden is None or hidden.shape[:2] != mask.shape:  # pragma: no cover - internal
            raise RuntimeError("ILQL._loss needs the hidden states of the same micro-batch")
        index, packed = pack_actions(mask)
        H = hidden.shape[-1]
        h = hidden.gather(1, index[..., None].expand(-1, -1, H))
        out = self.heads(h)
        heads_out = [*out.qs, *out.target_qs, out.values]
        if not all(bool(torch.isfinite(t[packed]).all()) for t in heads_out):
            # non-finite head outputs: a NaN loss with a connected graph, so the optimizer
            # step's guard raises (or skips with skip_nonfinite) and nothing is applied
            zero = sum((t.nan_to_num().sum() * 0.0 for t in heads_out), h.new_zeros(()))
            return zero + math.nan, {}
        actions = mb["input_ids"][:, 1:].gather(1, index)
        result = ilql_loss(
            lp.gather(1, index),
            list(out.qs),
            list(out.target_qs),
            out.values,
            actions,
            mb["token_rewards"].gather(1, index),
            packed,
            gamma=self.gamma,
            tau=self.tau,
            cql_scale=self.cql_scale,
            awac_scale=self.awac_scale,
            awac_beta=self.awac_beta,
            awac_max_weight=self.awac_max_weight,
            target_reduction=self.target_reduction,
            aggregation="token_mean",
            normalizer=norm["tokens"],
        )
        info = result.metrics()
        info.pop("loss", None)
        # the terms are normalised by the whole minibatch's token count; report them as this
        # micro-batch's means (the optimizer step weighs micro-batches by their token share)
        share = norm["tokens"] / max(1.0, float(mask.sum()))
        for key in ("q_loss", "v_loss", "cql_loss", "awac_loss"):
            info[key] *= share
        return result.loss, info

    # -- learn -----------------------------------------------------------------------------------

    def learn(
        self,
        experiences: Any,
        turn_ids: torch.Tensor | None = None,
        sampling_logps: Any = None,
    ) -> dict[str, float]:
        """One offline update from ``(completion_ids, action_masks, rewards)``; returns metrics.

        ``update_epochs`` passes over the rows in shuffled minibatches of ``batch_size``, each
        one optimizer step (accumulated over ``micro_batch_size_per_gpu`` rows); the target Q
        heads are Polyak-updated every ``steps_for_target_q_sync`` steps. ``turn_ids`` and
        ``sampling_logps`` are accepted for the loops' signature and unused (ILQL's transitions
        are the action tokens; there is no importance ratio). Rows must be right-padded (the
        attention covers each row up to its last real token). The last action of every row is
        terminal (V after it is 0), also for outputs cut off by a length limit, as in trlX.

        Raises:
            ValueError: bad offline data (empty, mismatched lengths, missing or NaN rewards,
                rows without actions), naming the argument and the fix.
            FloatingPointError: a non-finite loss (weights untouched), unless
                ``skip_nonfinite``.
        """
        del turn_ids, sampling_logps
        batch, token_rewards, seq_rewards = self._parse_offline(experiences)
        N = batch.num_rows
        unused = torch.zeros(batch.mask.shape, device=self.device)
        extra = {"token_rewards": token_rewards}
        metrics: dict[str, list[float]] = {}
        syncs = 0
        for _ in range(self.update_epochs):
            order = torch.randperm(N, generator=self._torch_rng)
            for start in range(0, N, self.batch_size):
                rows = order[start : start + self.batch_size].sort().values.to(self.device)
                before = self.steps
                self._step(batch, rows, unused, None, extra, metrics)
                if self.steps > before and self.heads.maybe_sync(self.steps):
                    syncs += 1
        out = {k: sum(v) / len(v) for k, v in metrics.items() if v}
        losses = metrics.get("loss", [])
        out["loss"] = losses[-1] if losses else float("nan")
        out["mean_loss"] = sum(losses) / len(losses) if losses else float("nan")
        out["mean_reward"] = float(seq_rewards.mean())
        out["target_syncs"] = float(syncs)
        return out

    # -- decoding --------------------------------------------------------------------------------

    def _heads_fn(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target = self.decode_q == "target"
        q = self.heads.reduced_q(hidden, self.target_reduction, target=target)
        return q, self.heads.values(hidden)

    def sampling_params(self, training: bool = True) -> SamplingParams:
        """The base settings plus the value-guided hook (inside :meth:`get_action`)."""
        params = super().sampling_params(training)
        if self._hook is None:
            return params
        return dataclasses.replace(params, logits_processor=self._hook)

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
        with (
            torch.no_grad(),
            value_guided_decoding(
                self.policy.causal_lm, self._heads_fn, beta=self.decode_beta
            ) as hook,
        ):
            self._hook = hook
            try:
                return super().get_action(obs, training, repeat_prompts, **kwargs)
            finally:
                self._hook = None

    # -- checkpoints and clones ------------------------------------------------------------------

    def save_checkpoint(
        self, path: str | Path, lora_only: bool = True, save_optimizer: bool = True
    ) -> Path:
        """Save adapters (or weights), the ILQL heads, optimizer and state, atomically."""
        del lora_only
        return save_checkpoint(
            self.policy,
            path,
            optimizer=self.optimizer if save_optimizer else None,
            scheduler=self.lr_scheduler if save_optimizer else None,
            state=self._state(),
            heads={HEADS_NAME: self.heads},
        )

    def load_checkpoint(self, path: str | Path, load_optimizer: bool = True) -> None:
        """Restore what :meth:`save_checkpoint` wrote, heads included (no pickle)."""
        state = load_checkpoint(
            self.policy,
            path,
            optimizer=self.optimizer if load_optimizer else None,
            scheduler=self.lr_scheduler if load_optimizer else None,
            heads={HEADS_NAME: self.heads},
        )
        self._load_state(state)

    def clone(self, index: int | None = None) -> ILQL:
        """An independent copy, with its own heads (and their optimizer state)."""
        twin = super().clone(index)
        assert isinstance(twin, ILQL)
        twin.heads = copy.deepcopy(self.heads)
        twin._build_optimizers()
        for mine, theirs in zip(self._optimizers(), twin._optimizers(), strict=True):
            theirs.load_state_dict(mine.state_dict())
        return twin
