"""The typed data of one step: rollout, parsed batch, scores, estimates, micro-batches.

Shapes use one glossary: ``N`` rows (``B`` prompts x ``G`` samples, prompt-major), ``L`` tokens
per row, ``T = L - 1`` predictions (position ``t`` scores token ``t + 1``: every ``[N, T]``
tensor is shifted by one against ``input_ids``), ``K`` turns. Masks are True where a token
counts.

Generation produces a flat :class:`Rollout`, the environment adds its rewards, and ``learn()``
reads it as it is. :func:`as_rollout` is the only place that reads the user's loose input
(AgileRL's tuples, dicts, lists of per-prompt blocks); :class:`ActionResult` shows a rollout
as AgileRL's per-prompt blocks. Everything after :func:`parse_experiences` passes these frozen
dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

__all__ = [
    "ActionResult",
    "Batch",
    "Estimates",
    "MicroBatch",
    "Normalizers",
    "Rollout",
    "Scores",
    "as_rollout",
    "attention_from_mask",
    "first_actions",
    "parse_experiences",
    "stack_rows",
]


@dataclass(frozen=True)
class Rollout:
    """One batch of sampled sequences, flat and prompt-major, with its group structure.

    Rows ``b*G .. b*G + G - 1`` were sampled from prompt ``b``. Generation builds it (rewards
    None), :meth:`with_rewards` adds the environment's scores, and ``learn()`` reads it without
    re-stacking.
    """

    input_ids: torch.Tensor
    """[N, L] long: each row's prompt, then its completion, right-padded with the pad id."""
    mask: torch.Tensor
    """[N, T] bool, shifted by one: True where token t + 1 was sampled and counts."""
    prompt_lengths: torch.Tensor
    """[N] long: the prompt tokens in front of each row (for episodes: up to the first action)."""
    group_size: int
    """G: consecutive rows that share a prompt (1 when every row is its own, or unknown)."""
    sampling_logprobs: torch.Tensor | None = None
    """[N, T] float32, shifted by one: the sampler's log-probs at the actions, 0 elsewhere;
    None when the sampler did not record them."""
    rewards: torch.Tensor | None = None
    """[N] per sequence or [N, K] per turn, float32; None until the environment scored it."""
    turn_ids: torch.Tensor | None = None
    """[N, T] long, shifted by one: the turn of each action token, -1 elsewhere; None for one
    turn."""
    reward_components: torch.Tensor | None = None
    """[N, R] float32: each of the environment's R reward functions' score before the weighted
    sum (NaN where a function returned None); None when it reports only the sum. GDPO reads it."""
    reward_weights: torch.Tensor | None = None
    """[R] float32: the weights of the sum that made ``rewards`` from ``reward_components``."""
    sampling_routes: torch.Tensor | None = None
    """[N, L, Y, k] int16: the sampler's experts of each token in its ``Y`` MoE layers (-1
    where none ran), or None (``router_replay="R3"``)."""

    def __post_init__(self) -> None:
        ids, mask = self.input_ids, self.mask
        if ids.dim() != 2:
            raise ValueError(f"`input_ids` (completion_ids) must be [N, L], got {tuple(ids.shape)}")
        N, L = ids.shape
        if mask.shape != (N, L - 1):
            raise ValueError(
                f"`action_masks` has shape {tuple(mask.shape)} but completion_ids "
                f"{tuple(ids.shape)} needs [N, L - 1] = {(N, L - 1)}: position t marks token t + 1"
            )
        if mask.dtype != torch.bool:
            raise ValueError(f"`mask` (action_masks) must be bool, got {mask.dtype}")
        if self.prompt_lengths.shape != (N,):
            raise ValueError(
                f"`prompt_lengths` has shape {tuple(self.prompt_lengths.shape)}, input_ids "
                f"{tuple(ids.shape)} needs [N] = [{N}]"
            )
        if self.group_size < 1 or N % self.group_size:
            raise ValueError(f"`group_size` {self.group_size} does not divide the {N} rows")
        for name in ("sampling_logprobs", "turn_ids"):
            value = getattr(self, name)
            if value is not None and value.shape != mask.shape:
                raise ValueError(
                    f"`{name}` has shape {tuple(value.shape)}, action_masks {tuple(mask.shape)}"
                )
        if self.rewards is not None and (
            self.rewards.dim() not in (1, 2) or len(self.rewards) != N
        ):
            raise ValueError(
                f"`rewards` has shape {tuple(self.rewards.shape)}; expected [N] = [{N}] or "
                f"per-turn [N, K] = [{N}, K]"
            )

        _check_components(self.reward_components, self.reward_weights, N)
        if (r := self.sampling_routes) is not None and (r.dim() != 4 or r.shape[:2] != ids.shape):
            raise ValueError(f"`sampling_routes` {tuple(r.shape)} must be [N, L, Y, k]")

    @property
    def num_rows(self) -> int:
        """``N``."""
        return int(self.input_ids.shape[0])

    @property
    def group_index(self) -> torch.Tensor:
        """[N] long: the prompt (group) of each row, ``n // G``."""
        return torch.arange(self.num_rows, device=self.input_ids.device) // self.group_size

    def with_rewards(self, rewards: Any, components: Any = None, weights: Any = None) -> Rollout:
        """This rollout scored: ``rewards`` [N], [B, G] (flattened prompt-major) or [N, K].

        ``components`` ([N, R] or [B, G, R], prompt-major) and ``weights`` ([R]): the reward
        functions' scores before their weighted sum, when the environment reports them.
        """
        device = self.input_ids.device
        r = _rewards(rewards, self.num_rows, device)
        if components is None:
            return replace(self, rewards=r)
        comps = torch.as_tensor(components, dtype=torch.float32, device=device)
        comps = comps.reshape(self.num_rows, -1) if comps.dim() == 3 else comps
        w = None if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        return replace(self, rewards=r, reward_components=comps, reward_weights=w)

    def blocks(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None]:
        """AgileRL's per-prompt layout, as views: B x [G, L_b] ids, [G, L_b - 1] masks, log-probs.

        ``L_b`` is prompt ``b``'s length plus the completion width ``L - max(prompt_lengths)``.
        """
        G, L = self.group_size, self.input_ids.shape[1]
        width = L - int(self.prompt_lengths.max())
        ends = [int(p) + width for p in self.prompt_lengths[::G].tolist()]
        rows = [slice(b * G, (b + 1) * G) for b in range(len(ends))]
        ids = [self.input_ids[r, :e] for r, e in zip(rows, ends, strict=True)]
        masks = [self.mask[r, : e - 1] for r, e in zip(rows, ends, strict=True)]
        logps = self.sampling_logprobs
        lp = None if logps is None else [logps[r, : e - 1] for r, e in zip(rows, ends, strict=True)]
        return ids, masks, lp

    def to_batch(self, pad_token_id: int, device: torch.device | str = "cpu") -> Batch:
        """The :class:`Batch` ``learn()`` runs on (moved to ``device``, attention added).

        Raises:
            ValueError: no rewards yet, no action at all, NaN or inf rewards.
        """
        if self.rewards is None:
            raise ValueError(
                "the rollout has no rewards: score it first (rollout.with_rewards(rewards))"
            )
        ids = self.input_ids.to(device)
        mask = self.mask.to(device)
        if not bool(mask.any()):
            raise ValueError("`action_masks` has no True entry: there is nothing to learn from")
        r = _rewards(self.rewards, self.num_rows, ids.device)
        tids = None
        if self.turn_ids is not None:
            tids = self.turn_ids.to(ids.device, torch.long).masked_fill(~mask, -1)
        samp = self.sampling_logprobs
        samp = None if samp is None else samp.to(mask.device, torch.float32)
        attention = attention_from_mask(ids, mask, pad_token_id)
        comps = self.reward_components
        comps = None if comps is None else comps.to(ids.device, torch.float32)
        weights = self.reward_weights
        weights = None if weights is None else weights.to(ids.device, torch.float32)
        routes = None if self.sampling_routes is None else self.sampling_routes.to(ids.device)
        return Batch(ids, attention, mask, r, tids, samp, comps, weights, routes)


