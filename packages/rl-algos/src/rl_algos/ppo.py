"""LLMPPO: PPO with a LoRA critic and a value head on the shared base, turn-level GAE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from rl_adapters import ValueHead
from rl_adapters.seeding import seeded
from rl_losses import value_loss

from rl_algos.base import AgentParts, Batch, LLMAlgorithm
from rl_algos.batch import Estimates, MicroBatch, Normalizers, Scores
from rl_algos.config import AgentConfig
from rl_algos.estimators import gae_advantages, turn_layout, turn_values
from rl_algos.learner import broadcast_module
from rl_algos.objectives import LossTerms, PolicyObjective, clip_options

__all__ = ["LLMPPO", "PPOConfig", "turn_values"]


@dataclass
class PPOConfig(AgentConfig):
    """:class:`~rl_algos.config.AgentConfig` plus PPO's settings."""

    gamma: float = 1.0
    """Discount over turns, in [0, 1]."""
    gae_lambda: float = 0.95
    """GAE's lambda, in [0, 1]."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    cliprange_value: float | None = 0.2
    """Value clipping around the old values (None: off)."""
    critic_lr: float | None = None
    """Critic learning rate (default ``lr``)."""
    turn_value_reduction: Literal["first", "mean", "final"] = "first"
    """Which token value is a turn's value (:func:`turn_values`)."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch's action tokens (TRL, verl)."""
    critic_mode: Literal["adapter", "shared"] = "adapter"
    """``"adapter"``: a LoRA critic + value head (AgileRL); ``"shared"``: a value head on the
    actor's hidden states (trlX; also with full fine-tuning)."""

    def __post_init__(self) -> None:
        """Check the values (each error names the argument)."""
        super().__post_init__()
        for name in ("gamma", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"`{name}` must be in [0, 1], got {getattr(self, name)}")
        if self.vf_coef < 0:
            raise ValueError(f"`vf_coef` must be >= 0, got {self.vf_coef}")
        if self.critic_mode not in ("adapter", "shared"):
            raise ValueError(
                f"`critic_mode` must be 'adapter' or 'shared', got {self.critic_mode!r}"
            )

    def ignored_options(self) -> dict[str, str]:
        """:meth:`AgentConfig.ignored_options` plus ``clip_coef=None`` (PPO always clips)."""
        out = super().ignored_options()
        if self.clip_coef is None:
            out["clip_coef"] = (
                "`clip_coef=None` would clip at 0.2 in LLMPPO, not turn clipping off (only "
                "LLMREINFORCE's does): pass a number or (lo, hi) bounds"
            )
        return out


