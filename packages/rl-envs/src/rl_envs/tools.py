"""Tool-calling episodes: TRL's ``environment_factory`` convention as token-level trajectories.

An *environment* is any object with ``reset(**row) -> str | None``; its other public methods
are the tools the model may call (schema from the signature and docstring by
``transformers.utils.get_json_schema``), and an optional ``get_reward() -> float`` scores the
episode. :class:`ToolEnvWrapper` drives one episode through the tokenizer's tool-calling chat
template (``apply_chat_template(messages, tools=schemas)``):

1. the prompt is the row's ``"prompt"`` (a string or a list of ``{"role", "content"}``
   messages); a string returned by ``reset`` is appended to its last user message (TRL);
2. each action is parsed for tool calls (``parser``; :func:`parse_hermes_tool_calls` by
   default, :func:`parse_compact_tool_calls` for tiny character vocabularies); every call is
   run and answered with ``{"role": "tool", "name": ..., "content": ...}``;
3. the episode ends (terminated) at the first action without a tool call: its reward is
   ``environment.get_reward()`` if defined, else ``reward_fn(completion, environment, **row)``
   (the final answer's text; TRL hands reward functions the environments too), a finite
   number. Tools and ``get_reward`` may be ``async def`` (awaited, as TRL does).

Errors never end an episode: a tool that raises, an unknown tool name, arguments that do not
fit the signature or the JSON types of the tool's schema (checked before the tool runs) and an
unparseable call are all answered with a tool message
``"error: <what went wrong>"`` and the model gets another turn. After ``max_tool_calls`` turns
with calls, a further call is not run: the episode is *truncated*
(``info["truncated_by"] == "max_tool_calls"``) and scored as it stands.

Token-in/token-out as in :class:`~rl_envs.multiturn.TokenObservationWrapper`: the policy's
tokens are kept exactly as generated; only the tool messages and the next generation prompt are
tokenised (the rendered text after the previous rendering), so the trajectory's ids equal the
tokenisation of ``apply_chat_template(messages, tools=schemas)`` for the whole conversation
whenever the policy's tokens are the tokenisation of its text. Assistant turns are stored as
their raw text (the call syntax included; no ``tool_calls`` field), so the template reproduces
exactly what the model wrote.
"""

from __future__ import annotations

import inspect
import math
import numbers
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rl_envs import _timeout
from rl_envs._tool_calls import (
    RESERVED,
    ToolCall,
    ToolCallParseError,
    ToolCallParser,
    argument_errors,
    parse_compact_tool_calls,
    parse_hermes_tool_calls,
    tool_methods,
    tool_schemas,
)
from rl_envs.multiturn import TokenObservationWrapper

__all__ = [
    "RESERVED",
    "TINY_TOOL_CHAT_TEMPLATE",
    "SecretDigitEnv",
    "ToolCall",
    "ToolCallParseError",
    "ToolEnvWrapper",
    "parse_compact_tool_calls",
    "parse_hermes_tool_calls",
    "secret_digit_reward",
    "secret_digit_rows",
    "tool_methods",
    "tool_schemas",
]

TINY_TOOL_CHAT_TEMPLATE: str = (
    "{%- if tools -%}{{ 'tools:' }}"
    "{%- for tool in tools -%}{{ (',' if not loop.first else '') + tool['function']['name'] }}"
    "{%- endfor -%}{{ '\\n' }}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{ message['content'] + eos_token }}"
    "{%- elif message['role'] == 'tool' -%}{{ '=' + message['content'] }}"
    "{%- else -%}{{ message['content'] + '\\n' }}{%- endif -%}"
    "{%- endfor -%}"
)
"""A compact tool-calling chat template for character tokenizers (``rl_train.tiny``).

``tools:name1,name2\\n`` (the tools header, names only), then per message: system and user
``content\\n``, tool ``=content``, assistant ``content<eos>``. There are no role markers and
the generation prompt is empty: the model's turn follows the last message directly (after a
tool call, the result is the last thing it sees). Prefix-stable, and the assistant's closing
marker is the EOS token itself."""


_CONVERT: dict[Any, Callable[[str], Any]] = {int: int, float: float, "int": int, "float": float}