@dataclass(frozen=True)
class ActionResult:
    """What ``get_action`` returns: the :class:`Rollout` (no rewards yet) and engine details.

    It also reads as AgileRL's ``(completion_ids, action_masks)`` tuple of per-prompt blocks
    (views of the rollout's tensors): ``completion_ids, action_masks = agent.get_action(...)``.
    """

    rollout: Rollout
    """The samples, flat [N, L] (see :class:`Rollout`)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine details (finish reasons, texts)."""

    @property
    def completion_ids(self) -> list[torch.Tensor]:
        """Per prompt, [G, L_b]: prompt and completion, right-padded with the pad id."""
        return self.rollout.blocks()[0]

    @property
    def action_masks(self) -> list[torch.Tensor]:
        """Per prompt, [G, L_b - 1] bool, shifted by one: True where token t + 1 was sampled."""
        return self.rollout.blocks()[1]

    @property
    def sampling_logprobs(self) -> list[torch.Tensor] | None:
        """Per prompt, [G, L_b - 1] the sampler's log-probs aligned with the mask, or None."""
        return self.rollout.blocks()[2]

    def __iter__(self):  # type: ignore[no-untyped-def]
        """``completion_ids, action_masks = agent.get_action(prompts)`` (AgileRL's tuple)."""
        return iter(self.rollout.blocks()[:2])

    def __len__(self) -> int:
        """2: the length of AgileRL's ``(completion_ids, action_masks)`` tuple."""
        return 2

    def __getitem__(self, index: int | slice) -> Any:
        """``result[0]`` is ``completion_ids``, ``result[1]`` ``action_masks`` (AgileRL's tuple).

        ``agent.learn(result.rollout.with_rewards(rewards))`` learns from the flat rollout,
        sampling log-probs included.
        """
        return self.rollout.blocks()[:2][index]