class LLMPPO(LLMAlgorithm):
    """PPO for LLMs (arXiv 1707.06347) with a critic adapter and value head on the same base.

    ``critic_mode="adapter"`` (AgileRL's layout, LoRA only): the critic is its own LoRA adapter
    plus a value head on the shared frozen base. ``critic_mode="shared"`` (trlX's layout): a
    value head on the actor's hidden states, the value loss training the trunk too; it also
    works with ``full_finetune=True``.

    Each turn is one action: its value comes from the critic (``turn_value_reduction``), its
    advantage and return from GAE over the turns (``rl_advantages.get_estimator("gae")``,
    ``gamma``, ``gae_lambda``; arXiv 1506.02438), spread over the turn's tokens. The loss is the
    clipped surrogate (token mean; advantages whitened over the batch's action tokens unless
    ``whiten_advantages=False``, as TRL and verl do) plus ``vf_coef`` times the (optionally
    clipped, ``cliprange_value``) value loss over turns plus ``beta`` times the k3 KL to the
    reference. Actor and critic are two parameter groups of one AdamW (``lr``, ``critic_lr``).
    Settings: :class:`PPOConfig`.
    """

    algo_name: ClassVar[str] = "ppo"
    uses_critic: ClassVar[bool] = True
    config_class: ClassVar[type[AgentConfig]] = PPOConfig
    config: PPOConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config.critic_mode == "shared":
            # trlX's layout: a value head on the actor's own hidden states (shared trunk; the
            # value loss also trains the trunk). Works with full fine-tuning.
            with seeded(self.config.seed + 1):  # built on the CPU, then moved
                head = ValueHead(int(self.policy.causal_lm.config.hidden_size))
            self.policy.value_head = head.to(self.device)
            broadcast_module(self.policy.value_head)
            self.learner = self.build_learner()

    def _critic_parameters(self) -> list[torch.nn.Parameter]:
        if self.config.critic_mode == "shared":
            head = self.policy.value_head
            return [] if head is None else list(head.parameters())
        return self.policy.trainable_parameters("critic")

    @property
    def critic_lr(self) -> float:
        """Critic learning rate (defaults to ``lr``)."""
        return self.config.lr if self.config.critic_lr is None else self.config.critic_lr

    def param_groups(self) -> list[dict[str, Any]]:
        """Two AdamW groups: the actor's (``lr``) and the critic's (``critic_lr``)."""
        return [
            {"params": self.actor_parameters(), "lr": self.config.lr},
            {"params": self._critic_parameters(), "lr": self.critic_lr},
        ]

    def _turn_values(
        self, ids: torch.Tensor, attn: torch.Tensor, turn_ids: torch.Tensor, K: int
    ) -> torch.Tensor:
        """[M, K] turn values of rows ``ids`` [M, L] (``turn_ids`` [M, T], shifted by one)."""
        head = self.policy.value_head
        if head is None:
            raise ValueError("LLMPPO's policy has no value head")
        role = "actor" if self.config.critic_mode == "shared" else "critic"
        values = head(self.scorer.hidden_states(ids, attn, role, turn_ids >= 0))  # packed or not
        return turn_values(values, turn_ids, K, self.config.turn_value_reduction)

    def _estimate(self, batch: Batch, scores: Scores) -> Estimates:
        del scores
        cfg = self.config
        turn_ids, turn_mask, r = turn_layout(batch)
        v_old = r.new_zeros(r.shape)
        split = self.scorer.row_groups(batch.attention_mask, batch.input_ids, batch.mask)
        for rows in split:  # the token budget
            ids, attn = batch.input_ids[rows], batch.attention_mask[rows]
            v_old[rows] = self._turn_values(ids, attn, turn_ids[rows], r.shape[1]).to(r.dtype)
        return gae_advantages(
            batch, v_old, turn_ids, turn_mask, r, cfg.gamma, cfg.gae_lambda, cfg.whiten_advantages
        )

    def _value_loss(self, mb: MicroBatch, norm: Normalizers) -> LossTerms:
        if mb.returns is None or mb.turn_ids is None or mb.turn_mask is None:
            raise ValueError("PPO's value loss needs returns, turn_ids and turn_mask estimates")
        if mb.old_values is None:
            raise ValueError("PPO's value loss needs the old values")
        values = self._turn_values(
            mb.input_ids, mb.attention_mask, mb.turn_ids, mb.returns.shape[1]
        )
        vl = value_loss(
            values,
            mb.old_values,
            mb.returns,
            mb.turn_mask,
            clip=self.config.cliprange_value,
            aggregation="token_mean",
            normalizer=norm.turns,
        )
        return LossTerms(self.config.vf_coef * vl.loss, {"value_loss": float(vl.loss.detach())})

    def objective(self) -> PolicyObjective:
        """The clipped surrogate (token mean) with the k3 KL, as data."""
        cfg = self.config
        options = clip_options(cfg.clip_coef)
        options.pop("clip_high", None)
        return PolicyObjective(loss="ppo", options=options, beta=cfg.beta, kl_kind=cfg.kl_kind)

    def parts(self, batch: Batch) -> AgentParts:
        """Turn-level GAE with the critic, the clipped surrogate and the value loss."""
        return AgentParts(
            estimate=self._estimate,
            objective=self.objective(),
            extra_loss=self._value_loss,
            needs_old_logprobs=False,
        )