def _awaited(value: Any, timeout: float | None) -> Any:
    """``value``, or its result when it is awaitable; raises what it raised.

    An ``async def`` tool or ``get_reward`` runs on the shared event loop, as TRL awaits them.
    """
    if not inspect.isawaitable(value):
        return value
    from rl_envs.reward_functions import _gather

    result = _gather([value], timeout)[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _finite(what: str, value: Any, where: str) -> float:
    """``value`` as the episode's reward.

    Raises:
        ValueError: ``value`` is not a finite number (a one-element tensor or numpy value is
            one); the message names ``what`` and ``where``.
    """
    from rl_envs.reward_functions import _number

    number = _number(value)
    if not isinstance(number, numbers.Real) or not math.isfinite(float(number)):
        raise ValueError(
            f"{what} returned {value!r:.80} on {where}; it must return a finite number (the "
            "episode's reward)"
        )
    return float(number)


def _run(
    call: ToolCall,
    tools: Mapping[str, Callable[..., Any]],
    timeout: float | None = None,
    parameters: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[str, bool]:
    """``(content of the tool message, ok)`` for one call; raises only ``CallTimeoutError``.

    ``parameters``: each tool's schema ``parameters``, against which the (converted) arguments
    are checked before the tool runs (:func:`~rl_envs._tool_calls.argument_errors`).
    """
    tool = tools.get(call.name)
    if tool is None:
        return f"error: unknown tool {call.name!r}; tools: {', '.join(tools)}", False
    try:
        bound = inspect.signature(tool).bind(*call.args, **call.arguments)
    except TypeError as exc:
        return f"error: bad arguments for {call.name}: {exc}", False
    try:
        params = inspect.signature(tool).parameters
        for key, value in list(bound.arguments.items()):
            convert = _CONVERT.get(params[key].annotation)
            if convert is not None and isinstance(value, str):
                bound.arguments[key] = convert(value)
        wrong = argument_errors(bound.arguments, (parameters or {}).get(call.name) or {})
        if wrong:
            return f"error: bad arguments for {call.name}: {'; '.join(wrong)}", False
        result = _timeout.call(tool, timeout, *bound.args, **bound.kwargs)
        result = _awaited(result, timeout)
    except _timeout.CallTimeoutError:
        raise
    except Exception as exc:  # the model sees the error and goes on
        return f"error: {type(exc).__name__}: {exc}", False
    return str(result), True


class _ToolSession:
    """The text side of one tool episode (the wrapper's ``env``).

    Its observations are message lists (``_prompt_messages`` / ``_reply_messages`` take them
    as they are).
    """

    def __init__(self, owner: ToolEnvWrapper) -> None:
        self.owner = owner

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        return self.owner._start(seed)

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.owner._act(action)


class ToolEnvWrapper(TokenObservationWrapper):
    """A tool-calling episode of an ``environment_factory``-style object, as tokens.

    See the module docstring for the protocol. Rewards: ``call_reward`` (default 0) on turns
    with tool calls that all ran, 0 on turns with a failed call, the episode's score on the
    last turn (also when it is truncated). ``info`` of each step holds
    ``"tool_calls"`` (calls so far) and ``"tool_errors"`` (failed calls so far).

    Args:
        environment: The environment (``reset(**row)``, tools, optional ``get_reward()``).
        tokenizer: A tokenizer whose chat template renders ``tools`` and ``tool`` messages.
        rows: The tasks: a sequence of rows (``reset(seed)`` takes row ``seed % len(rows)``)
            or ``rows(seed) -> row``. Each row is passed to ``environment.reset(**row)`` and
            must hold ``"prompt"``.
        max_tool_calls: Turns with tool calls before the episode is truncated
            (``max_turns = max_tool_calls + 1``).
        pad_id: Padding id, stripped from the end of actions.
        max_model_len: Longest conversation in tokens.
        max_output_tokens: Most tokens per action.
        parser: ``parser(text, tools) -> [ToolCall]``; :func:`parse_hermes_tool_calls` by
            default, :func:`parse_compact_tool_calls` for character vocabularies.
        reward_fn: ``reward_fn(completion, environment, **row) -> float``, used when the
            environment has no ``get_reward`` (``completion``: the final answer's text, ``""``
            when the episode was truncated; passed positionally, so a row column may be called
            ``answer``).
        system_prompt: An optional system message in front of the prompt.
        call_reward: Reward of each turn whose tool calls all ran without error (shaping for
            small models, best with per-turn advantages; 0 by default, as in TRL).
        tool_timeout: Seconds each tool call may take, after which :meth:`step` raises
            :class:`~rl_envs.EnvTimeoutError` naming the tool, the turn and the timeout
            (the episode is as before the step). None (default): no limit, and tools run on
            the calling thread. When set, they run on a daemon worker thread (a call that does
            not return in time is abandoned there, still running).
        step_timeout: As for :class:`~rl_envs.multiturn.TokenObservationWrapper`: seconds each
            ``environment.reset`` and each whole turn (its tool calls, or the scoring of the
            final answer) may take.

    Raises:
        ValueError: An argument is invalid (the message names it). Later, from :meth:`reset`
            and :meth:`step`: ``reset`` does not take the row's columns or returns neither a
            str nor None, or ``get_reward`` / ``reward_fn`` returns no finite number (the
            message names the method and the row).
    """

    _observation_types = (list,)

    def __init__(
        self,
        environment: Any,
        tokenizer: Any,
        rows: Sequence[Mapping[str, Any]] | Callable[[int], Mapping[str, Any]],
        *,
        max_tool_calls: int,
        pad_id: int,
        max_model_len: int,
        max_output_tokens: int,
        parser: ToolCallParser = parse_hermes_tool_calls,
        reward_fn: Callable[..., float] | None = None,
        system_prompt: str | None = None,
        call_reward: float = 0.0,
        tool_timeout: float | None = None,
        step_timeout: float | None = None,
    ) -> None:
        self.tool_timeout = _timeout.check_timeout("tool_timeout", tool_timeout)
        if (
            isinstance(max_tool_calls, bool)
            or not isinstance(max_tool_calls, int)
            or max_tool_calls < 0
        ):
            raise ValueError(
                f"`max_tool_calls` must be an int >= 0, got {max_tool_calls!r}: the most turns "
                "with tool calls per episode (TRL's max_tool_calling_iterations=None, no limit, "
                "has no counterpart here)"
            )
        if not callable(getattr(environment, "reset", None)):
            raise ValueError(
                "`environment` needs a reset(**row) method (TRL's environment_factory convention)"
            )
        has_reward = callable(getattr(environment, "get_reward", None))
        if reward_fn is None and not has_reward:
            raise ValueError(
                "`environment` has no get_reward() method: pass "
                "reward_fn=fn(completion, environment, **row)"
            )
        if not tokenizer.chat_template:
            raise ValueError(
                "the tokenizer has no chat template; tool calls need one that renders `tools` "
                "and tool messages (for character tokenizers: TINY_TOOL_CHAT_TEMPLATE)"
            )
        if not callable(rows) and len(rows) == 0:
            raise ValueError("`rows` is empty: pass at least one row with a 'prompt'")
        self.environment = environment
        self.rows = rows
        self.max_tool_calls = max_tool_calls
        self.parser = parser
        self.reward_fn = reward_fn
        self.call_reward = float(call_reward)
        self.tools = tool_methods(environment)
        self.schemas = tool_schemas(environment)
        self._parameters = {
            s["function"]["name"]: s["function"]["parameters"] for s in self.schemas
        }
        self._row: dict[str, Any] = {}
        self._where = ""
        self._calls = self._errors = 0
        self._scored = False
        self._answer = self._last_text = ""
        super().__init__(
            _ToolSession(self),
            tokenizer,
            max_turns=max_tool_calls + 1,
            pad_id=pad_id,
            max_model_len=max_model_len,
            max_output_tokens=max_output_tokens,
            apply_chat_template=True,
            system_prompt=system_prompt,
            step_timeout=step_timeout,
        )

    def _env_name(self) -> str:
        return type(self.environment).__name__

    # -- chat template hooks ---------------------------------------------------------------------

    def _template_kwargs(self) -> dict[str, Any]:
        return {"tools": self.schemas} if self.schemas else {}

    def _prompt_messages(self, observation: Any) -> list[dict[str, Any]]:
        return list(observation)

    def _reply_messages(self, observation: Any) -> list[dict[str, Any]]:
        return list(observation)

    # -- the episode -----------------------------------------------------------------------------

    def _start(self, seed: int | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        index = random.randrange(2**31) if seed is None else seed
        if callable(self.rows):
            row, where = dict(self.rows(index)), f"the row of seed {index}"
        else:
            row = dict(self.rows[index % len(self.rows)])
            where = f"row {index % len(self.rows)} (seed {index})"
        if "prompt" not in row:
            raise ValueError(f"row {index} has no 'prompt' (columns: {sorted(row)})")
        prompt = row["prompt"]
        messages = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else [dict(m) for m in prompt]
        )
        name = self._env_name()
        try:
            inspect.signature(self.environment.reset).bind(**row)
        except TypeError:
            raise ValueError(
                f"`{name}.reset` does not take the columns {sorted(row)} of {where}: TRL's "
                "environment_factory passes every column of the row as a keyword argument; add "
                "**kwargs to reset"
            ) from None
        except ValueError:  # no readable signature: call it and see
            pass
        extra = self.environment.reset(**row)
        if extra is not None:
            if not isinstance(extra, str):
                raise ValueError(
                    f"`{name}.reset(**row)` returned a {type(extra).__name__} on {where}; it must "
                    "return the text to add to the prompt (a str) or None"
                )
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            if not users:
                raise ValueError(
                    f"`{name}.reset(**row)` returned text for {where}, whose prompt has no user "
                    "message to add it to: give the prompt a user message or return None"
                )
            messages[users[-1]]["content"] = str(messages[users[-1]]["content"]) + extra
        self._row, self._where, self._calls, self._errors = row, where, 0, 0
        self._scored, self._answer = False, ""
        return messages, {"row": row}

    def _score(self) -> float:
        if callable(getattr(self.environment, "get_reward", None)):
            what = f"`{self._env_name()}.get_reward()`"
            value = _awaited(self.environment.get_reward(), None)
        else:
            assert self.reward_fn is not None
            name = getattr(self.reward_fn, "__name__", type(self.reward_fn).__name__)
            what = f"`reward_fn` {name}"
            value = _awaited(self.reward_fn(self._answer, self.environment, **self._row), None)
        reward = _finite(what, value, self._where)
        self._scored = True
        return reward

    def _info(self) -> dict[str, Any]:
        return {"tool_calls": self._calls, "tool_errors": self._errors}

    def _act(self, text: str) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        try:
            calls = self.parser(text, self.tools)
            replies: list[dict[str, Any]] | None = None
        except ToolCallParseError as exc:
            calls, replies = [], [{"role": "tool", "name": "error", "content": f"error: {exc}"}]
        self._last_text = text
        if not calls and replies is None:  # a final answer
            self._answer = text
            return [], self._score(), True, False, self._info()
        if self._calls >= self.max_tool_calls:
            info = {**self._info(), "truncated_by": "max_tool_calls"}
            return [], self._score(), False, True, info
        errors = self._errors
        if replies is None:
            replies = []
            for call in calls:
                try:
                    content, ok = _run(call, self.tools, self.tool_timeout, self._parameters)
                except _timeout.CallTimeoutError:
                    self._errors = errors
                    raise _timeout.EnvTimeoutError(
                        f"tool {call.name} of {self._env_name()} did not return within "
                        f"{self.tool_timeout} s (tool_timeout) on turn {len(self._rewards)}; "
                        "raise tool_timeout or fix the tool"
                    ) from None
                self._errors += not ok
                replies.append({"role": "tool", "name": call.name, "content": content})
        else:
            self._errors += 1
        self._calls += 1
        reward = self.call_reward if self._errors == errors else 0.0
        return replies, reward, False, False, self._info()

    def step(
        self, action: torch.Tensor | Sequence[int]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply the policy's tokens ``[T]``: run its tool calls, or score its final answer."""
        before = len(self._messages)
        obs, reward, terminated, truncated, info = super().step(action)
        if self.done and not self._scored:  # cut by max_model_len: score as it stands
            reward = self._score()
            self._rewards[-1] = reward
        if self.done:  # the conversation as tokenised: the last action, no reply after it
            del self._messages[before:]
            self._messages.append({"role": "assistant", "content": self._last_text})
        return obs, reward, terminated, truncated, info

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far (a copy), as the trajectory's tokens render it."""
        return [dict(m) for m in self._messages]


class SecretDigitEnv:
    """The built-in tool task: the answer is a secret digit only the ``peek`` tool reveals.

    Each row holds a ``secret`` digit (drawn per episode, so it cannot be memorised) and the
    prompt ``"secret?"``; the model must call ``peek`` (``"!"`` in the compact syntax) and copy
    the tool's answer. Scored by :func:`secret_digit_reward`.
    """

    def __init__(self) -> None:
        self.secret = ""
        self.peeks = 0

    def reset(self, secret: str, **row: Any) -> str | None:
        """Start an episode with the row's ``secret``."""
        del row
        self.secret, self.peeks = str(secret), 0
        return None

    def peek(self) -> str:
        """Reveal the secret digit.

        Returns:
            The secret digit.
        """
        self.peeks += 1
        return self.secret


def secret_digit_reward(completion: str, environment: SecretDigitEnv, **row: Any) -> float:
    """The built-in tool task's score (a ``reward_fn`` of :class:`ToolEnvWrapper`).

    Args:
        completion: The final answer.
        environment: The episode's :class:`SecretDigitEnv`.
        **row: The task's row (unused: the environment holds the secret).

    Returns:
        1 for exactly the secret after a ``peek``; 0.5 for the secret followed by more text
        (after a ``peek``); else 0 (a guess without a ``peek`` earns nothing, right or not).
    """
    del row
    if not environment.peeks or not completion.startswith(environment.secret):
        return 0.0
    return 1.0 if completion == environment.secret else 0.5


def secret_digit_rows(seed: int, *, digits: str = "0123456789") -> dict[str, Any]:
    """Row ``seed`` of the built-in tool task: ``{"prompt": "secret?", "secret": <digit>}``.

    Args:
        seed: The task's seed (the secret is drawn from ``random.Random(seed)``).
        digits: The possible secrets (fewer make the copying faster to learn).

    Returns:
        The row (``ToolEnvWrapper``'s ``rows=functools.partial(secret_digit_rows, digits=..)``).
    """
    if not digits:
        raise ValueError("`digits` must hold at least one possible secret")
    return {"prompt": "secret?", "secret": random.Random(seed).choice(digits)}
