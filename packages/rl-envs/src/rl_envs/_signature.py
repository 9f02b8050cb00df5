"""Reading a reward function's signature and name (standard library only).

Its convention, the keyword arguments it takes, and its name for error messages. Shared by
:mod:`rl_envs.reward_functions` and :mod:`rl_envs.remote_reward` (whose server does not import
torch).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

#: Parameter names that mark a TRL-style batched reward function.
TRL_NAMES = frozenset({"completions", "prompts", "completion_ids"})


def parameters(fn: Callable[..., Any]) -> tuple[set[str], bool] | None:
    """``(named parameters, takes **kwargs)`` of ``fn``; None without a signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    kinds = inspect.Parameter
    names = {p.name for p in params if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)}
    return names, any(p.kind is kinds.VAR_KEYWORD for p in params)


def is_batched_reward(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is batched (TRL style), read from its signature.

    Batched: it names ``completions``, ``prompts`` or ``completion_ids``, or takes only
    ``**kwargs``; per sample otherwise (``(completion, answer, question)``, or no signature).
    """
    found = parameters(fn)
    if found is None:
        return False
    names, var_kw = found
    return bool(names & TRL_NAMES) or (var_kw and not names)


def accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes (all of them with ``**kwargs``)."""
    found = parameters(fn)
    if found is None or found[1]:
        return kwargs
    return {k: v for k, v in kwargs.items() if k in found[0]}


def callable_name(fn: Any) -> str:
    """``fn``'s name in error messages (its ``__name__``, else its type's name)."""
    return str(getattr(fn, "__name__", type(fn).__name__))