@dataclass(frozen=True)
class Batch:
    """A parsed ``learn()`` batch."""

    input_ids: torch.Tensor
    """[N, L] long, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """[N, L] long, 1 up to each row's last real token."""
    mask: torch.Tensor
    """[N, T] bool, shifted by one: True where token t + 1 is an action that counts."""
    rewards: torch.Tensor
    """[N] per sequence, or [N, K] per turn, float32."""
    turn_ids: torch.Tensor | None
    """[N, T] long turn index of each action token, -1 off actions; None for one turn."""
    sampling_logprobs: torch.Tensor | None
    """[N, T] the sampler's log-probs at action positions (0 elsewhere), or None."""
    reward_components: torch.Tensor | None = None
    """[N, R] float32 scores of the R reward functions before their weighted sum, or None."""
    reward_weights: torch.Tensor | None = None
    """[R] float32 weights of that sum, or None."""
    sampling_routes: torch.Tensor | None = None
    """[N, L, Y, k] the sampler's routes (see :attr:`Rollout.sampling_routes`), or None."""

    @property
    def num_rows(self) -> int:
        """``N``."""
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class Scores:
    """Log-probs of the batch's actions before the update (no gradient)."""

    old_logprobs: torch.Tensor | None
    """[N, T] under the policy that is being updated, 0 off the mask; None when the update
    is on-policy (one optimizer step on this batch, nothing before it reads them): the loss
    then uses its own log-probs, detached (ratio 1), and the scoring forward is skipped."""
    ref_logprobs: torch.Tensor | None
    """[N, T] under the frozen reference, or None (no KL term, or no reference)."""
    sum_pi_squared: torch.Tensor | None = None
    """[N, T] ``sum_v pi(v)^2`` of the actor's distribution at each action position
    (shifted by one, 0 off the mask), from the forward that scores the old log-probs; None
    unless the estimator reads it (``AgentParts.needs_sum_pi_squared``)."""
    routes: torch.Tensor | None = None
    """[N, L, Y, k] int16: the routes the update replays (:mod:`rl_algos.router_replay`; R2:
    the old forward's, R3: the sampler's; -1 off the attention mask), or None."""

    def old(self) -> torch.Tensor:
        """:attr:`old_logprobs`, which must have been scored."""
        if self.old_logprobs is None:
            raise ValueError(
                "old log-probs were not scored (an on-policy learn() skips them): declare "
                "AgentParts(needs_old_logprobs=True) for an estimate that reads them"
            )
        return self.old_logprobs


@dataclass(frozen=True)
class Estimates:
    """What the advantage phase (and the correction phase) computed for every row."""

    advantages: torch.Tensor | None = None
    """[N, T] per-token advantages, 0 off the mask (None: a value-based agent, ILQL)."""
    keep: torch.Tensor | None = None
    """[N] bool rows that stay in the loss (DAPO's dynamic sampling), or None for all."""
    turn_ids: torch.Tensor | None = None
    """[N, T] turn layout used by turn-level ratios and values (overrides the batch's)."""
    returns: torch.Tensor | None = None
    """[N, K] value targets (PPO)."""
    old_values: torch.Tensor | None = None
    """[N, K] the critic's values before the update (PPO)."""
    turn_mask: torch.Tensor | None = None
    """[N, K] bool turns that exist (PPO's value loss)."""
    token_rewards: torch.Tensor | None = None
    """[N, T] per-token rewards (ILQL)."""
    is_weights: torch.Tensor | None = None
    """[N, T] rollout-mismatch weights (:func:`rl_losses.rollout_correction`), or None."""


