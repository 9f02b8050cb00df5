"""Advantage estimation of the agents, resolved by name through :func:`rl_advantages.get_estimator`.

Three estimation shapes cover the agents:

* :func:`group_advantages` (the GRPO family): a registered *sequence estimator* turns [N]
  rewards into advantages, then the family's post-processing (KL shaping, whitening, clipping,
  DAPO's row filter). Its calling convention: ``fn(rewards [N], group_size, **kwargs) -> [N]
  or [N, T]`` (a tensor, or a result with ``.advantages``); the estimators in
  :data:`TOKEN_ESTIMATORS` are called ``fn(rewards [N], mask [N, T], group_size, kl=, beta=,
  **kwargs)`` instead, and those in :data:`SUM_PI_SQUARED_ESTIMATORS` (verl's optimal token
  baseline) ``fn(token_rewards [N, T], mask [N, T], old_logprobs [N, T], sum_pi_squared
  [N, T], group_size, is_weights=, **kwargs)``. A user estimator registered with
  ``@rl_advantages.register_estimator("name")`` is used by ``GRPO(advantage_estimator="name")``.
* :func:`rebn_advantages` (REINFORCE): discounted turn returns, then ``get_estimator("rebn")``.
* :func:`gae_advantages` (PPO): ``get_estimator("gae")`` over turns with the critic's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from rl_advantages import (
    broadcast_to_tokens,
    discounted_returns,
    get_estimator,
    kl_in_reward,
    pool_to_turns,
    whiten,
)

from rl_algos.batch import Batch, Estimates, Scores

__all__ = [
    "COMPONENT_ESTIMATORS",
    "ESTIMATOR_ALIASES",
    "NOT_FOR_AGENTS",
    "SUM_PI_SQUARED_ESTIMATORS",
    "TOKEN_ESTIMATORS",
    "WHOLE_SEQUENCE_ESTIMATORS",
    "GroupAdvantage",
    "gae_advantages",
    "group_advantages",
    "rebn_advantages",
    "resolve_estimator_name",
    "turn_layout",
    "turn_values",
]

#: Agent-facing estimator names -> registry names (``adv_norm`` picks GRPO's scale).
ESTIMATOR_ALIASES: Mapping[str, str] = {"reinforce_pp_baseline": "reinforce_plus_plus_baseline"}
#: Registered estimators that need token-level inputs (the mask and the per-token KL).
TOKEN_ESTIMATORS: frozenset[str] = frozenset({"reinforce_plus_plus_baseline"})
#: Registered estimators that read the behaviour policy's token statistics: per-token rewards
#: (each row's reward at its last action token), the old log-probs, ``sum_v pi(v)^2`` at every
#: action token (``Scores.sum_pi_squared``, scored in the same forward as the old log-probs)
#: and the rollout correction's weights when the agent applies one.
SUM_PI_SQUARED_ESTIMATORS: frozenset[str] = frozenset({"optimal_token_baseline"})
#: Registered estimators without a per-turn form: ``advantage_granularity="turn"`` is refused
#: with them, and ``"auto"`` gives their whole-sequence advantages.
WHOLE_SEQUENCE_ESTIMATORS: frozenset[str] = TOKEN_ESTIMATORS | SUM_PI_SQUARED_ESTIMATORS
#: Registered estimators whose inputs an agent's batch does not carry: refused by name when
#: the agent is built (call them from rl_advantages directly). None today.
NOT_FOR_AGENTS: Mapping[str, str] = {}


def resolve_estimator_name(advantage_estimator: str, adv_norm: str = "mean_std") -> str:
    """The registry name of an agent's ``advantage_estimator`` / ``adv_norm`` pair, checked.

    ``"grpo"`` is ``get_estimator("grpo")`` (std-scaled) with ``adv_norm="mean_std"`` and
    ``get_estimator("dr_grpo")`` with ``"mean_only"``.

    Raises:
        ValueError: Not registered (the message lists the registered estimators), or one of
            :data:`NOT_FOR_AGENTS` (the message says why and what to call instead).
    """
    name = ESTIMATOR_ALIASES.get(advantage_estimator, advantage_estimator)
    if name in NOT_FOR_AGENTS:
        raise ValueError(
            f"`advantage_estimator` {advantage_estimator!r} cannot be an agent's estimator: "
            f"{NOT_FOR_AGENTS[name]}"
        )
    if name == "grpo" and adv_norm == "mean_only":
        name = "dr_grpo"
    try:
        get_estimator(name)
    except KeyError as exc:
        raise ValueError(
            f"`advantage_estimator` {advantage_estimator!r} is not a registered estimator "
            f"({exc.args[0]}); register yours with @rl_advantages.register_estimator"
        ) from None
    return name


@dataclass(frozen=True)
class GroupAdvantage:
    """The GRPO family's advantage settings."""

    estimator: str
    """Registry name of the sequence estimator (:func:`resolve_estimator_name`)."""
    group_size: int
    """``G`` samples per prompt; rows are prompt-major (``N = B * G``)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the estimator (``advantage_estimator_kwargs``)."""
    scale: Literal["group", "none"] = "group"
    """Per-turn group scaling (``adv_norm``: ``"mean_std"`` -> ``"group"``)."""
    granularity: Literal["trajectory", "turn"] = "trajectory"
    """``"turn"``: per-turn group-relative advantages for [N, K] rewards."""
    beta: float = 0.0
    """KL coefficient (KL shaping and REINFORCE++'s KL-in-reward)."""
    kl_shaping: bool = False
    """Subtract ``beta * (old - ref)`` per token (``use_kl_advantage_shaping``)."""
    whiten: bool = False
    """Whiten over the batch's action tokens."""
    clip_range: float | None = None
    """Clamp advantages to ``[-c, c]``."""
    filter_zero: bool = False
    """Drop rows whose advantage is all below ``filter_eps`` (DAPO's dynamic sampling)."""
    filter_eps: float = 0.0
    """The threshold of ``filter_zero``."""

    @property
    def needs_sum_pi_squared(self) -> bool:
        """Whether the estimator reads ``Scores.sum_pi_squared`` (and the old log-probs)."""
        return self.estimator in SUM_PI_SQUARED_ESTIMATORS

    @property
    def kl_in_reward(self) -> bool:
        """Whether the KL penalty is already in the advantages (no KL loss term then)."""
        return self.kl_shaping or self.estimator in TOKEN_ESTIMATORS


