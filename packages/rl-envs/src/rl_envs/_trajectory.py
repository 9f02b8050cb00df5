"""The token-level episodes: one :class:`Trajectory`, and a padded :class:`TrajectoryBatch`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Trajectory", "TrajectoryBatch"]


@dataclass
class Trajectory:
    """One episode as tokens (``L`` tokens, ``K`` turns taken)."""

    input_ids: torch.Tensor
    """[L] the whole conversation: prompt, actions and environment replies."""
    action_mask: torch.Tensor
    """[L] bool, True on tokens the policy generated."""
    turn_ids: torch.Tensor
    """[L] long, the turn of each generated token; -1 on prompt and environment tokens."""
    turn_rewards: torch.Tensor
    """[K] float, the reward of each turn."""
    terminated: bool
    """The environment ended the episode."""
    truncated: bool
    """Cut short: ``max_turns``, ``max_model_len``, or the environment's own truncation."""
    prompt_length: int
    """Tokens before the first action."""


@dataclass
class TrajectoryBatch:
    """``N`` episodes, right-padded (``N`` rows, ``L`` tokens, ``K = max_turns``)."""

    input_ids: torch.Tensor
    """[N, L] long, padded with ``pad_id``."""
    attention_mask: torch.Tensor
    """[N, L] bool, True on real tokens."""
    action_mask: torch.Tensor
    """[N, L] bool, True on generated tokens."""
    turn_ids: torch.Tensor
    """[N, L] long, -1 off actions."""
    turn_rewards: torch.Tensor
    """[N, K] float, 0 on turns not taken."""
    turn_mask: torch.Tensor
    """[N, K] bool, True on turns taken."""
    group_index: torch.Tensor
    """[N] long, the seed group of each row (rows of a group saw the same task)."""
    terminated: torch.Tensor
    """[N] bool."""
    truncated: torch.Tensor
    """[N] bool."""

    @property
    def returns(self) -> torch.Tensor:
        """[N] undiscounted episode returns."""
        return self.turn_rewards.sum(dim=1)

    @classmethod
    def collate(
        cls,
        trajectories: Sequence[Trajectory],
        pad_id: int,
        max_turns: int,
        group_index: Sequence[int] | None = None,
    ) -> TrajectoryBatch:
        """Pad ``trajectories`` into one batch."""
        if not trajectories:
            raise ValueError("`trajectories` is empty")
        N, L = len(trajectories), max(len(t.input_ids) for t in trajectories)
        batch = cls(
            input_ids=torch.full((N, L), pad_id, dtype=torch.long),
            attention_mask=torch.zeros(N, L, dtype=torch.bool),
            action_mask=torch.zeros(N, L, dtype=torch.bool),
            turn_ids=torch.full((N, L), -1, dtype=torch.long),
            turn_rewards=torch.zeros(N, max_turns, dtype=torch.float32),
            turn_mask=torch.zeros(N, max_turns, dtype=torch.bool),
            group_index=torch.tensor(
                list(range(N)) if group_index is None else list(group_index), dtype=torch.long
            ),
            terminated=torch.tensor([t.terminated for t in trajectories]),
            truncated=torch.tensor([t.truncated for t in trajectories]),
        )
        for r, t in enumerate(trajectories):
            n, k = len(t.input_ids), len(t.turn_rewards)
            batch.input_ids[r, :n] = t.input_ids
            batch.attention_mask[r, :n] = True
            batch.action_mask[r, :n] = t.action_mask
            batch.turn_ids[r, :n] = t.turn_ids
            batch.turn_rewards[r, :k] = t.turn_rewards
            batch.turn_mask[r, :k] = True
        return batch
