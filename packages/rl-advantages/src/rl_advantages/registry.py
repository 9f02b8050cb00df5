"""A registry of estimators so higher layers choose one by a config string."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from rl_advantages.group import (
    gpg,
    group_relative,
    group_relative_per_turn,
    max_rl,
    opo,
    pass_at_k,
    remax,
    rloo,
)
from rl_advantages.multi_reward import gdpo
from rl_advantages.reinforce import reinforce_plus_plus, reinforce_plus_plus_baseline
from rl_advantages.returns import gae, rebn
from rl_advantages.token_baseline import optimal_token_baseline

__all__ = ["available_estimators", "get_estimator", "register_estimator"]

F = TypeVar("F", bound=Callable[..., Any])

_ESTIMATORS: dict[str, Callable[..., Any]] = {}


def register_estimator(name: str) -> Callable[[F], F]:
    """Register an estimator under ``name`` (decorator).

    Example:
        >>> import torch
        >>> @register_estimator("my_mean_baseline")
        ... def my_mean_baseline(rewards: torch.Tensor) -> torch.Tensor:
        ...     return rewards - rewards.mean()
        >>> get_estimator("my_mean_baseline") is my_mean_baseline
        True

    Raises:
        ValueError: If ``name`` is empty or already registered.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"`name` must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        if name in _ESTIMATORS:
            raise ValueError(
                f"an estimator named {name!r} is registered already; choose another `name`"
            )
        _ESTIMATORS[name] = fn
        return fn

    return decorator


def get_estimator(name: str) -> Callable[..., Any]:
    """Return the estimator registered under ``name``.

    Raises:
        KeyError: For an unknown name; the message lists the known ones.
    """
    try:
        return _ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(_ESTIMATORS))
        raise KeyError(f"unknown estimator {name!r}; known estimators: {known}") from None


def available_estimators() -> list[str]:
    """Names of every registered estimator, sorted."""
    return sorted(_ESTIMATORS)


_BUILTIN: dict[str, Callable[..., Any]] = {
    "gae": gae,
    "grpo": functools.partial(group_relative, scale="group"),
    "dr_grpo": functools.partial(group_relative, scale="none"),
    "lite_ppo": functools.partial(group_relative, scale="batch"),
    "group_relative_per_turn": group_relative_per_turn,
    "rloo": rloo,
    "gpg": gpg,
    "gdpo": gdpo,
    "max_rl": max_rl,
    "optimal_token_baseline": optimal_token_baseline,
    "opo": opo,
    "pass_at_k": pass_at_k,
    "remax": remax,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "rebn": rebn,
}
for _name, _fn in _BUILTIN.items():
    register_estimator(_name)(_fn)
