"""Reading a reward function's convention from its signature (standard library only).

Shared by :mod:`rl_envs.reward_functions` and :mod:`rl_envs.remote_reward` (whose server does
not import torch).
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
