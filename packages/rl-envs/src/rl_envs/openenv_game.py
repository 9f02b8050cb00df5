"""A small text game written against OpenEnv's API (the ``rl-envs[openenv]`` extra).

:class:`EchoDigitEnvironment` is an ordinary OpenEnv ``Environment`` (typed pydantic
``EchoAction`` / ``EchoObservation``, ``SUPPORTS_CONCURRENT_SESSIONS``), so it runs in-process
or behind ``openenv.core.env_server.http_server.create_app``. The tests and tutorials train the
tiny model on it with :class:`rl_envs.openenv.OpenEnvWrapper`.

The game: the observation asks for a digit (``"say 3?"``); the action's first character is
the answer. Right: reward 1, the episode ends. Wrong: reward ``digit_reward`` if it is a digit
(else 0) and, until ``max_tries`` answers, the observation ``"no, say 3?"`` asks again. (The
question mark keeps the target from being the last character: an untrained model with tied
embeddings tends to repeat the last character it read.)
"""

from __future__ import annotations

import random
from typing import Any

from rl_envs._extras import require

_core = require("openenv.core", "openenv", "rl_envs.openenv_game")

__all__ = ["EchoAction", "EchoDigitEnvironment", "EchoObservation", "EchoState"]


class EchoAction(_core.Action):  # type: ignore[misc,name-defined]
    """The model's answer."""

    text: str


class EchoObservation(_core.Observation):  # type: ignore[misc,name-defined]
    """What the model reads."""

    prompt: str


class EchoState(_core.State):  # type: ignore[misc,name-defined]
    """The episode's hidden digit and answers so far."""

    target: str = ""
    tries: int = 0


class EchoDigitEnvironment(_core.Environment):  # type: ignore[misc,name-defined]
    """Say the digit you are asked for (see the module docstring).

    Args:
        digits: The possible targets (``reset(seed)`` draws one with ``random.Random(seed)``).
        max_tries: Answers per episode before it ends unsolved.
        digit_reward: Reward of a wrong answer that is a digit (shaping for tiny models).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, digits: str = "0123", max_tries: int = 2, digit_reward: float = 0.5):
        super().__init__()
        if not digits or max_tries < 1:
            raise ValueError("`digits` must be non-empty and `max_tries` >= 1")
        self.digits, self.max_tries, self.digit_reward = digits, max_tries, digit_reward
        self._state = EchoState()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> EchoObservation:
        """A new target digit, drawn from ``seed``."""
        del kwargs
        target = random.Random(seed).choice(self.digits)
        self._state = EchoState(episode_id=episode_id, target=target)
        return EchoObservation(prompt=f"say {target}?")

    def step(
        self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EchoObservation:
        """Score the answer's first character."""
        del timeout_s, kwargs
        state = self._state
        state.tries += 1
        state.step_count += 1
        answer = action.text[:1]
        if answer == state.target:
            return EchoObservation(prompt="yes", reward=1.0, done=True)
        reward = self.digit_reward if answer.isdigit() else 0.0
        done = state.tries >= self.max_tries
        return EchoObservation(prompt=f"no, say {state.target}?", reward=reward, done=done)

    @property
    def state(self) -> EchoState:
        """The hidden target and the answers so far."""
        return self._state
