"""GRPO and its family (GSPO, CISPO); the presets (Dr. GRPO, DAPO, ...) are in presets.py."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rl_kernels import FUSED_OBJECTIVES
from rl_losses import Aggregation, available_policy_losses, get_policy_loss

from rl_algos.base import AgentParts, Batch, LLMAlgorithm
from rl_algos.batch import Estimates, Scores
from rl_algos.config import AgentConfig
from rl_algos.estimators import (
    TOKEN_ESTIMATORS,
    WHOLE_SEQUENCE_ESTIMATORS,
    GroupAdvantage,
    group_advantages,
    resolve_estimator_name,
)
from rl_algos.objectives import (
    LOSS_ALIASES,
    PolicyObjective,
    clip_options,
    resolve_loss_name,
    token_weighted_options,
)

__all__ = ["CISPO", "GRPO", "GSPO", "GRPOConfig"]

Level = Literal["token", "turn", "trajectory"]

#: Keywords a policy loss is called with at a turn or trajectory ratio level.
_LEVEL_KEYWORDS = ("level", "pooling", "turn_ids")


def _takes_level(name: str) -> bool:
    """Whether the registered policy loss ``name`` takes :data:`_LEVEL_KEYWORDS`."""
    params = inspect.signature(get_policy_loss(name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(k in params for k in _LEVEL_KEYWORDS)


#: Defaults an objective brings when ``clip_coef`` is not passed (GSPO's paper values).
OBJECTIVE_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "gspo": {"clip_coef": 3e-4, "clip_coef_high": 4e-4},
}


def _gspo_options(cfg: GRPOConfig, name: str) -> dict[str, Any]:
    clip = clip_options(cfg.clip_coef, cfg.clip_coef_high)
    return {"clip_low": clip.get("clip_low", 3e-4), "clip_high": clip.get("clip_high", 4e-4)}


def _cispo_options(cfg: GRPOConfig, name: str) -> dict[str, Any]:
    c = cfg.clip_coef if isinstance(cfg.clip_coef, float) else 0.2
    return {"clamp": cfg.cispo_clamp, "eps_low": c, "eps_high": cfg.cispo_eps_high}


def _ppo_options(cfg: GRPOConfig, name: str) -> dict[str, Any]:
    return clip_options(cfg.clip_coef, cfg.clip_coef_high)


def _named_clip_options(cfg: GRPOConfig, name: str) -> dict[str, Any]:
    """A registered loss gets the clip bounds it names in its signature (and nothing else)."""
    accepted = inspect.signature(get_policy_loss(name)).parameters
    return {k: v for k, v in _ppo_options(cfg, name).items() if k in accepted}


#: How GRPO's keywords (``clip_coef``, ``clip_coef_high``, ``cispo_*``) become each built-in
#: objective's options; any other registered loss gets :func:`_named_clip_options`, and every
#: loss gets ``loss_kwargs`` on top.
LOSS_OPTIONS: Mapping[str, Callable[[GRPOConfig, str], dict[str, Any]]] = {
    "ppo": _ppo_options,
    "gspo": _gspo_options,
    "cispo": _cispo_options,
}


@dataclass
class GRPOConfig(AgentConfig):
    """:class:`~rl_algos.config.AgentConfig` plus the GRPO family's settings."""

    group_size: int = 8
    """``G`` completions per prompt."""
    adv_norm: Literal["mean_std", "mean_only"] = "mean_std"
    """Standardise within the group (``"mean_std"``) or only centre (Dr. GRPO)."""
    loss_type: str = "grpo"
    """``"grpo"`` (PPO's clipped surrogate), ``"gspo"``, ``"cispo"``, or any policy loss
    registered with :func:`rl_losses.register_policy_loss`."""
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments of the policy loss (a registered one's own options)."""
    importance_sampling_level: Level | None = None
    """Ratio unit: token (default), turn or trajectory (GSPO's, which refuses the others). The
    loss of a turn or trajectory counts once per unit in the sequence means, once per token of
    it with ``token_mean``. Turn and trajectory need a loss that takes ``level``, ``pooling``
    and ``turn_ids`` (refused otherwise)."""
    advantage_granularity: Literal["auto", "trajectory", "turn"] = "auto"
    """Per-turn group-relative advantages for [N, K] rewards (``auto``: with turn ratios). The
    estimators of :data:`~rl_algos.estimators.WHOLE_SEQUENCE_ESTIMATORS` have no per-turn form:
    ``auto`` gives their whole-sequence advantages, ``"turn"`` is refused."""
    turn_ratio_pooling: Literal["sum", "mean"] = "mean"
    """Log-ratio pooling within a turn or trajectory (refused at token level and for GSPO)."""
    whiten_advantages: bool = False
    """Whiten advantages over the batch's action tokens."""
    adv_clip_range: float | None = None
    """Clamp advantages to ``[-c, c]``."""
    filter_zero_adv: bool = False
    """Drop rows with all-zero advantage from the loss and its normalisers (DAPO)."""
    adv_filter_eps: float = 0.0
    """Threshold of ``filter_zero_adv`` (refused without it)."""
    use_kl_advantage_shaping: bool = False
    """Put ``-beta * KL`` into the per-token advantages instead of a KL loss term."""
    loss_aggregation: Aggregation | None = None
    """Aggregation (default ``seq_mean_token_mean``, the paper's; ``token_mean`` for CISPO).
    ``token_mean`` weighs every action token the same at every ratio level: a turn's or
    trajectory's loss counts once per token of it (rl-losses' ``unit_weight="tokens"``, which a
    registered loss must then take), GSPO's is GSPO-token (``gradient="token"``) unless
    ``loss_kwargs`` sets ``gradient``."""
    clip_coef_high: float | None = None
    """Upper clip (clip-higher, DAPO); default ``clip_coef``. Refused where the objective reads no
    upper bound (a tuple ``clip_coef``, CISPO: ``cispo_eps_high``)."""
    cispo_eps_high: float = 4.0
    """CISPO's upper clamp of the IS weight."""
    cispo_clamp: Literal["upper", "two_sided"] = "upper"
    """CISPO's clamp: the paper's upper-only, or AgileRL's older two-sided one."""
    advantage_estimator: str = "grpo"
    """``"grpo"``, ``"rloo"``, ``"reinforce_pp_baseline"``, or any estimator registered with
    :func:`rl_advantages.register_estimator` (called ``fn(rewards [N], group_size, **kw)``)."""
    advantage_estimator_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further keyword arguments of the estimator."""
    max_length_norm: int | None = None
    """``L`` of ``seq_mean_token_sum_norm`` (Dr. GRPO: ``max_output_tokens``); refused with another
    aggregation."""

    def __post_init__(self) -> None:
        """Check the values and resolve the defaults that depend on others."""
        super().__post_init__()
        resolve_loss_name(self.loss_type)
        if self.loss_type == "gspo":
            if self.importance_sampling_level not in (None, "trajectory"):
                raise ValueError(
                    "loss_type='gspo' takes one ratio per sequence (importance_sampling_level="
                    f"'trajectory'), got importance_sampling_level="
                    f"{self.importance_sampling_level!r}: leave importance_sampling_level unset, "
                    "or pass loss_type='grpo' for token or turn ratios"
                )
            self.importance_sampling_level = "trajectory"
        level = self.importance_sampling_level or "token"
        if level not in ("token", "turn", "trajectory"):
            raise ValueError(
                f"`importance_sampling_level` must be token, turn or trajectory, got {level!r}"
            )
        self.importance_sampling_level = level
        if self.use_liger_loss and resolve_loss_name(self.loss_type) not in FUSED_OBJECTIVES:
            raise ValueError(
                f"use_liger_loss=True fuses only {', '.join(FUSED_OBJECTIVES)} (got loss_type="
                f"{self.loss_type!r}): pass use_liger_loss=False for this objective"
            )
        if self.use_liger_loss and level != "token":
            raise ValueError(
                f"use_liger_loss=True needs importance_sampling_level='token' (got {level!r}): a "
                "turn or trajectory ratio couples tokens across chunks; use the standard path"
            )
        if self.group_size < 1:
            raise ValueError(f"`group_size` must be >= 1, got {self.group_size}")
        if self.adv_norm not in ("mean_std", "mean_only"):
            raise ValueError(f"`adv_norm` must be 'mean_std' or 'mean_only', got {self.adv_norm!r}")
        estimator = resolve_estimator_name(self.advantage_estimator, self.adv_norm)
        if self.adv_clip_range is not None and self.adv_clip_range <= 0:
            raise ValueError(f"`adv_clip_range` must be > 0, got {self.adv_clip_range}")
        if self.advantage_granularity == "auto":  # per turn where the estimator has that form
            per_turn = level == "turn" and estimator not in WHOLE_SEQUENCE_ESTIMATORS
            self.advantage_granularity = "turn" if per_turn else "trajectory"
        if self.loss_aggregation is None:
            # CISPO's objective (MiniMax-M1 eq. 4) normalises by the batch's token count
            cispo = self.loss_type == "cispo"
            self.loss_aggregation = "token_mean" if cispo else "seq_mean_token_mean"
        name = resolve_loss_name(self.loss_type)
        if name != "gspo" and level != "token":  # GSPO fixes its own sequence level
            self._check_loss_takes_level(name, level)
        # token_mean at a turn or trajectory level: refused here for a loss without unit_weight
        token_weighted_options(
            name, None if name == "gspo" else level, self.loss_aggregation, self.loss_kwargs
        )

    def _check_loss_takes_level(self, name: str, level: str) -> None:
        """Refuse a turn or trajectory ratio with a loss that cannot take ``level``."""
        if _takes_level(name):
            return
        alias = {v: k for k, v in LOSS_ALIASES.items()}  # the agent-facing names ("grpo")
        others = ", ".join(
            alias.get(n, n) for n in available_policy_losses() if n != "gspo" and _takes_level(n)
        )
        raise ValueError(
            f"`importance_sampling_level={level!r}` pools the ratio per {level}, and "
            f"loss_type={self.loss_type!r} takes no `level` (with `pooling`, `turn_ids`): pass "
            f"importance_sampling_level='token' (or leave it unset), or a loss_type that takes "
            f"one ({others})"
        )

    def kl_term(self) -> bool:
        """Whether the loss has a KL term: ``beta > 0`` and the KL not in the advantages."""
        estimator = resolve_estimator_name(self.advantage_estimator, self.adv_norm)
        in_reward = self.use_kl_advantage_shaping or estimator in TOKEN_ESTIMATORS
        return self.beta > 0 and not in_reward

    def _no_kl_reason(self) -> str:
        if self.beta == 0:
            return "beta=0"
        if self.use_kl_advantage_shaping:
            return "use_kl_advantage_shaping=True puts old - ref into the advantages"
        return f"advantage_estimator={self.advantage_estimator!r} puts old - ref into the reward"

    def clip_fields_read(self) -> frozenset[str]:
        """Which of ``clip_coef`` and ``clip_coef_high`` the objective reads (see LOSS_OPTIONS)."""
        name = resolve_loss_name(self.loss_type)
        pair = isinstance(self.clip_coef, tuple)
        if name == "cispo":  # its eps_low is clip_coef, two-sided only; eps_high: cispo_eps_high
            two_sided = self.cispo_clamp == "two_sided" and not pair
            return frozenset({"clip_coef"} if two_sided else ())
        if name == "gspo":  # a tuple is not read: GSPO's defaults apply
            return frozenset() if pair else frozenset({"clip_coef", "clip_coef_high"})
        params = inspect.signature(get_policy_loss(name)).parameters
        if pair:
            return frozenset({"clip_coef"} if "ratio_bounds" in params else ())
        fixed = "ratio_bounds" in params and params["ratio_bounds"].default is not None
        if fixed:  # bounds fixed by the registration (importance_sampling)
            return frozenset()
        read = {"clip_low": "clip_coef", "clip_high": "clip_coef_high"}
        return frozenset(field for key, field in read.items() if key in params)

    def _ignored_clip_options(self) -> dict[str, str]:
        """The clip bounds the objective does not read (:meth:`clip_fields_read`)."""
        out: dict[str, str] = {}
        name = resolve_loss_name(self.loss_type)
        loss = f"loss_type={self.loss_type!r}"
        read = self.clip_fields_read()
        if self.clip_coef_high is not None and "clip_coef_high" not in read:
            if isinstance(self.clip_coef, tuple):
                why, fix = "a tuple clip_coef is both ratio bounds", "put the upper bound in it"
            elif name == "cispo":
                why, fix = "CISPO's upper clamp is cispo_eps_high", "pass cispo_eps_high"
            else:
                why, fix = f"{loss} takes no upper clip bound", "leave it unset"
            out["clip_coef_high"] = f"`clip_coef_high` has no effect: {why}; {fix}"
        if "clip_coef" not in read and self.clip_coef not in (0.2, None):
            if name == "cispo":
                why = "its lower bound exists only with cispo_clamp='two_sided', a scalar"
            elif name == "gspo":
                why = "GSPO takes scalar bounds (clip_coef, clip_coef_high)"
            else:
                why = "it takes no clip bound of that kind"
            out["clip_coef"] = (
                f"`clip_coef={self.clip_coef!r}` has no effect with {loss}: {why}; leave it "
                "unset, or pass the bound the objective reads"
            )
        if "clip_coef" in read and self.clip_coef is None:
            out["clip_coef"] = (
                f"`clip_coef=None` would clip at 0.2 with {loss}, not turn clipping off (only "
                "LLMREINFORCE's does): pass a number or (lo, hi) bounds, or an objective that "
                "does not clip (loss_type='reinforce')"
            )
        return out

    def ignored_options(self) -> dict[str, str]:
        """:meth:`AgentConfig.ignored_options` plus the GRPO family's options another turns off.

        The objective's clip bounds and CISPO's, turn pooling, Dr. GRPO's length, DAPO's
        threshold, KL shaping and ``adv_norm``.
        """
        out = {**super().ignored_options(), **self._ignored_clip_options()}
        name = resolve_loss_name(self.loss_type)
        level = "sequence" if name == "gspo" else self.importance_sampling_level
        loss = f"loss_type={self.loss_type!r}"
        if name != "cispo":
            for key, default in (("cispo_eps_high", 4.0), ("cispo_clamp", "upper")):
                if getattr(self, key) != default:
                    out[key] = (
                        f"`{key}` is CISPO's and has no effect with {loss}: pass "
                        "loss_type='cispo' (or use CISPO), or leave it unset"
                    )
        if self.turn_ratio_pooling != "mean" and level not in ("turn", "trajectory"):
            out["turn_ratio_pooling"] = (
                f"`turn_ratio_pooling` pools the log-ratio over a turn or trajectory, and the "
                f"ratio here is per {level}: pass importance_sampling_level='turn' or "
                "'trajectory', or leave it unset"
            )
        if self.max_length_norm is not None and self.loss_aggregation != "seq_mean_token_sum_norm":
            out["max_length_norm"] = (
                "`max_length_norm` is the L of loss_aggregation='seq_mean_token_sum_norm' and has "
                f"no effect with loss_aggregation={self.loss_aggregation!r}: pass "
                "loss_aggregation='seq_mean_token_sum_norm', or leave it unset"
            )
        if self.adv_filter_eps != 0.0 and not self.filter_zero_adv:
            out["adv_filter_eps"] = (
                "`adv_filter_eps` is the threshold of filter_zero_adv, which is off: pass "
                "filter_zero_adv=True, or leave adv_filter_eps unset"
            )
        if self.use_kl_advantage_shaping and self.beta == 0:
            out["use_kl_advantage_shaping"] = (
                "`use_kl_advantage_shaping=True` subtracts beta x KL from the advantages, and "
                "beta=0: pass beta > 0, or leave it unset"
            )
        estimator = resolve_estimator_name(self.advantage_estimator, self.adv_norm)
        per_turn = self.advantage_granularity == "turn"
        if per_turn and estimator in WHOLE_SEQUENCE_ESTIMATORS:  # "auto" resolves to trajectory
            per_turn = False
            out["advantage_granularity"] = (
                "`advantage_granularity='turn'` asks for per-turn advantages, and "
                f"advantage_estimator={self.advantage_estimator!r} gives whole-sequence ones "
                "only: leave advantage_granularity unset ('auto': whole-sequence with it), or "
                "pass advantage_estimator='grpo' for per-turn group-relative advantages"
            )
        if self.adv_norm != "mean_std" and self.advantage_estimator != "grpo" and not per_turn:
            out["adv_norm"] = (
                f"`adv_norm={self.adv_norm!r}` picks GRPO's scaling, and "
                f"advantage_estimator={self.advantage_estimator!r} scales its own: pass "
                "advantage_estimator='grpo', or leave adv_norm unset"
            )
        return out


class GRPO(LLMAlgorithm):
    """Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300, eq. 3 and Sec. 4.1.2).

    ``group_size`` completions per prompt; the advantage of each is its reward standardised
    within its group (``adv_norm="mean_std"``) or only centred (``"mean_only"``, Dr. GRPO), or
    the ``advantage_estimator`` registered in rl-advantages; the objective is the
    ``loss_type`` registered in rl-losses:

    * ``"grpo"``: PPO's clipped surrogate (:func:`rl_losses.clipped_surrogate`) with
      ``clip_coef`` (scalar: ``[1 - c, 1 + c]``; tuple: absolute ratio bounds, AgileRL's
      convention) plus ``beta`` times the k3 estimate of KL(pi || ref)
      (:func:`rl_losses.kl_penalty`; AgileRL mixes the two argument orders, we use the paper's).
    * ``"gspo"``: sequence-level ratio (:func:`rl_losses.gspo_loss`, arXiv 2507.18071); with
      ``loss_aggregation="token_mean"`` its GSPO-token form, each sequence weighing by its
      length.
    * ``"cispo"``: clipped IS weight times log-prob (:func:`rl_losses.cispo_loss`,
      arXiv 2506.13585) with the paper's upper-only clamp ``eps_high`` (AgileRL's older
      two-sided ``[1 - c, 1 + c]`` clamp is ``cispo_clamp="two_sided"``).
    * any other registered name, with ``loss_kwargs`` (see docs/tutorials/custom-objective.md).

    The settings are :class:`GRPOConfig`'s fields (constructor keywords).
    """

    algo_name: ClassVar[str] = "grpo"
    config_class: ClassVar[type[AgentConfig]] = GRPOConfig
    forced_loss_type: ClassVar[str | None] = None
    config: GRPOConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        forced = self.forced_loss_type
        if forced is not None:
            if kwargs.get("loss_type", forced) != forced:
                warnings.warn(
                    f"{type(self).__name__} is loss_type={forced!r}; the given "
                    f"loss_type={kwargs['loss_type']!r} is replaced (use GRPO(loss_type=...) "
                    "for another objective)",
                    UserWarning,
                    stacklevel=2,
                )
            kwargs["loss_type"] = forced
        if "clip_coef" not in kwargs:
            for key, value in OBJECTIVE_DEFAULTS.get(kwargs.get("loss_type", "grpo"), {}).items():
                if kwargs.get(key) is None:
                    kwargs[key] = value
        super().__init__(*args, **kwargs)

    def _check(self, batch: Batch) -> None:
        cfg = self.config
        N = batch.num_rows
        if N % cfg.group_size:
            raise ValueError(
                f"group_size={cfg.group_size} does not divide the batch's N={N} rows: pass "
                "group_size completions per prompt"
            )
        needs_turns = cfg.importance_sampling_level == "turn" or (
            cfg.advantage_granularity == "turn" and batch.rewards.dim() == 2
        )
        if needs_turns and batch.turn_ids is None:
            raise ValueError(
                "importance_sampling_level / advantage_granularity 'turn' needs `turn_ids` "
                "([N, L - 1], -1 off actions) in learn()"
            )

    def advantage_settings(self) -> GroupAdvantage:
        """The advantage phase as data (read from the current config)."""
        cfg = self.config
        return GroupAdvantage(
            estimator=resolve_estimator_name(cfg.advantage_estimator, cfg.adv_norm),
            group_size=cfg.group_size,
            kwargs=dict(cfg.advantage_estimator_kwargs),
            scale="group" if cfg.adv_norm == "mean_std" else "none",
            granularity="turn" if cfg.advantage_granularity == "turn" else "trajectory",
            beta=cfg.beta,
            kl_shaping=cfg.use_kl_advantage_shaping,
            whiten=cfg.whiten_advantages,
            clip_range=cfg.adv_clip_range,
            filter_zero=cfg.filter_zero_adv,
            filter_eps=cfg.adv_filter_eps,
        )

    def objective(self, kl_in_reward: bool = False) -> PolicyObjective:
        """The policy loss as data (read from the current config)."""
        cfg = self.config
        name = resolve_loss_name(cfg.loss_type)
        options = LOSS_OPTIONS.get(name, _named_clip_options)(cfg, name)
        aggregation = cfg.loss_aggregation or "seq_mean_token_mean"
        level = None if name == "gspo" else cfg.importance_sampling_level
        return PolicyObjective(
            loss=name,
            options=token_weighted_options(
                name, level, aggregation, {**options, **cfg.loss_kwargs}
            ),
            aggregation=aggregation,
            max_length=cfg.max_length_norm,
            level=level,
            pooling=cfg.turn_ratio_pooling,
            beta=cfg.beta,
            kl_kind=cfg.kl_kind,
            kl_in_loss=not kl_in_reward,
            ratio_metric=True,
        )

    def parts(self, batch: Batch) -> AgentParts:
        """Group-relative advantages (registered estimator) and the registered objective."""
        self._check(batch)
        settings = self.advantage_settings()
        correction = self.correction
        token_baseline = settings.needs_sum_pi_squared

        def estimate(b: Batch, scores: Scores) -> Estimates:
            # the optimal token baseline weighs each path by the correction's rho^2 (verl)
            weights = correction.batch_weights(b, scores) if token_baseline else None
            return group_advantages(settings, b, scores, is_weights=weights)

        return AgentParts(
            estimate=estimate,
            objective=self.objective(kl_in_reward=settings.kl_in_reward),
            needs_old_logprobs=settings.kl_in_reward or token_baseline,
            needs_sum_pi_squared=token_baseline,
        )


class GSPO(GRPO):
    """GRPO with ``loss_type="gspo"``: sequence-level ratio (arXiv 2507.18071)."""

    algo_name: ClassVar[str] = "gspo"
    forced_loss_type: ClassVar[str | None] = "gspo"


class CISPO(GRPO):
    """GRPO with ``loss_type="cispo"``: clipped IS weight x log-prob (arXiv 2506.13585)."""

    algo_name: ClassVar[str] = "cispo"
    forced_loss_type: ClassVar[str | None] = "cispo"
