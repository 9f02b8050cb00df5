"""TRL's ``GRPOTrainer(environment_factory=...)`` over rl-stack's tool-calling episodes.

TRL makes one environment per rollout with ``environment_factory()``, calls
``reset(**row)`` with the dataset row's columns, exposes the environment's public methods as
tools, and hands the environments to the reward functions as ``environments=``. Here each
episode is an :class:`rl_envs.ToolEnvWrapper` on a fresh ``environment_factory()`` and a row
of the training dataset (row ``seed % len(rows)``); an episode ends at the first turn without
a tool call (or after ``max_tool_calling_iterations`` turns with calls), and its reward is
:func:`trl_episode_reward`: each TRL reward function called on that one episode, as TRL calls
it on a batch (``prompts``, ``completions``, ``environments`` and the row's columns, each a
list of one), the non-None values weighted and summed.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

__all__ = ["tool_episode_factory", "tools_environment", "trl_episode_reward"]

#: ``tool_parser`` names -> the rl-envs parser (``compact``: character vocabularies).
PARSERS = ("hermes", "compact")


def _as_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a method: the same name, docstring, parameters and type hints (for its schema)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)  # an async tool's coroutine is awaited by the episode

    signature = inspect.signature(fn)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_param, *signature.parameters.values()]
    )
    method.__name__ = method.__qualname__ = fn.__name__
    method.__doc__ = fn.__doc__
    method.__annotations__ = typing.get_type_hints(fn)
    return method


def tools_environment(tools: Sequence[Callable[..., Any]]) -> type:
    """TRL's ``tools=[...]`` (stateless functions) as an environment class whose methods they are.

    Args:
        tools: Functions with type hints and a docstring with an ``Args`` section (their
            schema, as in TRL); ``async def`` too.

    Returns:
        A class with ``reset(**row) -> None`` and one method per tool.

    Raises:
        ValueError: A tool that is not a named function, a reserved or private name, or two
            tools with one name.
    """
    from rl_envs.tools import RESERVED

    namespace: dict[str, Any] = {"reset": lambda self, **row: None}
    for fn in tools:
        name = getattr(fn, "__name__", None)
        if not callable(fn) or not isinstance(name, str) or name == "<lambda>":
            raise ValueError(
                f"`tools` entry {fn!r} must be a named function (its name is the tool's)"
            )
        if name in RESERVED or name.startswith("_") or name in namespace:
            raise ValueError(
                f"tool {name!r} cannot be a tool name here (reserved: {sorted(RESERVED)}, "
                "private or given twice); rename the function"
            )
        namespace[name] = _as_method(fn)
    return type("Tools", (), namespace)


def trl_episode_reward(
    reward_funcs: Sequence[Callable[..., Any]], weights: Sequence[float] | None = None
) -> Callable[..., Awaitable[float]]:
    """A ToolEnvWrapper ``reward_fn(completion, environment, **row)`` from TRL reward functions.

    Args:
        reward_funcs: TRL-style functions (``async def`` too), called with the keyword arguments
            they name among ``prompts``, ``completions``, ``environments`` and the row's
            columns (all of them with ``**kwargs``), each a list of one.
        weights: One weight per function (default 1.0 each).

    Returns:
        ``async`` ``reward(completion, environment, **row) -> float`` (the episode awaits it):
        the weighted sum of the values that are not None (0 when all are, with a warning, as
        TRL).
    """
    weights = [1.0] * len(reward_funcs) if weights is None else list(weights)
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"`reward_weights` has {len(weights)} entries for {len(reward_funcs)} reward "
            "functions; give one per function"
        )

    async def reward(completion: str, environment: Any, **row: Any) -> float:
        prompt = row.get("prompt", "")
        text = completion if isinstance(prompt, str) else [
            {"role": "assistant", "content": completion}
        ]  # fmt: skip
        kwargs = {k: [v] for k, v in row.items() if k != "prompt"}
        kwargs.update(prompts=[prompt], completions=[text], environments=[environment])
        total, counted = 0.0, False
        for fn, weight in zip(reward_funcs, weights, strict=True):
            values = fn(**_accepted(fn, kwargs))
            if inspect.isawaitable(values):
                values = await values
            if hasattr(values, "tolist"):
                values = values.tolist()
            if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != 1:
                raise ValueError(
                    f"reward function {getattr(fn, '__name__', fn)} returned {values!r:.80} for "
                    "one episode; it must return a list with one value per episode"
                )
            if values[0] is not None:
                total, counted = total + float(weight) * float(values[0]), True
        if not counted:
            warnings.warn(
                "every reward function returned None for an episode: its reward is 0",
                RuntimeWarning,
                stacklevel=2,
            )
        if not math.isfinite(total):
            raise ValueError(f"the reward functions gave a non-finite reward ({total})")
        return total

    return reward


def _accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` names (all of them when it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no readable signature: pass everything
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return kwargs
    names = {p.name for p in parameters}
    return {k: v for k, v in kwargs.items() if k in names}


def _episode(
    environment_factory: Callable[[], Any],
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    reward_fn: Callable[..., Any] | None,
    **kwargs: Any,
) -> Any:
    """One episode: a :class:`rl_envs.ToolEnvWrapper` on a fresh environment (picklable)."""
    from rl_envs.tools import ToolEnvWrapper

    environment = environment_factory()
    has_reward = callable(getattr(environment, "get_reward", None))
    return ToolEnvWrapper(environment, tokenizer, rows,
                          reward_fn=None if has_reward else reward_fn, **kwargs)  # fmt: skip


def tool_episode_factory(
    environment_factory: Callable[[], Any],
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    reward_funcs: Sequence[Callable[..., Any]],
    *,
    weights: Sequence[float] | None,
    max_tool_calls: int,
    max_model_len: int,
    max_output_tokens: int,
    tool_parser: str = "hermes",
) -> Callable[[], Any]:
    """``() -> ToolEnvWrapper`` for :func:`rl_train.finetune_llm_multiturn`.

    An environment with ``get_reward()`` is scored by it; otherwise by
    :func:`trl_episode_reward` of ``reward_funcs``.
    """
    from rl_envs.tools import parse_compact_tool_calls, parse_hermes_tool_calls

    if tool_parser not in PARSERS:
        raise ValueError(f"`tool_parser` {tool_parser!r} is unknown; use one of {PARSERS}")
    parser = parse_hermes_tool_calls if tool_parser == "hermes" else parse_compact_tool_calls
    return functools.partial(
        _episode,
        environment_factory,
        tokenizer,
        list(rows),
        trl_episode_reward(reward_funcs, weights),
        max_tool_calls=max_tool_calls,
        pad_id=int(tokenizer.eos_token_id),
        max_model_len=max_model_len,
        max_output_tokens=max_output_tokens,
        parser=parser,
    )
