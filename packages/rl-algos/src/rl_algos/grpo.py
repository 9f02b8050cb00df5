"""GRPO and its family (GSPO, CISPO) and presets (Dr. GRPO, DAPO, RLOO, REINFORCE++)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from rl_advantages import (
    broadcast_to_tokens,
    group_relative,
    group_relative_per_turn,
    pool_to_turns,
    reinforce_plus_plus_baseline,
    rloo,
    whiten,
)
from rl_losses import (
    Aggregation,
    cispo_loss,
    clipped_surrogate,
    gspo_loss,
)

from rl_algos.base import Batch, LLMAlgorithm

__all__ = ["CISPO", "GRPO", "GSPO", "dapo", "dr_grpo", "reinforce_pp", "rloo_agent"]

LossType = Literal["grpo", "gspo", "cispo"]
Level = Literal["token", "turn", "trajectory"]


class GRPO(LLMAlgorithm):
    """Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300, eq. 3 and Sec. 4.1.2).

    ``group_size`` completions per prompt; the advantage of each is its reward standardised
    within its group (``adv_norm="mean_std"``) or only centred (``"mean_only"``, Dr. GRPO);
    the objective is chosen by ``loss_type``:

    * ``"grpo"``: PPO's clipped surrogate (:func:`rl_losses.clipped_surrogate`) with
      ``clip_coef`` (scalar: ``[1 - c, 1 + c]``; tuple: absolute ratio bounds, AgileRL's
      convention) plus ``beta`` times the k3 estimate of KL(pi || ref)
      (:func:`rl_losses.kl_penalty`; AgileRL mixes the two argument orders, we use the paper's).
    * ``"gspo"``: sequence-level ratio (:func:`rl_losses.gspo_loss`, arXiv 2507.18071).
    * ``"cispo"``: clipped IS weight times log-prob (:func:`rl_losses.cispo_loss`,
      arXiv 2506.13585) with the paper's upper-only clamp ``eps_high`` (AgileRL's older
      two-sided ``[1 - c, 1 + c]`` clamp is ``cispo_clamp="two_sided"``).

    Extra arguments over :class:`~rl_algos.base.LLMAlgorithm`: ``group_size``, ``adv_norm``,
    ``loss_type``, ``importance_sampling_level`` (token / turn / trajectory),
    ``advantage_granularity`` (auto / trajectory / turn), ``turn_ratio_pooling``,
    ``whiten_advantages``, ``adv_clip_range``, ``filter_zero_adv``, ``adv_filter_eps``,
    ``use_kl_advantage_shaping``, ``loss_aggregation`` (default ``seq_mean_token_mean``, the
    GRPO paper's; ``token_mean`` for CISPO, as in its paper), ``clip_coef_high``
    (clip-higher), ``cispo_eps_high``, ``cispo_clamp``,
    ``advantage_estimator`` (``"grpo"``, ``"rloo"``, ``"reinforce_pp_baseline"``).
    """

    algo_name: ClassVar[str] = "grpo"
    forced_loss_type: ClassVar[LossType | None] = None

    def __init__(
        self,
        *args: Any,
        group_size: int = 8,
        adv_norm: Literal["mean_std", "mean_only"] = "mean_std",
        loss_type: LossType = "grpo",
        importance_sampling_level: Level | None = None,
        advantage_granularity: Literal["auto", "trajectory", "turn"] = "auto",
        turn_ratio_pooling: Literal["sum", "mean"] = "mean",
        whiten_advantages: bool = False,
        adv_clip_range: float | None = None,
        filter_zero_adv: bool = False,
        adv_filter_eps: float = 0.0,
        use_kl_advantage_shaping: bool = False,
        loss_aggregation: Aggregation | None = None,
        clip_coef_high: float | None = None,
        cispo_eps_high: float = 4.0,
        cispo_clamp: Literal["upper", "two_sided"] = "upper",
        advantage_estimator: Literal["grpo", "rloo", "reinforce_pp_baseline"] = "grpo",
        max_length_norm: int | None = None,
        **kwargs: Any,
    ) -> None:
        loss_type = self.forced_loss_type or loss_type
        if loss_type not in ("grpo", "gspo", "cispo"):
            raise ValueError(f"`loss_type` must be 'grpo', 'gspo' or 'cispo', got {loss_type!r}")
        if loss_type == "gspo":
            importance_sampling_level = "trajectory"
        level = importance_sampling_level or "token"
        if level not in ("token", "turn", "trajectory"):
            raise ValueError(
                f"`importance_sampling_level` must be token, turn or trajectory, got {level!r}"
            )
        if kwargs.get("use_liger_loss") and level != "token":
            raise ValueError(
                f"use_liger_loss=True needs importance_sampling_level='token' (got {level!r}): a "
                "turn or trajectory ratio couples tokens across chunks; use the standard path"
            )
        if group_size < 1:
            raise ValueError(f"`group_size` must be >= 1, got {group_size}")
        if adv_norm not in ("mean_std", "mean_only"):
            raise ValueError(f"`adv_norm` must be 'mean_std' or 'mean_only', got {adv_norm!r}")
        if adv_clip_range is not None and adv_clip_range <= 0:
            raise ValueError(f"`adv_clip_range` must be > 0, got {adv_clip_range}")
        if loss_type == "gspo" and "clip_coef" not in kwargs:
            kwargs["clip_coef"] = 3e-4
            clip_coef_high = 4e-4 if clip_coef_high is None else clip_coef_high
        self.group_size = group_size
        self.adv_norm = adv_norm
        self.loss_type: LossType = loss_type
        self.importance_sampling_level: Level = level
        self.advantage_granularity = (
            ("turn" if level == "turn" else "trajectory")
            if advantage_granularity == "auto"
            else advantage_granularity
        )
        self.turn_ratio_pooling = turn_ratio_pooling
        self.whiten_advantages = whiten_advantages
        self.adv_clip_range = adv_clip_range
        self.filter_zero_adv = filter_zero_adv
        self.adv_filter_eps = adv_filter_eps
        self.use_kl_advantage_shaping = use_kl_advantage_shaping
        # CISPO's objective (MiniMax-M1 eq. 4) normalises by the batch's total token count
        self.loss_aggregation: Aggregation = loss_aggregation or (
            "token_mean" if loss_type == "cispo" else "seq_mean_token_mean"
        )
        self.clip_coef_high = clip_coef_high
        self.cispo_eps_high = cispo_eps_high
        self.cispo_clamp = cispo_clamp
        self.advantage_estimator = advantage_estimator
        self.max_length_norm = max_length_norm
        super().__init__(*args, **kwargs)

    def _group_size(self, training: bool) -> int:
        return self.group_size if training else 1

    def _check_batch(self, batch: Batch) -> None:
        N = batch.num_rows
        if N % self.group_size:
            raise ValueError(
                f"group_size={self.group_size} does not divide the batch's N={N} rows: pass "
                "group_size completions per prompt"
            )
        needs_turns = self.importance_sampling_level == "turn" or (
            self.advantage_granularity == "turn" and batch.rewards.dim() == 2
        )
        if needs_turns and batch.turn_ids is None:
            raise ValueError(
                "importance_sampling_level / advantage_granularity 'turn' needs `turn_ids` "
                "([N, L - 1], -1 off actions) in learn()"
            )

    # -- advantages ----------------------------------------------------------------------------

    def _sequence_advantages(self, r: torch.Tensor) -> torch.Tensor:
        G = self.group_size
        if self.advantage_estimator == "rloo":
            return rloo(r, G)
        if self.advantage_estimator == "reinforce_pp_baseline":
            raise ValueError("reinforce_pp_baseline needs token-level inputs")
        return group_relative(r, G, scale="group" if self.adv_norm == "mean_std" else "none")

    def _advantages(
        self, batch: Batch, old: torch.Tensor, ref: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        r, mask = batch.rewards, batch.mask
        if self.advantage_estimator == "reinforce_pp_baseline":
            seq = r.sum(-1) if r.dim() == 2 else r
            kl_tok = (old - ref) if ref is not None else None
            adv = reinforce_plus_plus_baseline(
                seq, mask, self.group_size, kl=kl_tok, beta=self.beta
            ).advantages
        elif self.advantage_granularity == "turn" and r.dim() == 2 and batch.turn_ids is not None:
            turn_mask = pool_to_turns(mask.float(), batch.turn_ids, num_turns=r.shape[1]).mask
            fallback = self._sequence_advantages(r.sum(-1))
            per_turn = group_relative_per_turn(
                r,
                turn_mask,
                self.group_size,
                scale="group" if self.adv_norm == "mean_std" else "none",
                fallback=fallback,
            )
            adv = broadcast_to_tokens(per_turn, batch.turn_ids)
        else:
            seq = r.sum(-1) if r.dim() == 2 else r
            adv = self._sequence_advantages(seq)[:, None].expand_as(old)
        adv = torch.where(mask, adv, torch.zeros_like(adv))
        if self.use_kl_advantage_shaping and ref is not None:
            adv = adv - self.beta * (old - ref)
        if self.whiten_advantages:
            adv = whiten(adv, mask)
        if self.adv_clip_range is not None:
            adv = adv.clamp(-self.adv_clip_range, self.adv_clip_range)
        out = {"advantages": adv}
        if self.filter_zero_adv:
            keep = (adv.abs() * mask).amax(1) > self.adv_filter_eps
            out["keep"] = keep
        return out

    # -- loss ------------------------------------------------------------------------------------

    @property
    def _kl_in_reward(self) -> bool:
        """The KL penalty is already in the advantages (shaping, REINFORCE++): no KL loss."""
        return self.use_kl_advantage_shaping or self.advantage_estimator == "reinforce_pp_baseline"

    def _clip_kwargs(self) -> dict[str, Any]:
        c = self.clip_coef
        if isinstance(c, tuple):
            return {"ratio_bounds": (float(c[0]), float(c[1]))}
        c = 0.2 if c is None else float(c)
        return {
            "clip_low": c,
            "clip_high": self.clip_coef_high if self.clip_coef_high is not None else c,
        }

    def _fused_spec(self, mb: dict[str, Any], norm: dict[str, float]) -> dict[str, Any] | None:
        if self.importance_sampling_level != "token" or self.loss_type == "gspo":
            return None
        if "keep" in mb:
            mb["mask"] = mb["mask"] & mb["keep"][:, None]
        agg = self.loss_aggregation
        spec: dict[str, Any] = {
            "aggregation": agg,
            "normalizer": norm["tokens"] if agg == "token_mean" else norm["sequences"],
            "max_length": self.max_length_norm,
        }
        if self._kl_in_reward:
            mb["ref"] = None
        if self.loss_type == "cispo":
            c = self.clip_coef if isinstance(self.clip_coef, float) else 0.2
            spec.update(
                objective="cispo", clamp=self.cispo_clamp, eps_low=c, eps_high=self.cispo_eps_high
            )
        else:
            spec.update(objective="ppo", **self._clip_kwargs())
        return spec

    def _loss(
        self, mb: dict[str, Any], lp: torch.Tensor, norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = mb["mask"]
        if "keep" in mb:
            mask = mask & mb["keep"][:, None]
        agg = self.loss_aggregation
        normalizer = norm["tokens"] if agg == "token_mean" else norm["sequences"]
        common: dict[str, Any] = {
            "aggregation": agg,
            "normalizer": normalizer,
            "max_length": self.max_length_norm,
            "is_weights": mb.get("is_weights"),
        }
        level_kw: dict[str, Any] = {
            "level": self.importance_sampling_level,
            "pooling": self.turn_ratio_pooling,
            "turn_ids": mb["turn_ids"],
        }
        adv = mb["advantages"]
        if self.loss_type == "gspo":
            ck = self._clip_kwargs()
            pg = gspo_loss(
                lp,
                mb["old"],
                adv,
                mask,
                clip_low=ck.get("clip_low", 3e-4),
                clip_high=ck.get("clip_high", 4e-4),
                **common,
            )
        elif self.loss_type == "cispo":
            c = self.clip_coef if isinstance(self.clip_coef, float) else 0.2
            pg = cispo_loss(
                lp,
                mb["old"],
                adv,
                mask,
                clamp=self.cispo_clamp,
                eps_low=c,
                eps_high=self.cispo_eps_high,
                **level_kw,
                **common,
            )
        else:
            pg = clipped_surrogate(
                lp, mb["old"], adv, mask, **self._clip_kwargs(), **level_kw, **common
            )
        loss, info = self._finish_loss(
            pg,
            lp,
            None if self._kl_in_reward else mb["ref"],
            mask,
            agg,
            normalizer,
            self.max_length_norm,
        )
        info["ratio_mean"] = pg.metrics().get("ratio_mean", 1.0)
        return loss, info


class GSPO(GRPO):
    """GRPO with ``loss_type="gspo"``: sequence-level ratio (arXiv 2507.18071)."""

    algo_name: ClassVar[str] = "gspo"
    forced_loss_type: ClassVar[LossType | None] = "gspo"


class CISPO(GRPO):
    """GRPO with ``loss_type="cispo"``: clipped IS weight x log-prob (arXiv 2506.13585)."""

    algo_name: ClassVar[str] = "cispo"
    forced_loss_type: ClassVar[LossType | None] = "cispo"


def dr_grpo(**kwargs: Any) -> GRPO:
    """Dr. GRPO (arXiv 2503.20783, Sec. 3.1): no std scaling, a constant length normaliser.

    ``adv_norm="mean_only"`` and ``loss_aggregation="seq_mean_token_sum_norm"`` with
    ``max_length_norm = max_output_tokens``; ``beta=0`` (the paper drops the KL term).
    """
    kwargs.setdefault("adv_norm", "mean_only")
    kwargs.setdefault("loss_aggregation", "seq_mean_token_sum_norm")
    kwargs.setdefault("max_length_norm", kwargs.get("max_output_tokens"))
    kwargs.setdefault("beta", 0.0)
    return GRPO(**kwargs)


def dapo(**kwargs: Any) -> GRPO:
    """DAPO (arXiv 2503.14476): clip-higher 0.2/0.28 and a token-level normaliser, no KL.

    Dynamic sampling (dropping all-equal groups, eq. 11) is ``filter_zero_adv=True``; the
    overlong shaping (eq. 13) is a reward helper (``rl_envs.rewards.overlong_reward``).
    """
    kwargs.setdefault("clip_coef", 0.2)
    kwargs.setdefault("clip_coef_high", 0.28)
    kwargs.setdefault("loss_aggregation", "token_mean")
    kwargs.setdefault("filter_zero_adv", True)
    kwargs.setdefault("beta", 0.0)
    return GRPO(**kwargs)


def rloo_agent(**kwargs: Any) -> GRPO:
    """RLOO (arXiv 2402.14740): leave-one-out baseline, no std scaling, token-mean loss."""
    kwargs.setdefault("advantage_estimator", "rloo")
    kwargs.setdefault("loss_aggregation", "token_mean")
    return GRPO(**kwargs)


def reinforce_pp(**kwargs: Any) -> GRPO:
    """REINFORCE++-baseline (arXiv 2501.03262): group-mean baseline, KL in reward, whitening."""
    kwargs.setdefault("advantage_estimator", "reinforce_pp_baseline")
    kwargs.setdefault("loss_aggregation", "token_mean")
    return GRPO(**kwargs)