@dataclass(frozen=True)
class Normalizers:
    """Global denominators of one minibatch, summed over processes (micro-batches stay exact)."""

    tokens: float
    """Counting action tokens (``token_mean``)."""
    sequences: float
    """Counting rows with at least one action (the ``seq_mean_*`` modes)."""
    turns: float = 1.0
    """Counting existing turns (PPO's value loss)."""
    empty: bool = False
    """No action token in the minibatch on any process (every row filtered out, DAPO's dynamic
    sampling): nothing carries a gradient, and :meth:`rl_algos.Learner.step` takes no step."""


@dataclass(frozen=True)
class MicroBatch:
    """Rows ``rows`` of a :class:`Batch` with their scores and estimates: one forward/backward."""

    rows: torch.Tensor
    """[M] long indices into the batch."""
    input_ids: torch.Tensor
    """[M, L]."""
    attention_mask: torch.Tensor
    """[M, L]."""
    mask: torch.Tensor
    """[M, T] bool, shifted by one; rows dropped by ``Estimates.keep`` are all False."""
    old_logprobs: torch.Tensor | None
    """[M, T]; None on-policy (see :attr:`Scores.old_logprobs`) or without a scoring phase
    (ILQL)."""
    ref_logprobs: torch.Tensor | None
    """[M, T] or None."""
    advantages: torch.Tensor | None
    """[M, T], or None (ILQL)."""
    turn_ids: torch.Tensor | None
    """[M, T] or None."""
    is_weights: torch.Tensor | None
    """[M, T] or None."""
    sampling_logprobs: torch.Tensor | None
    """[M, T] the sampler's log-probs (see :attr:`Batch.sampling_logprobs`), or None."""
    returns: torch.Tensor | None
    """[M, K] or None."""
    old_values: torch.Tensor | None
    """[M, K] or None."""
    turn_mask: torch.Tensor | None
    """[M, K] or None."""
    token_rewards: torch.Tensor | None
    """[M, T] or None."""
    routes: torch.Tensor | None = None
    """[M, L, Y, k] the routes the update replays (:attr:`Scores.routes`), or None."""

    @property
    def targets(self) -> torch.Tensor:
        """[M, T] the predicted tokens, ``input_ids[:, 1:]``."""
        return self.input_ids[:, 1:]

    @classmethod
    def select(
        cls, batch: Batch, scores: Scores | None, estimates: Estimates, rows: torch.Tensor
    ) -> MicroBatch:
        """The micro-batch of ``rows`` [M] (``scores`` None: no scoring phase, ILQL)."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows]

        mask = batch.mask[rows]
        if estimates.keep is not None:
            mask = mask & estimates.keep[rows][:, None]
        turn_ids = estimates.turn_ids if estimates.turn_ids is not None else batch.turn_ids
        return cls(
            rows=rows,
            input_ids=batch.input_ids[rows],
            attention_mask=batch.attention_mask[rows],
            mask=mask,
            old_logprobs=None if scores is None else pick(scores.old_logprobs),
            ref_logprobs=None if scores is None else pick(scores.ref_logprobs),
            advantages=pick(estimates.advantages),
            turn_ids=pick(turn_ids),
            is_weights=pick(estimates.is_weights),
            sampling_logprobs=pick(batch.sampling_logprobs),
            returns=pick(estimates.returns),
            old_values=pick(estimates.old_values),
            turn_mask=pick(estimates.turn_mask),
            token_rewards=pick(estimates.token_rewards),
            routes=None if scores is None else pick(scores.routes),
        )


def _check_components(
    components: torch.Tensor | None, weights: torch.Tensor | None, N: int
) -> None:
    """Raise unless ``components`` is [N, R] and ``weights`` [R] (or both are None)."""
    if components is None:
        if weights is not None:
            raise ValueError("`reward_weights` without `reward_components`: pass both or neither")
        return
    if components.dim() != 2 or len(components) != N or components.shape[1] == 0:
        raise ValueError(
            f"`reward_components` has shape {tuple(components.shape)}; expected [N, R] = "
            f"[{N}, R] with R >= 1"
        )
    R = components.shape[1]
    if weights is None or tuple(weights.shape) != (R,):
        shape = None if weights is None else tuple(weights.shape)
        raise ValueError(f"`reward_weights` has shape {shape}; expected [R] = [{R}]")


def stack_rows(name: str, parts: Any, pad: float | bool, dtype: torch.dtype) -> torch.Tensor:
    """[N, W]: an [N, W] tensor, or a list of [G, W_i] / [W_i] blocks right-padded with ``pad``."""
    if isinstance(parts, torch.Tensor):
        if parts.dim() != 2:
            raise ValueError(
                f"`{name}` must be [N, L] (or a list of [G, L] tensors), got {tuple(parts.shape)}"
            )
        return parts.to(dtype)
    tensors = [torch.as_tensor(p) for p in parts]
    tensors = [p if p.dim() == 2 else p[None] for p in tensors]
    if not tensors:
        raise ValueError(f"`{name}` is empty: the batch has no rows")
    width = max(t.shape[1] for t in tensors)
    return torch.cat(
        [
            torch.nn.functional.pad(t.to(dtype), (0, width - t.shape[1]), value=pad)
            if t.shape[1] < width
            else t.to(dtype)
            for t in tensors
        ]
    )


def attention_from_mask(input_ids: torch.Tensor, mask: torch.Tensor, pad_id: int) -> torch.Tensor:
    """[N, L] long attention: 1 up to each row's last real token (non-pad or action).

    Args:
        input_ids: [N, L] right-padded ids.
        mask: [N, T] action mask, shifted by one (an action may be the pad id, e.g. EOS = pad).
        pad_id: The pad id.
    """
    L = input_ids.shape[1]
    real = input_ids != pad_id
    real[:, 1:] |= mask
    positions = torch.arange(L, device=input_ids.device)
    last = torch.where(real, positions, torch.zeros_like(input_ids)).amax(1)
    return (positions[None] <= last[:, None]).long()


def _sampling_logprobs(value: Any, mask: torch.Tensor) -> torch.Tensor | None:
    """[N, T] sampler log-probs from a tensor, per-prompt blocks, or per-row action lists."""
    if isinstance(value, torch.Tensor) and value.shape == mask.shape:
        return value.to(mask.device, torch.float32)
    if not isinstance(value, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.dim() == 2 for v in value
    ):  # get_action's per-prompt [G, L - 1] blocks
        stacked = stack_rows("sampling_logps", value, 0.0, torch.float32).to(mask.device)
        if stacked.shape != mask.shape:
            raise ValueError(
                f"`sampling_logps` stacks to {tuple(stacked.shape)}, action_masks are "
                f"{tuple(mask.shape)}"
            )
        return stacked
    rows = list(value)
    if len(rows) != mask.shape[0]:
        raise ValueError(f"`sampling_logps` has {len(rows)} rows for {mask.shape[0]} sequences")
    if any(r is None for r in rows):
        return None
    out = torch.zeros(mask.shape, device=mask.device)
    for n, row in enumerate(rows):
        r = torch.as_tensor(row, dtype=torch.float32).reshape(-1)
        k = int(mask[n].sum())
        if r.numel() == mask.shape[1]:
            out[n] = r.to(out.device)
        elif r.numel() == k:
            out[n][mask[n]] = r.to(out.device)
        else:
            raise ValueError(f"`sampling_logps`[{n}] has {r.numel()} values for {k} action tokens")
    return out


def _rewards(rewards: Any, N: int, device: torch.device) -> torch.Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float32).to(device)
    if r.dim() == 2 and r.shape[0] * r.shape[1] == N and r.shape[0] != N:
        r = r.reshape(N)
    if r.dim() not in (1, 2) or r.shape[0] != N:
        raise ValueError(
            f"`rewards` has shape {tuple(r.shape)}; expected [N] = [{N}], [B, G] with "
            f"B*G = {N}, or per-turn [N, K] = [{N}, K]"
        )
    if not bool(torch.isfinite(r).all()):
        raise ValueError("`rewards` contains NaN or inf: fix the reward function")
    return r


def unpack_experiences(experiences: Any) -> tuple[Any, Any, Any]:
    """``(completion_ids, action_masks, rewards)`` from a 3-tuple/list, a dict or a Rollout."""
    if isinstance(experiences, Rollout):
        return experiences.input_ids, experiences.mask, experiences.rewards
    if isinstance(experiences, dict):
        keys = ("completion_ids", "action_masks", "rewards")
        missing = [k for k in keys if k not in experiences]
        if missing:
            raise ValueError(
                f"`experiences` lacks {missing}: pass completion_ids [N, L], action_masks "
                "[N, L - 1] and rewards"
            )
        return experiences["completion_ids"], experiences["action_masks"], experiences["rewards"]
    if not isinstance(experiences, tuple | list) or len(experiences) != 3:
        raise ValueError("`experiences` must be (completion_ids, action_masks, rewards)")
    comp, masks, rewards = experiences
    return comp, masks, rewards


def first_actions(mask: torch.Tensor) -> torch.Tensor:
    """[N] long: one past each row's first action position (the prompt before it); L if none."""
    first = mask.int().argmax(1) + 1
    return torch.where(mask.any(1), first, torch.full_like(first, mask.shape[1] + 1))


