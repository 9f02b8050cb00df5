"""Evolutionary hyperparameter optimisation: tournament selection with elitism, RL-HP mutation."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

__all__ = ["Mutations", "TournamentSelection"]


def _fitness(agent: Any, eval_loop: int) -> float:
    """The mean of the last ``eval_loop`` scores; -inf without any, or when it is NaN.

    A failed evaluation ranks last: NaN compares false both ways and would win by its position.
    """
    scores = list(getattr(agent, "fitness", []))[-eval_loop:]
    mean = sum(scores) / len(scores) if scores else -float("inf")
    return -float("inf") if math.isnan(mean) else mean


class TournamentSelection:
    """AgileRL's tournament selection: keep the elite, fill the rest by tournaments.

    Args:
        tournament_size: Agents drawn per tournament (the fittest wins).
        elitism: Keep the best agent unchanged as member 0 (required for LLM populations).
        population_size: Size of the next population.
        eval_loop: Fitness is the mean of each agent's last ``eval_loop`` test scores (none,
            or NaN from a failed evaluation: ranked last).
        seed: Seed of the draws.
    """

    def __init__(
        self,
        tournament_size: int,
        elitism: bool,
        population_size: int,
        eval_loop: int = 1,
        seed: int | None = None,
    ) -> None:
        if tournament_size < 1 or population_size < 1 or eval_loop < 1:
            raise ValueError(
                "`tournament_size`, `population_size` and `eval_loop` must be >= 1, got "
                f"{tournament_size}, {population_size}, {eval_loop}"
            )
        self.tournament_size = tournament_size
        self.elitism = elitism
        self.population_size = population_size
        self.eval_loop = eval_loop
        self.rng = random.Random(seed)

    def select(self, population: Sequence[Any]) -> tuple[Any, list[Any]]:
        """``(elite, next_population)``; winners are cloned with new indices."""
        if not population:
            raise ValueError("`population` is empty")
        ranked = sorted(population, key=lambda a: _fitness(a, self.eval_loop), reverse=True)
        elite = ranked[0]
        nxt: list[Any] = [elite.clone(index=0)] if self.elitism else []
        while len(nxt) < self.population_size:
            size = min(self.tournament_size, len(population))
            contestants = self.rng.sample(list(population), size)
            winner = max(contestants, key=lambda a: _fitness(a, self.eval_loop))
            nxt.append(winner.clone(index=len(nxt)))
        return elite, nxt


class Mutations:
    """Mutation of RL hyperparameters (the only kind for LLM agents, as in AgileRL).

    Each agent is left alone with probability ``no_mutation``, otherwise one hyperparameter of
    its ``hp_config`` is multiplied by its shrink or grow factor (see
    :class:`rl_algos.RLParameter`); the change is recorded in ``agent.mutation_history``.

    Args:
        no_mutation: Relative probability of no mutation.
        rl_hp: Relative probability of an RL hyperparameter mutation.
        rand_seed: Seed of the draws.
        **others: AgileRL's architecture/parameter/activation probabilities; they must be 0
            for LLM agents.
    """

    def __init__(
        self,
        no_mutation: float = 0.4,
        rl_hp: float = 0.6,
        rand_seed: int | None = None,
        **others: float,
    ) -> None:
        bad = {k: v for k, v in others.items() if k not in ("mutation_sd", "accelerator") and v}
        if bad:
            raise ValueError(
                f"LLM populations only mutate RL hyperparameters; set {sorted(bad)} to 0"
            )
        if no_mutation < 0 or rl_hp < 0 or no_mutation + rl_hp == 0:
            raise ValueError("`no_mutation` and `rl_hp` must be >= 0 and not both 0")
        self.p_none = no_mutation / (no_mutation + rl_hp)
        self.rng = random.Random(rand_seed)

    def mutation(self, population: Sequence[Any], pre_training_mut: bool = False) -> list[Any]:
        """Mutate (in place) and return the population; member 0 (the elite) is kept."""
        del pre_training_mut
        out = list(population)
        for agent in out[1:]:
            if self.rng.random() >= self.p_none and getattr(agent, "hp_config", None):
                agent.mutate_hyperparameter(self.rng)
        return out
