"""One step of experience: act, step the environment, learn.

:func:`collect` is the acting half for prompts (``get_action``, then the environment scores the
samples) and :meth:`rl_train.sources.MultiTurnSource.rollout` the one for multi-turn episodes;
both return an :class:`Experience` around one flat :class:`rl_algos.Rollout`. :func:`learn_from`
is the learning half. The synchronous sources run both in turn; the asynchronous loop runs the
first in its rollout worker and the second in the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from rl_algos.batch import Rollout

__all__ = ["Experience", "StepOutput", "collect", "learn_from"]


@dataclass(frozen=True)
class Experience:
    """One scored batch on its way to ``learn()``."""

    rollout: Rollout
    """The samples with their rewards: [N] per sequence, or [N, K] per turn with turn ids."""
    rewards: torch.Tensor
    """What the step reports: the environment's rewards [B, G], or the episodes' returns [N]."""
    num_epochs: int | None
    """Completed passes over the prompts after this batch: the reference policy follows it and
    the batch's mean reward is appended to ``agent.scores``; None for episodes (neither)."""


@dataclass
class StepOutput:
    """What one agent's step produced."""

    metrics: dict[str, float]
    """``agent.learn``'s metrics."""
    rewards: torch.Tensor | None
    """The rewards (or episode returns) learned from; None for offline data."""


def collect(agent: Any, env: Any, prompts: Any) -> tuple[Experience, Any]:
    """``get_action`` on ``prompts``, scored by ``env.step``; the experience and the next prompts.

    Args:
        agent: An rl-algos agent.
        env: A :class:`rl_envs.ReasoningGym` (or anything with its ``step`` and
            ``num_epochs``); it reads the samples as AgileRL's per-prompt blocks (views).
        prompts: The batch of prompt dicts ``env`` handed out last.
    """
    result = agent.get_action(prompts)
    prompts, rewards = env.step(result.completion_ids)
    components, weights = reward_components(env)
    rollout = result.rollout.with_rewards(rewards, components, weights)
    return Experience(rollout, rewards, int(env.num_epochs)), prompts


def reward_components(env: Any) -> tuple[Any, Any]:
    """``([B, G, R], [R])``: each reward function's scores of the last step and their weights.

    ``(None, None)`` when ``env`` reports only their sum (no ``last_reward_components``).
    """
    parts = getattr(env, "last_reward_components", None)
    if not parts:
        return None, None
    weights = list(getattr(env, "reward_weights", [1.0] * len(parts)))
    return torch.stack([v.float() for v in parts.values()], dim=-1), weights


def learn_from(agent: Any, experience: Experience) -> StepOutput:
    """``agent.learn`` on the experience's rollout; then the reference and the score follow.

    An agent that generates on a rollout server (:class:`rl_algos.server_sync.ServerEngine`)
    sends it the updated actor (LoRA: the adapter only) before the next sample.
    """
    metrics = agent.learn(experience.rollout)
    push = getattr(agent.engine, "push", None)
    if push is not None:
        push(agent.engine.version + 1)
    if experience.num_epochs is not None:
        agent.set_reference_policy(experience.num_epochs)
        agent.scores.append(float(experience.rewards.float().mean()))
    return StepOutput(metrics, experience.rewards)