#: Registered estimators that read each reward function's score (``Batch.reward_components``
#: [N, R] and ``reward_weights`` [R]) instead of their sum.
COMPONENT_ESTIMATORS: frozenset[str] = frozenset({"gdpo"})


def _token_baseline(
    cfg: GroupAdvantage,
    seq: torch.Tensor,
    batch: Batch,
    scores: Scores,
    is_weights: torch.Tensor | None,
) -> Any:
    if scores.sum_pi_squared is None:
        raise ValueError(
            f"`advantage_estimator` {cfg.estimator!r} reads `Scores.sum_pi_squared` [N, T], which "
            "was not scored: declare AgentParts(needs_sum_pi_squared=True) for this estimate"
        )
    fn = get_estimator(cfg.estimator)
    rewards = kl_in_reward(seq, batch.mask)  # each row's reward at its last action token
    return fn(
        rewards,
        batch.mask,
        scores.old(),
        scores.sum_pi_squared,
        cfg.group_size,
        is_weights=is_weights,
        **cfg.kwargs,
    )


def _sequence(
    cfg: GroupAdvantage,
    seq: torch.Tensor,
    batch: Batch,
    scores: Scores,
    is_weights: torch.Tensor | None = None,
) -> Any:
    if cfg.estimator in SUM_PI_SQUARED_ESTIMATORS:
        return _token_baseline(cfg, seq, batch, scores, is_weights)
    fn = get_estimator(cfg.estimator)
    if cfg.estimator in COMPONENT_ESTIMATORS:
        if batch.reward_components is None:
            raise ValueError(
                f"`advantage_estimator` {cfg.estimator!r} normalises each reward function's "
                "score on its own, and this batch carries only their sum: score it with an "
                "environment that reports them (rl_envs.ReasoningGym with several reward "
                "functions), or pass Rollout.with_rewards(rewards, components=[N, R], "
                "weights=[R])"
            )
        kwargs = {"weights": batch.reward_weights, **cfg.kwargs}
        return fn(batch.reward_components, cfg.group_size, **kwargs)
    if cfg.estimator in TOKEN_ESTIMATORS:
        ref = scores.ref_logprobs
        kl = None if ref is None else scores.old() - ref
        return fn(seq, batch.mask, cfg.group_size, kl=kl, beta=cfg.beta, **cfg.kwargs)
    return fn(seq, cfg.group_size, **cfg.kwargs)


