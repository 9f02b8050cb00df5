"""A small ``verifiers`` v1 taskset written in this repository (the ``rl-envs[verifiers]`` extra).

:class:`EchoDigitTaskset` is an ordinary verifiers taskset (``Taskset`` / ``Task`` /
``TaskData``, scored by an ``@vf.reward``), exported through ``__all__`` the way verifiers
loads tasksets by id, so ``rl_envs.verifiers.load_taskset("rl_envs.verifiers_taskset")`` and
``env: {verifiers: rl_envs.verifiers_taskset}`` find it. The tests and tutorials train the tiny
model on it with :class:`rl_envs.verifiers.TasksetEnvWrapper`.

The task: ``"say 3?"``; the answer's first character is scored: the asked digit 1, another
digit ``digit_reward``, anything else 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from rl_envs._extras import require

vf = require("verifiers.v1", "verifiers", "rl_envs.verifiers_taskset")

__all__ = ["EchoDigitTaskset"]


class EchoDigitData(vf.TaskData):  # type: ignore[misc,name-defined]
    """One task: the prompt and the digit it asks for."""

    target: str = "0"


class EchoDigitConfig(vf.TasksetConfig):  # type: ignore[misc,name-defined]
    """The taskset's knobs (``load_taskset(..., digits=..., repeats=...)``)."""

    digits: str = "0123"
    """The digits asked for."""
    repeats: int = 8
    """Copies of each digit's task."""
    digit_reward: float = 0.5
    """Reward of an answer that is another digit."""


class EchoDigitTask(vf.Task[EchoDigitData, vf.State]):  # type: ignore[misc,name-defined]
    """Say the digit you are asked for."""

    digit_reward = 0.5

    @vf.reward  # type: ignore[untyped-decorator]
    async def echo(self, trace: vf.Trace) -> float:  # type: ignore[name-defined]
        """1 for the asked digit, ``digit_reward`` for another digit, else 0."""
        answer = trace.last_reply[:1]
        if answer == self.data.target:
            return 1.0
        return self.digit_reward if answer.isdigit() else 0.0


class EchoDigitTaskset(vf.Taskset[EchoDigitTask, EchoDigitConfig]):  # type: ignore[misc,name-defined]
    """``repeats`` x ``digits`` tasks ``"say d?"``, interleaved by digit."""

    def load(self) -> Iterator[EchoDigitTask]:
        """The tasks."""
        for _ in range(self.config.repeats):
            for digit in self.config.digits:
                task = EchoDigitTask(
                    EchoDigitData(prompt=f"say {digit}?", target=digit), self.config.task
                )
                task.digit_reward = self.config.digit_reward
                yield task
