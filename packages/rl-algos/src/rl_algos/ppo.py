"""LLMPPO: PPO with a LoRA critic and a value head on the shared base, turn-level GAE."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from rl_adapters import ValueHead
from rl_advantages import broadcast_to_tokens, gae, pool_to_turns, whiten
from rl_losses import clipped_surrogate, value_loss

from rl_algos.base import Batch, LLMAlgorithm
from rl_algos.config import cosine_schedule
from rl_algos.reinforce import turn_layout

__all__ = ["LLMPPO", "turn_values"]


def turn_values(
    values: torch.Tensor,
    turn_ids: torch.Tensor,
    num_turns: int,
    reduction: Literal["first", "mean", "final"] = "first",
) -> torch.Tensor:
    """[N, K] the critic's value of each turn from token values [N, T].

    ``values[:, t]`` is the value of the prefix ending at token t, i.e. of the state in which
    token ``t + 1`` is generated, so with ``"first"`` a turn's value is ``values[:, t]`` at its
    first action position (the state before the turn, the usual choice for an action-level
    critic); ``"mean"`` / ``"final"`` pool the turn's positions
    (:func:`rl_advantages.pool_to_turns`).
    """
    if reduction in ("mean", "final"):
        return pool_to_turns(values, turn_ids, num_turns, reduction=reduction).values
    if reduction != "first":
        raise ValueError(f"`turn_value_reduction` must be first, mean or final, got {reduction!r}")
    ks = torch.arange(num_turns, device=turn_ids.device)
    hit = turn_ids[:, :, None] == ks[None, None, :]  # [N, T, K]
    first = hit.int().argmax(dim=1)  # [N, K] first position of each turn (0 if absent)
    out = values.gather(1, first)
    return torch.where(hit.any(dim=1), out, torch.zeros_like(out))


class LLMPPO(LLMAlgorithm):
    """PPO for LLMs (arXiv 1707.06347) with a critic adapter and value head on the same base.

    ``critic_mode="adapter"`` (AgileRL's layout, LoRA only): the critic is its own LoRA adapter
    plus a value head on the shared frozen base. ``critic_mode="shared"`` (trlX's layout): a
    value head on the actor's hidden states, the value loss training the trunk too; it also
    works with ``full_finetune=True``.

    Each turn is one action: its value comes from the critic (``turn_value_reduction``), its
    advantage and return from GAE over the turns (:func:`rl_advantages.gae`, ``gamma``,
    ``gae_lambda``; arXiv 1506.02438), spread over the turn's tokens. The loss is the clipped
    surrogate (token mean; advantages whitened over the batch's action tokens unless
    ``whiten_advantages=False``, as TRL and verl do) plus ``vf_coef`` times the (optionally
    clipped, ``cliprange_value``) value loss over turns plus ``beta`` times the k3 KL to the
    reference. Actor and critic are two parameter groups of one AdamW (``lr``, ``critic_lr``).
    """

    algo_name: ClassVar[str] = "ppo"
    uses_critic: ClassVar[bool] = True

    def __init__(
        self,
        *args: Any,
        gamma: float = 1.0,
        gae_lambda: float = 0.95,
        vf_coef: float = 0.5,
        cliprange_value: float | None = 0.2,
        critic_lr: float | None = None,
        turn_value_reduction: Literal["first", "mean", "final"] = "first",
        whiten_advantages: bool = True,
        critic_mode: Literal["adapter", "shared"] = "adapter",
        **kwargs: Any,
    ) -> None:
        for name, value in (("gamma", gamma), ("gae_lambda", gae_lambda)):
            if not 0 <= value <= 1:
                raise ValueError(f"`{name}` must be in [0, 1], got {value}")
        if vf_coef < 0:
            raise ValueError(f"`vf_coef` must be >= 0, got {vf_coef}")
        self.gamma, self.gae_lambda, self.vf_coef = gamma, gae_lambda, vf_coef
        self.cliprange_value = cliprange_value
        self.turn_value_reduction = turn_value_reduction
        self.whiten_advantages = whiten_advantages
        if critic_mode not in ("adapter", "shared"):
            raise ValueError(f"`critic_mode` must be 'adapter' or 'shared', got {critic_mode!r}")
        self.critic_mode = critic_mode
        self._critic_lr = critic_lr
        super().__init__(*args, **kwargs)
        if critic_mode == "shared":
            # trlX's layout: a value head on the actor's own hidden states (shared trunk; the
            # value loss also trains the trunk). Works with full fine-tuning.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + 1)
                head = ValueHead(int(self.policy.causal_lm.config.hidden_size))
            self.policy.value_head = head.to(self.device)
            self._broadcast_weights(self.policy.value_head)
            self._build_optimizers()

    def _critic_adapter(self) -> bool:
        return getattr(self, "critic_mode", "adapter") == "adapter"

    def _critic_parameters(self) -> list[torch.nn.Parameter]:
        if self.critic_mode == "shared":
            head = self.policy.value_head
            return [] if head is None else list(head.parameters())
        return self.policy.trainable_parameters("critic")

    @property
    def critic_lr(self) -> float:
        """Critic learning rate (defaults to ``lr``)."""
        return self.lr if self._critic_lr is None else self._critic_lr

    def _build_optimizers(self) -> None:
        # one AdamW, two parameter groups: the actor's (lr) and the critic's (critic_lr), so the
        # checkpoint holds both states and the scheduler scales both
        self.optimizer = torch.optim.AdamW(
            [
                {"params": self.actor_parameters(), "lr": self.lr},
                {"params": self._critic_parameters(), "lr": self.critic_lr},
            ],
            lr=self.lr,
            weight_decay=0.0,
        )
        self.lr_scheduler = (
            cosine_schedule(self.optimizer, self.cosine_lr_schedule_config)
            if self.cosine_lr_schedule_config is not None
            else None
        )

    def _turn_values(
        self, ids: torch.Tensor, attn: torch.Tensor, turn_ids: torch.Tensor, K: int
    ) -> torch.Tensor:
        if self.critic_mode == "shared":
            head = self.policy.value_head
            assert head is not None
            values = head(self.policy.hidden_states(ids, attn))[:, :-1]
        else:
            values = self.policy.values(ids, attn)[:, :-1]
        return turn_values(values, turn_ids, K, self.turn_value_reduction)

    def _advantages(
        self, batch: Batch, old: torch.Tensor, ref: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        turn_ids, turn_mask, r = turn_layout(batch)
        v_old = self._turn_values(batch.input_ids, batch.attention_mask, turn_ids, r.shape[1])
        est = gae(r, v_old, turn_mask, self.gamma, self.gae_lambda)
        adv = broadcast_to_tokens(est.advantages, turn_ids)
        if self.whiten_advantages:  # over every action token of the batch (TRL, verl)
            adv = whiten(adv, batch.mask)
        return {
            "advantages": adv,
            "returns": est.returns,
            "old_values": v_old,
            "turn_mask": turn_mask,
            "turn_ids_full": turn_ids,
        }

    def _more_normalizers(
        self, extra: dict[str, torch.Tensor], rows: torch.Tensor
    ) -> dict[str, float]:
        count = extra["turn_mask"][rows].sum().double()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(count)
        return {"turns": max(1.0, float(count))}

    def _clip(self) -> dict[str, Any]:
        c = self.clip_coef
        if isinstance(c, tuple):
            return {"ratio_bounds": (float(c[0]), float(c[1]))}
        return {"clip_low": 0.2 if c is None else float(c)}

    def _fused_spec(self, mb: dict[str, Any], norm: dict[str, float]) -> dict[str, Any] | None:
        return {
            "objective": "ppo",
            "aggregation": "token_mean",
            "normalizer": norm["tokens"],
            **self._clip(),
        }

    def _value_term(self, mb: dict[str, Any], norm: dict[str, float]) -> Any:
        K = mb["returns"].shape[1]
        values = self._turn_values(mb["input_ids"], mb["attention_mask"], mb["turn_ids_full"], K)
        return value_loss(
            values,
            mb["old_values"],
            mb["returns"],
            mb["turn_mask"],
            clip=self.cliprange_value,
            aggregation="token_mean",
            normalizer=norm["turns"],
        )

    def _fused_extra(
        self, mb: dict[str, Any], norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        vl = self._value_term(mb, norm)
        return self.vf_coef * vl.loss, {"value_loss": float(vl.loss.detach())}

    def _loss(
        self, mb: dict[str, Any], lp: torch.Tensor, norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = mb["mask"]
        pg = clipped_surrogate(
            lp,
            mb["old"],
            mb["advantages"],
            mask,
            aggregation="token_mean",
            normalizer=norm["tokens"],
            is_weights=mb.get("is_weights"),
            **self._clip(),
        )
        loss, info = self._finish_loss(pg, lp, mb["ref"], mask, "token_mean", norm["tokens"])
        extra, extra_info = self._fused_extra(mb, norm)
        info.update(extra_info)
        return loss + extra, info
