"""verl's ``compute_score`` adapted to a batched TRL-style reward function (:func:`verl_reward`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from rl_envs._signature import accepted as _accepted
from rl_envs._signature import callable_name as _name


def _text(completion: Any) -> str:
    """A completion as text: the string, or the content of its last message."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"])


def _ground_truth(columns: dict[str, list[Any]], n: int, key: str | None) -> Any:
    if key is not None:
        if key not in columns:
            raise ValueError(
                f"verl_reward: no column {key!r} (columns: {sorted(columns)}); pass "
                "ground_truth_column= naming the column with the reference answer"
            )
        return columns[key][n]
    model = columns.get("reward_model")
    if model is not None and isinstance(model[n], dict) and "ground_truth" in model[n]:
        return model[n]["ground_truth"]
    for name in ("ground_truth", "answer"):
        if name in columns:
            return columns[name][n]
    raise ValueError(
        "verl_reward: the dataset has no reward_model.ground_truth, ground_truth or answer "
        f"column (columns: {sorted(columns)}); pass ground_truth_column= naming the column "
        "with the reference answer"
    )


def verl_reward(
    compute_score: Callable[..., Any], *, ground_truth_column: str | None = None
) -> Callable[..., Any]:
    """Adapt verl's ``compute_score`` to a batched TRL-style reward function.

    ``compute_score(data_source, solution_str, ground_truth, extra_info)`` is called per
    sample with ``data_source`` (the ``data_source`` column, or None), ``solution_str`` (the
    completion text), ``ground_truth`` (see :mod:`rl_envs.reward_functions`, or
    ``ground_truth_column``) and ``extra_info`` (the ``extra_info`` column, or None); only the
    arguments
    ``compute_score`` takes are passed. A returned dict gives its ``"score"``. An ``async def
    compute_score`` gives an ``async`` function whose samples run concurrently. verl has no
    "not applicable": a ``None`` (or a dict without ``"score"``) is a ``ValueError`` naming
    the sample.

    Args:
        compute_score: The verl scoring function.
        ground_truth_column: The column holding the reference answer, if not the default.

    Returns:
        ``reward(prompts, completions, completion_ids, **columns) -> list[float | None]``.
    """

    def arguments(completions: list[Any], columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
        out = []
        for n, completion in enumerate(completions):
            extra = columns.get("extra_info")
            source = columns.get("data_source")
            out.append(
                _accepted(
                    compute_score,
                    {
                        "data_source": None if source is None else source[n],
                        "solution_str": _text(completion),
                        "ground_truth": _ground_truth(columns, n, ground_truth_column),
                        "extra_info": None if extra is None else extra[n],
                    },
                )
            )
        return out

    name = _name(compute_score)

    def unpack(value: Any, n: int) -> Any:
        if isinstance(value, dict):
            if "score" not in value:
                raise ValueError(
                    f"compute_score {name} returned a dict without 'score' (keys "
                    f"{sorted(value)}) for sample {n}; verl reads the reward from its 'score'"
                )
            value = value["score"]
        if value is None:
            raise ValueError(
                f"compute_score {name} returned None for sample {n}; verl's compute_score "
                "returns a number (or a dict with 'score'): None does not mean 'not applicable' "
                "there"
            )
        return value

    if inspect.iscoroutinefunction(compute_score):

        async def reward_async(completions: list[Any], **columns: Any) -> list[Any]:
            columns.pop("prompts", None)
            columns.pop("completion_ids", None)
            calls = [compute_score(**a) for a in arguments(completions, columns)]
            return [unpack(v, n) for n, v in enumerate(await asyncio.gather(*calls))]

        reward_async.__name__ = _name(compute_score)
        return reward_async

    def reward(completions: list[Any], **columns: Any) -> list[Any]:
        columns.pop("prompts", None)
        columns.pop("completion_ids", None)
        return [
            unpack(compute_score(**a), n) for n, a in enumerate(arguments(completions, columns))
        ]

    reward.__name__ = _name(compute_score)
    return reward