def _group_size(comp: Any, rewards: Any, N: int) -> int:
    """G from per-prompt blocks of equal height, else from [B, G] rewards, else 1."""
    if not isinstance(comp, torch.Tensor):
        heights = {
            torch.as_tensor(c).shape[0] if torch.as_tensor(c).dim() == 2 else 1 for c in comp
        }
        if len(heights) == 1:
            return heights.pop()
    shape = tuple(torch.as_tensor(rewards).shape)
    if len(shape) == 2 and shape[0] * shape[1] == N and shape[0] != N:
        return int(shape[1])
    return 1


def as_rollout(
    experiences: Any,
    *,
    pad_token_id: int,
    turn_ids: Any = None,
    sampling_logps: Any = None,
) -> Rollout:
    """The scored :class:`Rollout` of ``learn()``'s input: a rollout as it is, or loose input.

    Args:
        experiences: A :class:`Rollout` with rewards, or ``(completion_ids, action_masks,
            rewards)`` (or a dict with those keys): ids [N, L] or per-prompt [G, L_b] blocks,
            masks [N, L - 1] (or blocks), rewards [N], [B, G] or per-turn [N, K].
        pad_token_id: The right-padding id of stacked blocks.
        turn_ids: [N, L - 1] turn index per action token (-1 elsewhere), or None.
        sampling_logps: The sampler's log-probs: [N, L - 1], ``get_action``'s per-prompt
            blocks, or per row the action tokens' values; None when unknown.

    Raises:
        ValueError: Shapes that disagree (both shapes are named), NaN or inf rewards, a
            rollout passed with separate ``turn_ids`` or ``sampling_logps``.
    """
    if isinstance(experiences, Rollout):
        if turn_ids is not None or sampling_logps is not None:
            raise ValueError(
                "a Rollout carries its own turn_ids and sampling_logprobs: pass it alone"
            )
        return experiences
    comp, masks, rewards = unpack_experiences(experiences)
    ids = stack_rows("completion_ids", comp, pad_token_id, torch.long)
    mask = stack_rows("action_masks", masks, False, torch.bool).to(ids.device)
    N, L = ids.shape
    if mask.shape != (N, L - 1):
        raise ValueError(
            f"`action_masks` has shape {tuple(mask.shape)} but completion_ids "
            f"{tuple(ids.shape)} needs [N, L - 1] = {(N, L - 1)}: position t marks token t + 1"
        )
    r = _rewards(rewards, N, ids.device)
    tids = None
    if turn_ids is not None:
        tids = torch.as_tensor(turn_ids, dtype=torch.long).to(ids.device)
        if tids.shape != mask.shape:
            raise ValueError(
                f"`turn_ids` has shape {tuple(tids.shape)}, action_masks {tuple(mask.shape)}"
            )
    samp = None if sampling_logps is None else _sampling_logprobs(sampling_logps, mask)
    return Rollout(ids, mask, first_actions(mask), _group_size(comp, rewards, N), samp, r, tids)


def parse_experiences(
    experiences: Any,
    *,
    pad_token_id: int,
    device: torch.device | str = "cpu",
    turn_ids: Any = None,
    sampling_logps: Any = None,
) -> Batch:
    """The :class:`Batch` of ``learn()``'s input (:func:`as_rollout`, then ``to_batch``).

    Raises:
        ValueError: Shapes that disagree (both shapes are named), no action at all, NaN or
            inf rewards.
    """
    rollout = as_rollout(
        experiences, pad_token_id=pad_token_id, turn_ids=turn_ids, sampling_logps=sampling_logps
    )
    return rollout.to_batch(pad_token_id, device)
