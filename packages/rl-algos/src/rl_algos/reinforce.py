"""LLMREINFORCE: turn-level Monte-Carlo returns with Return Batch Normalization (ReBN)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from rl_algos.base import AgentParts, Batch, LLMAlgorithm
from rl_algos.config import AgentConfig
from rl_algos.estimators import rebn_advantages, turn_layout
from rl_algos.objectives import PolicyObjective, clip_options, token_weighted_options

__all__ = ["LLMREINFORCE", "REINFORCEConfig", "turn_layout"]


@dataclass
class REINFORCEConfig(AgentConfig):
    """:class:`~rl_algos.config.AgentConfig` plus REINFORCE's settings."""

    gamma: float = 1.0
    """Discount over turns, in [0, 1]."""
    importance_sampling_level: Literal["token", "turn"] = "token"
    """Ratio unit: per token, or pooled per turn (whose loss counts once per token of it)."""
    turn_ratio_pooling: Literal["sum", "mean"] = "sum"
    """Turn pooling of log-ratios (``"sum"``: product ratio, AgileRL's default)."""

    def __post_init__(self) -> None:
        """Check the values (each error names the argument)."""
        super().__post_init__()
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"`gamma` must be in [0, 1], got {self.gamma}")
        if self.importance_sampling_level not in ("token", "turn"):
            raise ValueError(
                "`importance_sampling_level` must be 'token' or 'turn', got "
                f"{self.importance_sampling_level!r}"
            )
        if self.use_liger_loss and self.importance_sampling_level != "token":
            raise ValueError(
                "use_liger_loss=True needs importance_sampling_level='token' (got "
                f"{self.importance_sampling_level!r}): a turn ratio couples tokens across "
                "chunks; pass use_liger_loss=False or importance_sampling_level='token'"
            )

    def ignored_options(self) -> dict[str, str]:
        """:meth:`AgentConfig.ignored_options` plus ``turn_ratio_pooling`` at token level."""
        out = super().ignored_options()
        if self.turn_ratio_pooling != "sum" and self.importance_sampling_level == "token":
            out["turn_ratio_pooling"] = (
                "`turn_ratio_pooling` pools the log-ratio over a turn, and the ratio here is per "
                "token: pass importance_sampling_level='turn', or leave it unset"
            )
        return out


class LLMREINFORCE(LLMAlgorithm):
    r"""Turn-level REINFORCE with Return Batch Normalization (GEM, arXiv 2510.01051, Sec. 3).

    Per turn :math:`G_k = \sum_{j \ge k} \gamma^{j-k} r_j`
    (:func:`rl_advantages.discounted_returns`), normalised over every (sequence, turn) of the
    batch (``rl_advantages.get_estimator("rebn")``) and spread over the turn's tokens. With
    ``clip_coef`` (default 0.2) the loss is PPO's clipped surrogate, safe for several
    ``update_epochs``; with ``clip_coef=None`` it is plain REINFORCE
    (:func:`rl_losses.reinforce_loss`). The ratio is per token, or pooled per turn
    (``importance_sampling_level="turn"``) with ``turn_ratio_pooling`` (``"sum"``: product
    ratio, AgileRL's default). The loss is a token mean over the minibatch: every action token
    weighs the same, a pooled turn's loss counting once per token of the turn (rl-losses'
    ``unit_weight="tokens"``); ``beta`` adds the k3 KL to the reference. Settings:
    :class:`REINFORCEConfig`.
    """

    algo_name: ClassVar[str] = "reinforce"
    config_class: ClassVar[type[AgentConfig]] = REINFORCEConfig
    config: REINFORCEConfig

    def objective(self) -> PolicyObjective:
        """The policy loss as data: REINFORCE, or the clipped surrogate with ``clip_coef``."""
        cfg = self.config
        c = cfg.clip_coef
        options: dict[str, Any] = {}
        if c is not None:
            options = clip_options(c)
            options.pop("clip_high", None)  # symmetric: clip_high defaults to clip_low
        loss = "reinforce" if c is None else "ppo"
        level = cfg.importance_sampling_level
        return PolicyObjective(
            loss=loss,
            options=token_weighted_options(loss, level, "token_mean", options),
            aggregation="token_mean",
            level=level,
            pooling=cfg.turn_ratio_pooling,
            beta=cfg.beta,
            kl_kind=cfg.kl_kind,
        )

    def parts(self, batch: Batch) -> AgentParts:
        """ReBN turn returns and REINFORCE (or clipped) objective."""
        if self.config.importance_sampling_level == "turn" and batch.turn_ids is None:
            raise ValueError("importance_sampling_level='turn' needs `turn_ids` in learn()")
        gamma = self.config.gamma
        return AgentParts(
            estimate=lambda b, scores: rebn_advantages(b, gamma),
            objective=self.objective(),
            needs_old_logprobs=False,
        )
