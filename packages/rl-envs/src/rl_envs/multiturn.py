"""Multi-turn text environments as token-level episodes.

A text environment speaks strings (:class:`TextEnv`, Gymnasium's signature);
:class:`TokenObservationWrapper` turns one episode into the token sequence a policy is trained
on: the conversation rendered with the tokenizer's chat template, where the policy's own
tokens are kept exactly as generated (never re-tokenized), with an action mask and turn ids.
:class:`SyncMultiTurnVecEnv` runs a batch of them, ``G`` copies per seed for group-relative
methods, and collates the episodes into padded tensors.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from rl_envs import _timeout
from rl_envs._trajectory import Trajectory, TrajectoryBatch
from rl_envs.templates import check_rendered

__all__ = [
    "SyncMultiTurnVecEnv",
    "TextEnv",
    "TokenObservationWrapper",
    "Trajectory",
    "TrajectoryBatch",
]


class TextEnv(Protocol):
    """A text environment: observations and actions are strings."""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: ``(observation, info)``."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``(observation, reward, terminated, truncated, info)`` after the policy's ``action``."""
        ...


def _as_ids(action: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(action, torch.Tensor):
        if action.dim() == 2 and action.shape[0] == 1:
            action = action[0]
        if action.dim() != 1:
            raise ValueError(
                f"`action` must be the generated token ids [T] (or [1, T]), got shape "
                f"{tuple(action.shape)}"
            )
        return [int(t) for t in action.tolist()]
    return [int(t) for t in action]


class TokenObservationWrapper:
    """One text environment's episode as tokens, turn by turn (AgileRL's API).

    The prompt is the first observation rendered with the chat template (with the generation
    prompt). After each action the policy's tokens are appended exactly as generated (cut
    after the first EOS; trailing padding dropped), the environment's reply is rendered as the
    next user message and appended as non-action tokens, and the episode stops when the
    environment terminates or truncates, after ``max_turns`` actions, or when the next turn
    would not fit: ``len(ids) + max_output_tokens > max_model_len`` (truncated).

    Args:
        env: A :class:`TextEnv`.
        tokenizer: A Hugging Face tokenizer (its chat template, eos and decoding are used).
        max_turns: Most actions per episode (``K``).
        pad_id: Padding id, stripped from the end of actions (may equal the eos id).
        max_model_len: Longest conversation in tokens.
        max_output_tokens: Most tokens per action (the generation budget of each turn).
        apply_chat_template: Render with the tokenizer's chat template; with False (or no
            template) the observations are tokenized as they are.
        system_prompt: An optional system message in front of the first observation.
        strict_chat_template_boundary: Raise when the chat template is not prefix-stable
            (re-rendering the conversation changes earlier text); with False the new text is
            taken from the first differing character.
        step_timeout: Seconds each call of the environment's ``reset`` and ``step`` may take,
            after which :meth:`reset` / :meth:`step` raise
            :class:`~rl_envs.EnvTimeoutError` naming the environment, the turn and the
            timeout. None (default): no limit, and the environment runs on the calling thread.
            When set, it runs on a daemon worker thread (a call that does not return in time is
            abandoned there, still running).

    Raises:
        ValueError: An argument is invalid (the message names it).
    """

    _observation_types: tuple[type, ...] = (str,)
    """What the environment's observations are (subclasses whose envs speak messages: list)."""

    def __init__(
        self,
        env: TextEnv,
        tokenizer: Any,
        max_turns: int,
        pad_id: int,
        max_model_len: int,
        max_output_tokens: int,
        apply_chat_template: bool = True,
        system_prompt: str | None = None,
        strict_chat_template_boundary: bool = True,
        step_timeout: float | None = None,
    ) -> None:
        self.step_timeout = _timeout.check_timeout("step_timeout", step_timeout)
        if max_turns < 1:
            raise ValueError(f"`max_turns` must be >= 1, got {max_turns}")
        if max_output_tokens < 1:
            raise ValueError(f"`max_output_tokens` must be >= 1, got {max_output_tokens}")
        if max_model_len <= max_output_tokens:
            raise ValueError(
                f"`max_model_len` ({max_model_len}) must exceed `max_output_tokens` "
                f"({max_output_tokens}) to leave room for a prompt"
            )
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs an eos token")
        self.env = env
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.pad_id = pad_id
        self.eos_id = int(tokenizer.eos_token_id)
        self.max_model_len = max_model_len
        self.max_output_tokens = max_output_tokens
        self.apply_chat_template = bool(apply_chat_template and tokenizer.chat_template)
        self.system_prompt = system_prompt
        self.strict_chat_template_boundary = strict_chat_template_boundary
        self._messages: list[dict[str, Any]] = []
        self._ids: list[int] = []
        self._action: list[bool] = []
        self._turns: list[int] = []
        self._rewards: list[float] = []
        self._prompt_length = 0
        self._done = True
        self._terminated = False
        self._truncated = False
        self._step_tokens: list[int] = []
        """The action tokens of the step in progress (for subclasses scoring inside env.step)."""

    @staticmethod
    def factory(
        env_factory: Callable[[], TextEnv], tokenizer: Any, **kwargs: Any
    ) -> Callable[[], TokenObservationWrapper]:
        """A picklable ``env_factory``: each call wraps a fresh ``env_factory()``.

        What a rollout worker process needs (``finetune_llm_multiturn(..., async_config=...)``),
        where a lambda or a closure cannot be sent; ``env_factory`` itself must be picklable
        (a class, a module-level function or a ``functools.partial`` of one).

        Args:
            env_factory: Builds one :class:`TextEnv`.
            tokenizer: As for the constructor.
            **kwargs: The constructor's other arguments (``max_turns``, ``pad_id``, ...).
        """
        return functools.partial(_wrap, env_factory, tokenizer, **kwargs)

    # -- rendering -----------------------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self._template_kwargs(),
            )
        )

    def _template_kwargs(self) -> dict[str, Any]:
        """Extra ``apply_chat_template`` arguments (subclasses: ``tools=``)."""
        return {}

    def _prompt_messages(self, observation: Any) -> list[dict[str, Any]]:
        """The messages of the first observation (subclasses: a message list)."""
        return [{"role": "user", "content": observation}]

    def _reply_messages(self, observation: Any) -> list[dict[str, Any]]:
        """The messages of the environment's reply (subclasses: tool messages)."""
        return [{"role": "user", "content": observation}]

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _suffix(self, before: str, after: str, what: str) -> str:
        if after.startswith(before):
            return after[len(before) :]
        if self.strict_chat_template_boundary:
            raise ValueError(
                f"the chat template is not prefix-stable: rendering {what} changed earlier "
                "text (templates that drop past reasoning do this). Pass "
                "strict_chat_template_boundary=False or apply_chat_template=False"
            )
        common = 0
        for a, b in zip(before, after, strict=False):
            if a != b:
                break
            common += 1
        return after[common:]

    def _reply_tokens(self, action_text: str, ended_with_eos: bool, observation: Any) -> list[int]:
        """Tokens between the action and the next generation: closing marker + reply."""
        if not self.apply_chat_template:
            return self._encode(observation)
        before = self._render(self._messages, generation_prompt=True)
        self._messages.append({"role": "assistant", "content": action_text})
        with_action = self._render(self._messages, generation_prompt=False)
        closing = self._suffix(before, with_action, "the assistant message")
        if not closing.startswith(action_text):
            at = closing.find(action_text) if action_text else -1
            if at > 0:
                raise ValueError(
                    f"the chat template puts {closing[:at]!r} in front of the assistant's text, "
                    "but its generation prompt (add_generation_prompt=True) does not end with "
                    "it: the template drops the generation prompt, so the policy answers "
                    "without it. Render it in the template's add_generation_prompt branch, or "
                    "pass apply_chat_template=False"
                )
            raise ValueError(
                "the chat template changes the assistant's text; pass apply_chat_template=False"
            )
        closing = closing[len(action_text) :]
        eos_text = str(self.tokenizer.eos_token)
        if ended_with_eos and closing.startswith(eos_text):
            closing = closing[len(eos_text) :]  # the policy generated the closing EOS itself
        replies = self._reply_messages(observation)
        self._messages.extend(replies)
        after = self._render(self._messages, generation_prompt=True)
        reply = self._suffix(with_action, after, "the reply")
        check_rendered(replies, reply, f"the reply on turn {len(self._rewards)}")
        return self._encode(closing + reply)

    # -- the environment -----------------------------------------------------------------------

    def _observation(self) -> dict[str, Any]:
        ids = torch.tensor([self._ids], dtype=torch.long)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "text": str(self.tokenizer.decode(self._ids, skip_special_tokens=False)),
        }

    def _env_name(self) -> str:
        """The environment's name in error messages."""
        return type(self.env).__name__

    def _call_env(self, method: str, where: str, *args: Any, **kwargs: Any) -> Any:
        """``env.<method>(...)``, within ``step_timeout``."""
        try:
            return _timeout.call(getattr(self.env, method), self.step_timeout, *args, **kwargs)
        except _timeout.CallTimeoutError:
            raise _timeout.EnvTimeoutError(
                f"{self._env_name()}.{method} did not return within {self.step_timeout} s "
                f"(step_timeout) on {where}; raise step_timeout or fix the environment"
            ) from None

    def _bad_return(self, method: str, out: Any, why: str | None = None) -> ValueError:
        expected = (
            "(observation, info)"
            if method == "reset"
            else "(observation, reward, terminated, truncated, info), Gymnasium's five-tuple"
        )
        kind = " or ".join(t.__name__ for t in self._observation_types)
        got = why or (
            f"a {len(out)}-tuple" if isinstance(out, tuple) else f"a {type(out).__name__}"
        )
        return ValueError(
            f"{self._env_name()}.{method} returned {got}; it must return {expected}, with the "
            f"observation a {kind}, a finite number as reward and info a dict"
        )

    def _check_observation(self, method: str, observation: Any) -> None:
        if not isinstance(observation, self._observation_types):
            raise self._bad_return(
                method, None, f"the observation {observation!r:.80} ({type(observation).__name__})"
            )

    def _check_step(self, out: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """``env.step``'s return, checked: Gymnasium's five-tuple with a finite reward."""
        if not isinstance(out, tuple) or len(out) != 5:
            raise self._bad_return("step", out)
        observation, reward, terminated, truncated, info = out
        self._check_observation("step", observation)
        value = math.nan
        if not isinstance(reward, str | bytes) and hasattr(reward, "__float__"):
            with contextlib.suppress(TypeError, ValueError):  # e.g. a tensor of many values
                value = float(reward)
        if not math.isfinite(value):
            raise self._bad_return("step", out, f"the reward {reward!r:.80}")
        if not isinstance(info, Mapping):
            raise self._bad_return("step", out, f"info is a {type(info).__name__}")
        return observation, value, bool(terminated), bool(truncated), dict(info)

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; the observation is ``{"input_ids" [1, L], "attention_mask", "text"}``.

        Raises:
            ValueError: the first prompt leaves less than ``max_output_tokens`` of room, or the
                environment's ``reset`` did not return ``(observation, info)``.
            EnvTimeoutError: the environment's ``reset`` did not return within ``step_timeout``.
        """
        out = self._call_env("reset", f"reset (seed={seed})", seed=seed)
        if not isinstance(out, tuple) or len(out) != 2:
            raise self._bad_return("reset", out)
        observation, info = out
        self._check_observation("reset", observation)
        if not isinstance(info, Mapping):
            raise self._bad_return("reset", out, f"info is a {type(info).__name__}")
        self._messages = []
        if self.system_prompt is not None:
            self._messages.append({"role": "system", "content": self.system_prompt})
        if self.apply_chat_template:
            self._messages.extend(self._prompt_messages(observation))
            text = self._render(self._messages, generation_prompt=True)
            check_rendered(self._messages, text, f"the first prompt (reset seed={seed})")
        else:
            text = (self.system_prompt + "\n" if self.system_prompt else "") + observation
        self._ids = self._encode(text)
        if len(self._ids) + self.max_output_tokens > self.max_model_len:
            raise ValueError(
                f"the first prompt has {len(self._ids)} tokens; with max_output_tokens="
                f"{self.max_output_tokens} it exceeds max_model_len={self.max_model_len}"
            )
        self._action = [False] * len(self._ids)
        self._turns = [-1] * len(self._ids)
        self._rewards = []
        self._prompt_length = len(self._ids)
        self._done = False
        self._terminated = self._truncated = False
        return self._observation(), dict(info)

    def step(
        self, action: torch.Tensor | Sequence[int]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply the policy's generated tokens ``[T]``; Gymnasium's five-tuple back.

        ``info["truncated_by"]`` says why a wrapper-side truncation happened (``"max_turns"``
        or ``"max_model_len"``). The environment steps first: when it raises (or returns a
        wrong value), the episode is as it was before the call.

        Raises:
            RuntimeError: the episode is over.
            ValueError: a bad ``action``, or the environment's ``step`` did not return
                Gymnasium's five-tuple with an observation of the right type and a finite
                reward (the message names the environment).
            EnvTimeoutError: the environment's ``step`` did not return within ``step_timeout``.
        """
        if self._done:
            raise RuntimeError("the episode is over: call reset() first")
        tokens = _as_ids(action)
        if self.eos_id in tokens:
            tokens = tokens[: tokens.index(self.eos_id) + 1]
        else:
            while tokens and tokens[-1] == self.pad_id:
                tokens.pop()
        if not tokens:
            raise ValueError("`action` holds no generated token (empty or padding only)")
        if len(tokens) > self.max_output_tokens:
            raise ValueError(
                f"`action` has {len(tokens)} tokens, more than max_output_tokens="
                f"{self.max_output_tokens}"
            )
        turn = len(self._rewards)
        ended_with_eos = tokens[-1] == self.eos_id
        text = str(self.tokenizer.decode(tokens, skip_special_tokens=True))
        self._step_tokens = list(tokens)
        out = self._call_env("step", f"turn {turn}", text)
        observation, reward, terminated, truncated, info = self._check_step(out)
        # the environment answered: only now does the episode change
        if not (terminated or truncated) and turn + 1 >= self.max_turns:
            truncated, info["truncated_by"] = True, "max_turns"
        reply: list[int] = []
        if not (terminated or truncated):
            before = len(self._messages)
            try:
                reply = self._reply_tokens(text, ended_with_eos, observation)
            except BaseException:
                del self._messages[before:]
                raise
            length = len(self._ids) + len(tokens) + len(reply)
            if length + self.max_output_tokens > self.max_model_len:
                truncated, info["truncated_by"], reply = True, "max_model_len", []
        self._ids += tokens + reply
        self._action += [True] * len(tokens) + [False] * len(reply)
        self._turns += [turn] * len(tokens) + [-1] * len(reply)
        self._rewards.append(reward)
        self._done = bool(terminated or truncated)
        self._terminated, self._truncated = bool(terminated), bool(truncated)
        return self._observation(), reward, terminated, truncated, info

    @property
    def done(self) -> bool:
        """Whether the episode has ended."""
        return self._done

    def trajectory(self) -> Trajectory:
        """The episode so far as a :class:`Trajectory`."""
        return Trajectory(
            input_ids=torch.tensor(self._ids, dtype=torch.long),
            action_mask=torch.tensor(self._action, dtype=torch.bool),
            turn_ids=torch.tensor(self._turns, dtype=torch.long),
            turn_rewards=torch.tensor(self._rewards, dtype=torch.float32),
            terminated=self._terminated,
            truncated=self._truncated,
            prompt_length=self._prompt_length,
        )


Policy = Callable[[list[dict[str, Any]]], Sequence[torch.Tensor | Sequence[int]]]


class SyncMultiTurnVecEnv:
    """``batch_size`` seeds x ``group_size`` copies of a wrapped environment, stepped together.

    The ``group_size`` copies of a seed start from the same task (the same reset seed), so
    their returns can be compared group-relatively.

    Args:
        env_factory: Builds one :class:`TokenObservationWrapper`.
        batch_size: Distinct tasks per batch (``B``).
        group_size: Copies per task (``G``); ``N = B * G`` environments.
    """

    def __init__(
        self,
        env_factory: Callable[[], TokenObservationWrapper],
        batch_size: int,
        group_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        if group_size < 1:
            raise ValueError(f"`group_size` must be >= 1, got {group_size}")
        self.batch_size, self.group_size = batch_size, group_size
        self.envs = [env_factory() for _ in range(batch_size * group_size)]
        self._rng = random.Random()

    @property
    def num_envs(self) -> int:
        """``N = batch_size * group_size``."""
        return len(self.envs)

    @property
    def active(self) -> list[bool]:
        """Per environment, whether its episode is still running."""
        return [not env.done for env in self.envs]

    def reset(self, seed: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Reset all; group ``b`` uses seed ``seed + b`` (random seeds shared per group if None)."""
        base = self._rng.randrange(2**31) if seed is None else seed
        results = [env.reset(seed=base + i // self.group_size) for i, env in enumerate(self.envs)]
        return [r[0] for r in results], [r[1] for r in results]

    def step(
        self, actions: Sequence[torch.Tensor | Sequence[int] | None]
    ) -> tuple[list[dict[str, Any] | None], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step the active environments (``None`` for finished ones).

        Returns:
            ``(observations, rewards [N], terminated [N], truncated [N])``; finished
            environments get ``None`` / 0 / their final flags.
        """
        if len(actions) != self.num_envs:
            raise ValueError(
                f"`actions` has {len(actions)} entries for {self.num_envs} environments "
                "(pass None for finished ones)"
            )
        observations: list[dict[str, Any] | None] = []
        rewards = torch.zeros(self.num_envs)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool)
        truncated = torch.zeros(self.num_envs, dtype=torch.bool)
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            if env.done and action is not None:
                raise ValueError(f"environment {i} has finished; pass None as its action")
            if not env.done and action is None:
                raise ValueError(f"environment {i} is still running and needs an action")
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            if action is None:
                observations.append(None)
                terminated[i], truncated[i] = env._terminated, env._truncated
                continue
            obs, reward, term, trunc, _ = env.step(action)
            observations.append(None if env.done else obs)
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
        return observations, rewards, terminated, truncated

    def trajectories(self) -> TrajectoryBatch:
        """All ``N`` episodes, collated (rows are group-major: ``row // group_size``)."""
        first = self.envs[0]
        return TrajectoryBatch.collate(
            [env.trajectory() for env in self.envs],
            pad_id=first.pad_id,
            max_turns=first.max_turns,
            group_index=[i // self.group_size for i in range(self.num_envs)],
        )

    def rollout(self, policy: Policy, seed: int | None = None) -> TrajectoryBatch:
        """Run every episode to its end with ``policy(observations of active envs) -> actions``."""
        observations, _ = self.reset(seed)
        current: list[dict[str, Any] | None] = list(observations)
        while any(self.active):
            idx = [i for i, a in enumerate(self.active) if a]
            acts = policy([current[i] for i in idx if current[i] is not None])  # type: ignore[misc]
            if len(acts) != len(idx):
                raise ValueError(
                    f"the policy returned {len(acts)} actions for {len(idx)} active environments"
                )
            actions: list[torch.Tensor | Sequence[int] | None] = [None] * self.num_envs
            for i, a in zip(idx, acts, strict=True):
                actions[i] = a
            current, _, _, _ = self.step(actions)
        return self.trajectories()


def _wrap(env_factory: Callable[[], TextEnv], tokenizer: Any, **kwargs: Any) -> Any:
    """:meth:`TokenObservationWrapper.factory`'s target (module level: picklable)."""
    return TokenObservationWrapper(env_factory(), tokenizer, **kwargs)
