"""OpenEnv environments as multi-turn text episodes (the ``rl-envs[openenv]`` extra).

An OpenEnv environment (``openenv.core.env_server.interfaces.Environment``: ``reset(seed) ->
Observation``, ``step(Action) -> Observation`` with ``done`` and ``reward``) trains with the
multi-turn loop unchanged, run in-process or served by ``create_app`` and driven over its
WebSocket through ``EnvClient``:

1. ``reset(seed=...)``'s observation, mapped to text by ``observation`` (default:
   :func:`observation_text`), is the first user message;
2. each action's text is mapped to an ``Action`` by ``action`` (default: the action class's
   one string field, :func:`text_action`); the observation that comes back is the next user
   message (tokenised as environment tokens: masked out of the loss);
3. the turn's reward is ``reward(observation)`` if given, else the observation's ``reward``,
   else the in-process environment's rubric ``rubric(action, observation)``; a step that ends
   the episode with none of them is an error (the message says how to give one);
4. ``observation.done`` ends the episode (terminated); the wrapper's ``max_turns`` caps an
   environment that never ends (truncated).

MCP tool environments (an ``MCPEnvironment``, or the action class ``CallToolAction``) take
the model's Hermes tool calls by default (:func:`mcp_actions`), as TRL's tool loop does: every
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` of an answer is a
``CallToolAction`` stepped in order (stopping at a step that ends the episode); the next
message is their results' texts joined by newlines, the turn's reward the sum of their rewards.
The model's own text never ends a run: an answer without a call, or with a call that is not
that JSON, does not step the environment and is answered ``"error: <what went wrong>; write
<tool_call>..."`` (reward 0, the model gets another turn; ``max_turns`` still caps the episode),
as :class:`~rl_envs.tools.ToolEnvWrapper` answers it. A user's own ``action=`` that raises is
an :class:`OpenEnvError` (a bug of that mapping).

Remote environments: one WebSocket session per episode (``OpenEnvWrapper`` connects on
``reset`` and closes when the episode ends), so the server's ``max_concurrent_envs`` must be
at least the rollout's ``N = B x G`` episodes. A server that cannot be reached, or does not
answer within ``timeout``, is an error naming its URL.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rl_envs._extras import require
from rl_envs.multiturn import TokenObservationWrapper

__all__ = [
    "OpenEnvError",
    "OpenEnvTextEnv",
    "OpenEnvWrapper",
    "mcp_action",
    "mcp_actions",
    "observation_text",
    "text_action",
]

#: Fields of every OpenEnv observation that are not its content.
_BOOKKEEPING = frozenset({"done", "reward", "metadata"})
#: Field names preferred, in order, when an observation has several text fields.
_TEXT_FIELDS = ("prompt", "text", "message", "content", "observation", "feedback")


class OpenEnvError(RuntimeError):
    """The environment (or its server) failed during an episode."""


def _core() -> Any:
    return require("openenv.core", "openenv", "rl_envs.openenv")


def _fields(observation: Any) -> dict[str, Any]:
    """The observation's content: its fields but ``done``, ``reward`` and ``metadata``."""
    if hasattr(observation, "model_dump"):
        return dict(observation.model_dump(exclude=set(_BOOKKEEPING)))
    return {k: v for k, v in dict(observation).items() if k not in _BOOKKEEPING}


def observation_text(observation: Any) -> str:
    """The default ``Observation -> message`` mapping.

    The content fields (all but ``done``, ``reward``, ``metadata``, as OpenEnv serialises
    them): a single field as its text; else the first string field among ``prompt``, ``text``,
    ``message``, ``content``, ``observation``, ``feedback``; else the fields as sorted JSON.
    MCP observations: a tool call's result text (``error: ...`` when it failed), the tool list
    as JSON ``[{"name", "description"}]``.

    Args:
        observation: An OpenEnv ``Observation`` or its serialised dict.

    Returns:
        The user message.
    """
    fields = _fields(observation)
    if "tool_name" in fields and ("result" in fields or "error" in fields):
        return _tool_text(fields)
    if "tools" in fields and len(fields) == 1:  # ListToolsObservation: names and descriptions
        tools = [
            {"name": t["name"], "description": t.get("description", "")} for t in fields["tools"]
        ]
        return json.dumps(tools)
    if len(fields) == 1:
        return str(next(iter(fields.values())))
    for name in _TEXT_FIELDS:
        if isinstance(fields.get(name), str):
            return str(fields[name])
    return json.dumps(fields, sort_keys=True, default=str)


