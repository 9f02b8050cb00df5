"""Evaluation: greedy accuracy on a test split, fitness by ``agent.test``, greedy episode return.

Pure helpers over an agent and an environment; the training loop calls them through
:class:`rl_train.hooks.Evaluation`, ``rl-train run`` / ``eval`` and the trainers directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from rl_envs import SyncMultiTurnVecEnv

from rl_train.collective import global_mean

__all__ = ["greedy_accuracy", "greedy_return", "greedy_success_rate", "population_fitness"]


def greedy_accuracy(agent: Any, env: Any) -> float:
    """Exact-match accuracy of greedy answers over the whole test split.

    Args:
        agent: An rl-algos agent.
        env: A :class:`rl_envs.ReasoningGym`; a reward of 1.0 counts as correct.

    Returns:
        The fraction of test prompts answered with reward 1.
    """
    with env.eval_mode():
        prompts = env.reset()
        correct = seen = 0
        while seen < env.num_test_prompts:
            result = agent.get_action(prompts, training=False)
            prompts_scored = prompts
            prompts, rewards = env.step(result.completion_ids)
            take = min(len(prompts_scored), env.num_test_prompts - seen)
            correct += int((rewards[:take, 0] == 1.0).sum())
            seen += take
    return correct / max(1, seen)


def population_fitness(agents: Sequence[Any], env: Any, loop: int = 1) -> float:
    """Test every agent (``agent.test(env, loop)``, greedy) and return the best fitness.

    Each agent's new fitness is replaced by its mean over processes, so that selection agrees
    across processes.

    Args:
        agents: The population.
        env: A :class:`rl_envs.ReasoningGym`.
        loop: Test batches per agent.

    Returns:
        The highest fitness of the population.
    """
    fitness = []
    for agent in agents:
        agent.test(env, loop=loop)
        agent.fitness[-1] = global_mean({"f": agent.fitness[-1]}, agent.device)["f"]
        fitness.append(agent.fitness[-1])
    return float(max(fitness))


def _greedy_returns(
    agent: Any, env_factory: Callable[[], Any], episodes: int, seed: int
) -> torch.Tensor:
    vec = SyncMultiTurnVecEnv(env_factory, batch_size=episodes, group_size=1)

    def policy(obs: list[dict[str, Any]]) -> list[torch.Tensor]:
        result = agent.get_action(obs, training=False)
        return [
            c[0, o["input_ids"].shape[1] :] for c, o in zip(result.completion_ids, obs, strict=True)
        ]

    return vec.rollout(policy, seed=seed).returns


def greedy_success_rate(
    agent: Any, env_factory: Callable[[], Any], episodes: int, seed: int, success: float = 1.0
) -> float:
    """Fraction of greedy multi-turn episodes whose return reaches ``success``.

    Args:
        agent: An rl-algos agent.
        env_factory: Builds one :class:`rl_envs.TokenObservationWrapper` (or a
            :class:`rl_envs.ToolEnvWrapper`).
        episodes: Episodes (one per task, seeded from ``seed``).
        seed: Seed of the tasks.
        success: The return that counts as solved.

    Returns:
        The solved fraction.
    """
    returns = _greedy_returns(agent, env_factory, episodes, seed)
    return float((returns >= success).float().mean())


def greedy_return(agent: Any, env_factory: Callable[[], Any], episodes: int, seed: int) -> float:
    """Mean episode return of greedy play on ``episodes`` fresh multi-turn episodes.

    Args:
        agent: An rl-algos agent.
        env_factory: Builds one :class:`rl_envs.TokenObservationWrapper`.
        episodes: Episodes (one per task, seeded from ``seed``).
        seed: Seed of the tasks.

    Returns:
        The mean undiscounted return.
    """
    return float(_greedy_returns(agent, env_factory, episodes, seed).mean())