def _as_tokens(value: Any, like: torch.Tensor, name: str) -> torch.Tensor:
    """``value``'s advantages shaped like ``like`` ([N] stays [N]; [N] -> [N, T] broadcast)."""
    adv = getattr(value, "advantages", value)
    if not isinstance(adv, torch.Tensor):
        raise TypeError(f"estimator {name!r} returned {type(value).__name__}, not a tensor")
    if adv.shape == like.shape:
        return adv
    if adv.shape == like.shape[:1]:
        return adv[:, None].expand_as(like)
    if adv.shape != like.shape:
        raise ValueError(
            f"estimator {name!r} returned advantages of shape {tuple(adv.shape)}; expected "
            f"[N] = {tuple(like.shape[:1])} or [N, T] = {tuple(like.shape)}"
        )
    return adv


def group_advantages(
    cfg: GroupAdvantage, batch: Batch, scores: Scores, is_weights: torch.Tensor | None = None
) -> Estimates:
    """[N, T] advantages of the GRPO family (see the module docstring), and the kept rows.

    ``is_weights`` [N, T]: the rollout correction's weights, for the estimators of
    :data:`SUM_PI_SQUARED_ESTIMATORS` (the others ignore them; the loss applies them).
    """
    r, mask, ref = batch.rewards, batch.mask, scores.ref_logprobs
    seq = r.sum(-1) if r.dim() == 2 else r
    if (
        cfg.granularity == "turn"
        and r.dim() == 2
        and batch.turn_ids is not None
        and cfg.estimator not in WHOLE_SEQUENCE_ESTIMATORS
    ):
        turn_mask = pool_to_turns(mask.float(), batch.turn_ids, num_turns=r.shape[1]).mask
        fallback = _as_tokens(_sequence(cfg, seq, batch, scores), seq, cfg.estimator)
        per_turn = get_estimator("group_relative_per_turn")(
            r, turn_mask, cfg.group_size, scale=cfg.scale, fallback=fallback
        )
        adv = broadcast_to_tokens(per_turn, batch.turn_ids)
    else:
        adv = _as_tokens(_sequence(cfg, seq, batch, scores, is_weights), mask, cfg.estimator)
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    if cfg.kl_shaping and ref is not None:
        adv = adv - cfg.beta * (scores.old() - ref)
    if cfg.whiten:
        adv = whiten(adv, mask)
    if cfg.clip_range is not None:
        adv = adv.clamp(-cfg.clip_range, cfg.clip_range)
    keep = (adv.abs() * mask).amax(1) > cfg.filter_eps if cfg.filter_zero else None
    return Estimates(advantages=adv, keep=keep)


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


def rebn_advantages(batch: Batch, gamma: float) -> Estimates:
    r"""REINFORCE's advantages: :math:`G_k = \sum_{j \ge k} \gamma^{j-k} r_j` per turn,
    normalised over every (sequence, turn) of the batch (ReBN), spread over the turn's tokens.
    """  # noqa: D205
    turn_ids, turn_mask, r = turn_layout(batch)
    returns = discounted_returns(r, turn_mask, gamma)
    adv = broadcast_to_tokens(get_estimator("rebn")(returns, turn_mask), turn_ids)
    return Estimates(advantages=adv, turn_ids=turn_ids)


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


def gae_advantages(
    batch: Batch,
    old_values: torch.Tensor,
    turn_ids: torch.Tensor,
    turn_mask: torch.Tensor,
    rewards: torch.Tensor,
    gamma: float,
    lmbda: float,
    whiten_advantages: bool,
) -> Estimates:
    """PPO's advantages and returns: GAE over turns (arXiv 1506.02438) spread over tokens.

    Args:
        batch: The parsed batch (its mask whitens over every action token, as TRL and verl do).
        old_values: [N, K] the critic's turn values before the update.
        turn_ids: [N, T] turn layout (:func:`turn_layout`).
        turn_mask: [N, K] existing turns.
        rewards: [N, K] per-turn rewards.
        gamma: Discount.
        lmbda: GAE's lambda.
        whiten_advantages: Whiten over the batch's action tokens.
    """
    est = get_estimator("gae")(rewards, old_values, turn_mask, gamma, lmbda)
    adv = broadcast_to_tokens(est.advantages, turn_ids)
    if whiten_advantages:
        adv = whiten(adv, batch.mask)
    return Estimates(
        advantages=adv,
        turn_ids=turn_ids,
        returns=est.returns,
        old_values=old_values,
        turn_mask=turn_mask,
    )