def _tool_text(fields: dict[str, Any]) -> str:
    """A ``CallToolObservation``'s text: the error, or the result's text content."""
    error = fields.get("error")
    if error:
        return f"error: {error.get('message', error) if isinstance(error, dict) else error}"
    result = fields.get("result")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [str(c.get("text", "")) for c in result["content"] if isinstance(c, dict)]
        return "\n".join(texts)
    content = getattr(result, "content", None)
    if isinstance(content, list):
        return "\n".join(str(getattr(c, "text", c)) for c in content)
    return "" if result is None else str(result)


#: What the model is told to write when an answer holds no usable tool call.
_HERMES_CALL = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'


def mcp_actions(text: str) -> list[Any]:
    """The default ``text -> Actions`` mapping of MCP tool environments: every call, in order.

    The model writes each call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (the Hermes / Qwen2.5 convention, :func:`rl_envs.tools.parse_hermes_tool_calls`); each
    becomes OpenEnv's ``CallToolAction``. :class:`OpenEnvTextEnv` steps the environment once
    per action and answers a ``ValueError`` with an ``"error: ..."`` message (another turn).

    Args:
        text: The model's answer.

    Returns:
        ``[CallToolAction(tool_name=..., arguments=...), ...]`` (at least one).

    Raises:
        ValueError: no call in ``text``, or a call that is not ``{"name": str, "arguments":
            object}`` JSON; the message says what to write instead.
    """
    from rl_envs.tools import ToolCallParseError, parse_hermes_tool_calls

    try:
        calls = parse_hermes_tool_calls(text, {})
    except ToolCallParseError as exc:
        raise ValueError(f"{exc}; write {_HERMES_CALL}") from None
    if not calls:
        raise ValueError(f"no tool call in the answer; write {_HERMES_CALL}")
    core = _core()
    return [core.CallToolAction(tool_name=c.name, arguments=c.arguments) for c in calls]


def mcp_action(text: str) -> Any:
    """The first call of :func:`mcp_actions`, for an ``action=`` mapping of one action per turn.

    Passed as ``action=`` (or left to the default), :class:`OpenEnvTextEnv` runs every call of
    the answer (:func:`mcp_actions`), not only the first.

    Args:
        text: The model's answer.

    Returns:
        ``CallToolAction(tool_name=..., arguments=...)`` of the first call.

    Raises:
        ValueError: no call in ``text``, or a call that is not valid JSON.
    """
    return mcp_actions(text)[0]


def text_action(action_cls: Any) -> Callable[[str], Any]:
    """The default ``text -> Action`` mapping for ``action_cls``: its one ``str`` field.

    Args:
        action_cls: An OpenEnv ``Action`` subclass with exactly one string field (besides
            ``metadata``), e.g. ``class GuessAction(Action): guess: str``.

    Returns:
        ``text -> action_cls(field=text)``.

    Raises:
        ValueError: ``action_cls`` has no string field or several.
    """
    names = [
        name
        for name, info in action_cls.model_fields.items()
        if name != "metadata" and info.annotation is str
    ]
    if len(names) != 1:
        raise ValueError(
            f"{action_cls.__name__} has {len(names)} string fields ({names}); pass "
            "action=fn(text) -> Action to say how the model's text becomes an action"
        )
    field = names[0]
    return lambda text: action_cls(**{field: text})


