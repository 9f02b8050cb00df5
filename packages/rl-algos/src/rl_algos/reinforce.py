"""LLMREINFORCE: turn-level Monte-Carlo returns with Return Batch Normalization (ReBN)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from rl_advantages import broadcast_to_tokens, discounted_returns, pool_to_turns, rebn
from rl_losses import clipped_surrogate, reinforce_loss

from rl_algos.base import Batch, LLMAlgorithm

__all__ = ["LLMREINFORCE", "turn_layout"]


def turn_layout(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(turn_ids [N, T], turn_mask [N, K], rewards [N, K])`` for single- or multi-turn batches.

    A batch without ``turn_ids`` is one turn per row (every action token is turn 0).
    """
    r = batch.rewards
    if batch.turn_ids is None:
        if r.dim() == 2 and r.shape[1] != 1:
            raise ValueError(
                f"per-turn `rewards` {tuple(r.shape)} need `turn_ids` ([N, L - 1]) in learn()"
            )
        turn_ids = torch.where(batch.mask, 0, -1)
        r = r.reshape(-1, 1)
    else:
        turn_ids = batch.turn_ids
        r = r if r.dim() == 2 else r[:, None]
    turn_mask = pool_to_turns(batch.mask.float(), turn_ids, num_turns=r.shape[1]).mask
    if r.shape[1] == 1 and batch.turn_ids is not None and int(turn_ids.max()) > 0:
        raise ValueError(
            "`rewards` has one value per row but `turn_ids` has several turns: pass per-turn "
            "rewards [N, K]"
        )
    return turn_ids, turn_mask, r


class LLMREINFORCE(LLMAlgorithm):
    r"""Turn-level REINFORCE with Return Batch Normalization (GEM, arXiv 2510.01051, Sec. 3).

    Per turn :math:`G_k = \sum_{j \ge k} \gamma^{j-k} r_j`
    (:func:`rl_advantages.discounted_returns`), normalised over every (sequence, turn) of the
    batch (:func:`rl_advantages.rebn`) and spread over the turn's tokens. With ``clip_coef``
    (default 0.2) the loss is PPO's clipped surrogate, safe for several ``update_epochs``;
    with ``clip_coef=None`` it is plain REINFORCE (:func:`rl_losses.reinforce_loss`). The
    ratio is per token, or pooled per turn (``importance_sampling_level="turn"``) with
    ``turn_ratio_pooling`` (``"sum"``: product ratio, AgileRL's default). The loss is a
    token mean over the minibatch; ``beta`` adds the k3 KL to the reference.
    """

    algo_name: ClassVar[str] = "reinforce"

    def __init__(
        self,
        *args: Any,
        gamma: float = 1.0,
        importance_sampling_level: Literal["token", "turn"] = "token",
        turn_ratio_pooling: Literal["sum", "mean"] = "sum",
        **kwargs: Any,
    ) -> None:
        if not 0 <= gamma <= 1:
            raise ValueError(f"`gamma` must be in [0, 1], got {gamma}")
        if importance_sampling_level not in ("token", "turn"):
            raise ValueError(
                "`importance_sampling_level` must be 'token' or 'turn', got "
                f"{importance_sampling_level!r}"
            )
        if kwargs.get("use_liger_loss") and importance_sampling_level != "token":
            raise ValueError("use_liger_loss=True needs importance_sampling_level='token'")
        self.gamma = gamma
        self.importance_sampling_level = importance_sampling_level
        self.turn_ratio_pooling = turn_ratio_pooling
        super().__init__(*args, **kwargs)

    def _check_batch(self, batch: Batch) -> None:
        if self.importance_sampling_level == "turn" and batch.turn_ids is None:
            raise ValueError("importance_sampling_level='turn' needs `turn_ids` in learn()")

    def _advantages(
        self, batch: Batch, old: torch.Tensor, ref: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        turn_ids, turn_mask, r = turn_layout(batch)
        returns = discounted_returns(r, turn_mask, self.gamma)
        adv = broadcast_to_tokens(rebn(returns, turn_mask), turn_ids)
        return {"advantages": adv, "turn_ids_full": turn_ids}

    def _fused_spec(self, mb: dict[str, Any], norm: dict[str, float]) -> dict[str, Any] | None:
        if self.importance_sampling_level != "token":
            return None
        spec: dict[str, Any] = {"aggregation": "token_mean", "normalizer": norm["tokens"]}
        c = self.clip_coef
        if c is None:
            spec["objective"] = "reinforce"
        elif isinstance(c, tuple):
            spec.update(objective="ppo", ratio_bounds=(float(c[0]), float(c[1])))
        else:
            spec.update(objective="ppo", clip_low=float(c))
        return spec

    def _loss(
        self, mb: dict[str, Any], lp: torch.Tensor, norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        mask, adv = mb["mask"], mb["advantages"]
        common: dict[str, Any] = {
            "aggregation": "token_mean",
            "normalizer": norm["tokens"],
            "is_weights": mb.get("is_weights"),
        }
        if self.importance_sampling_level == "turn":
            common.update(
                level="turn", pooling=self.turn_ratio_pooling, turn_ids=mb["turn_ids_full"]
            )
        if self.clip_coef is None:
            pg = reinforce_loss(lp, mb["old"], adv, mask, **common)
        else:
            c = self.clip_coef
            clip: dict[str, Any] = (
                {"ratio_bounds": (float(c[0]), float(c[1]))}
                if isinstance(c, tuple)
                else {"clip_low": float(c)}
            )
            pg = clipped_surrogate(lp, mb["old"], adv, mask, **clip, **common)
        return self._finish_loss(pg, lp, mb["ref"], mask, "token_mean", norm["tokens"])