class OpenEnvTextEnv:
    """One OpenEnv environment as a :class:`~rl_envs.multiturn.TextEnv` (strings in and out).

    Exactly one of ``environment`` (in-process) and ``url`` (a ``create_app`` server) is given.

    ``step``'s info holds ``"observation"``: the environment's latest observation (after a
    turn of several tool calls, the last call's; after a refused answer, the one before).
    With MCP tool calls (the default mapping of MCP environments, see the module docstring)
    it also holds ``"tool_calls"`` (calls run so far) and ``"tool_errors"`` (answers refused
    without a usable call, plus calls whose result is an error, so far).

    Args:
        environment: An OpenEnv ``Environment``, or a callable that builds one (its class).
        url: ``http://host:port`` of a server made by ``create_app``.
        action: ``text -> Action`` (or the action's dict for a server); default
            :func:`text_action` of ``action_cls``, or for an MCP tool environment every tool
            call of the answer (:func:`mcp_actions`; also when :func:`mcp_action` is passed).
        observation: ``Observation -> str``; default :func:`observation_text`.
        reward: ``observation -> float``, used instead of the observation's ``reward``.
        action_cls: The ``Action`` class (in-process: read from ``environment.step``'s
            annotation when not given).
        observation_cls: For a server: rebuild each observation as this class (the mapping
            functions then see the same objects as in-process); None: plain dicts.
        reset_kwargs: Extra keyword arguments of every ``reset``.
        timeout: Seconds to connect to the server and to wait for each reply.
    """

    def __init__(
        self,
        environment: Any = None,
        *,
        url: str | None = None,
        action: Callable[[str], Any] | None = None,
        observation: Callable[[Any], str] | None = None,
        reward: Callable[[Any], float] | None = None,
        action_cls: Any = None,
        observation_cls: Any = None,
        reset_kwargs: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if (environment is None) == (url is None):
            raise ValueError(
                "pass exactly one of `environment` (an OpenEnv Environment, in-process) and "
                "`url` (http://host:port of its create_app server)"
            )
        if not timeout > 0:
            raise ValueError(f"`timeout` must be > 0 seconds, got {timeout}")
        core = _core()
        self.env: Any = None
        if environment is not None:
            env = environment if isinstance(environment, core.Environment) else environment()
            if not isinstance(env, core.Environment):
                raise ValueError(
                    f"`environment` must be an OpenEnv Environment or build one, got "
                    f"{type(env).__name__}"
                )
            self.env = env
            action_cls = action_cls or _annotated_action(env)
        self.url = url
        self.name = type(self.env).__name__ if self.env is not None else str(url)
        core_mcp = (core.CallToolAction, core.Action)
        if action is None and (action_cls in core_mcp or isinstance(self.env, core.MCPEnvironment)):
            action = mcp_action
        # every tool call of an answer runs; the model's unusable text is answered, not raised
        self.tool_calls_mode = action is mcp_action
        if action is None:
            if action_cls is None:
                raise ValueError(
                    f"cannot tell the action class of {self.name}: pass action_cls= or "
                    "action=fn(text) -> Action"
                )
            action = text_action(action_cls)
        self.action_fn = action
        self.observation_fn = observation or observation_text
        self.reward_fn = reward
        self.observation_cls = observation_cls
        self.reset_kwargs = dict(reset_kwargs or {})
        self.timeout = float(timeout)
        self.client: Any = None
        self.turn = 0
        self.last_observation: Any = None
        self.tool_calls = self.tool_errors = 0

    # -- the two transports ----------------------------------------------------------------------

    def _connect(self) -> Any:
        self.close()
        core = _core()
        client = core.GenericEnvClient(
            base_url=self.url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout
        ).sync()
        try:
            client.connect()
        except Exception as exc:
            client.close()
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} is unreachable within {self.timeout:g}s "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        self.client = client
        return client

    def _remote(self, call: Callable[[], Any], what: str) -> tuple[Any, Any, bool]:
        try:
            result = call()
        except Exception as exc:
            # a stuck server would hold a polite close for the WebSocket's own close timeout
            # (10 s): the session is dropped in the background, the error raised now
            self.close(wait=False)
            kind = (
                f"did not answer within {self.timeout:g}s"
                if isinstance(exc, TimeoutError)
                else "failed"
            )
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} {kind} on {what} ({detail})"
            ) from exc
        observation: Any = dict(result.observation)
        if self.observation_cls is not None:
            observation = self.observation_cls(
                **observation, reward=result.reward, done=bool(result.done)
            )
        return observation, result.reward, bool(result.done)

    def _local(self, call: Callable[[], Any], what: str) -> tuple[Any, Any, bool]:
        try:
            observation = call()
        except Exception as exc:
            raise OpenEnvError(f"{self.name}.{what} raised {type(exc).__name__}: {exc}") from exc
        if not (hasattr(observation, "done") and hasattr(observation, "reward")):
            raise OpenEnvError(
                f"{self.name}.{what} returned {observation!r:.80}; it must return an OpenEnv "
                "Observation (with `done` and `reward`)"
            )
        return observation, observation.reward, bool(observation.done)

    # -- TextEnv ---------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: ``(message, {"observation": ...})``."""
        self.turn = 0
        kwargs = {**self.reset_kwargs, "seed": seed}
        if self.env is not None:
            obs, _, done = self._local(lambda: self.env.reset(**kwargs), "reset")
        else:
            client = self._connect()
            obs, _, done = self._remote(lambda: client.reset(**kwargs), "reset")
        if done:
            raise OpenEnvError(f"{self.name} ended the episode at reset (done=True)")
        self.last_observation, self.tool_calls, self.tool_errors = obs, 0, 0
        return self.observation_fn(obs), {"observation": obs}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's text; Gymnasium's five-tuple (never truncated by the env).

        With MCP tool calls, one environment step per call (see the module docstring).
        """
        self.turn += 1
        if self.tool_calls_mode:
            try:
                actions = mcp_actions(action)
            except ValueError as exc:  # the model's own text: answered, another turn
                self.tool_errors += 1
                return f"error: {exc}", 0.0, False, False, self._info()
        else:
            try:
                actions = [self.action_fn(action)]
            except Exception as exc:
                raise OpenEnvError(
                    f"the action mapping of {self.name} refused {action!r} "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
        texts, total, done = [], 0.0, False
        for act in actions:
            obs, reward, done = self._apply(act)
            texts.append(self.observation_fn(obs))
            total += reward
            if done:  # the calls after it are not run
                break
        return "\n".join(texts), total, done, False, self._info()

    def _apply(self, act: Any) -> tuple[Any, float, bool]:
        """One environment step: ``(observation, reward, done)``."""
        if self.env is not None:
            obs, reward, done = self._local(lambda: self.env.step(act), "step")
        else:
            payload = act.model_dump() if hasattr(act, "model_dump") else act
            obs, reward, done = self._remote(lambda: self.client.step(payload), "step")
        if self.reward_fn is not None:
            reward = self.reward_fn(obs)
        elif reward is None and self.env is not None and self.env.rubric is not None:
            reward = self.env.rubric(act, obs)
        if reward is None:
            if done:
                raise OpenEnvError(
                    f"{self.name} ended the episode (turn {self.turn}) without a reward: set "
                    "observation.reward in step(), give the environment a rubric, or pass "
                    "reward=fn(observation) -> float"
                )
            reward = 0.0
        self.last_observation = obs
        if self.tool_calls_mode:
            self.tool_calls += 1
            self.tool_errors += bool(_fields(obs).get("error"))
        return obs, float(reward), done

    def _info(self) -> dict[str, Any]:
        if not self.tool_calls_mode:
            return {"observation": self.last_observation}
        return {
            "observation": self.last_observation,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
        }

    def close(self, wait: bool = True) -> None:
        """End the server session, if any (in-process: nothing to do).

        Args:
            wait: Wait for the close to finish; False closes on a daemon thread (a server that
                does not answer would hold the close for the WebSocket's close timeout).
        """
        client, self.client = self.client, None
        if client is None:
            return

        def close() -> None:
            with contextlib.suppress(Exception):  # the session is gone either way
                client.close()

        if wait:
            close()
        else:
            threading.Thread(target=close, name="openenv-close", daemon=True).start()


def _annotated_action(env: Any) -> Any:
    """The ``Action`` subclass ``env.step`` is annotated with, or None."""
    import typing

    try:
        hints = typing.get_type_hints(type(env).step)
    except Exception:
        return None
    hint = hints.get("action")
    return hint if isinstance(hint, type) and hasattr(hint, "model_fields") else None


class OpenEnvWrapper(TokenObservationWrapper):
    """An OpenEnv episode as tokens: :class:`OpenEnvTextEnv` in a token wrapper.

    The episode's token layout, masks and turn ids are those of
    :class:`~rl_envs.multiturn.TokenObservationWrapper` (observation tokens are not actions,
    so they are masked out of the loss); a server session is closed as soon as the episode
    ends (terminated, ``max_turns``, ``max_model_len`` or an error). ``step``'s info is
    :class:`OpenEnvTextEnv`'s (``"observation"``; with MCP tool calls ``"tool_calls"`` and
    ``"tool_errors"``).

    Args:
        environment: As for :class:`OpenEnvTextEnv` (in-process).
        tokenizer: A Hugging Face tokenizer.
        url: As for :class:`OpenEnvTextEnv` (a server).
        max_turns: Most actions per episode (the cap for an environment that never ends).
        pad_id: Padding id.
        max_model_len: Longest conversation in tokens.
        max_output_tokens: Most tokens per action.
        apply_chat_template: Render the conversation with the tokenizer's chat template.
        system_prompt: An optional system message.
        step_timeout: As for :class:`~rl_envs.multiturn.TokenObservationWrapper`: seconds each
            ``reset`` and ``step`` may take (in-process environments; a server's calls are
            bounded by ``timeout``).
        **kwargs: :class:`OpenEnvTextEnv`'s mapping arguments (``action``, ``observation``,
            ``reward``, ``action_cls``, ``observation_cls``, ``reset_kwargs``, ``timeout``).
    """

    def __init__(
        self,
        environment: Any,
        tokenizer: Any,
        *,
        url: str | None = None,
        max_turns: int,
        pad_id: int,
        max_model_len: int,
        max_output_tokens: int,
        apply_chat_template: bool = True,
        system_prompt: str | None = None,
        step_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.text_env = OpenEnvTextEnv(environment, url=url, **kwargs)
        super().__init__(
            self.text_env,
            tokenizer,
            max_turns=max_turns,
            pad_id=pad_id,
            max_model_len=max_model_len,
            max_output_tokens=max_output_tokens,
            apply_chat_template=apply_chat_template,
            system_prompt=system_prompt,
            step_timeout=step_timeout,
        )

    def _env_name(self) -> str:
        return self.text_env.name

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode (a server: a new session)."""
        try:
            return super().reset(seed)
        except BaseException:
            self.text_env.close()
            raise

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply the policy's tokens; the server session closes when the episode ends."""
        try:
            out = super().step(action)
        except BaseException:
            self.text_env.close()
            raise
        if self.done:
            self.text_env.close()
        return out
