r"""Reward functions in the four conventions users bring: AgileRL, TRL, verl and OpenRLHF.

* **AgileRL** (``"agilerl"``): ``reward_fn(completion, answer, question) -> float``, called once
  per sample with the decoded completion.
* **TRL** (``"trl"``): ``reward_func(prompts, completions, completion_ids, **columns) ->
  list[float | None]``, called once per step with the ``N = B*G`` samples (prompt-major) as
  keyword arguments: ``prompts`` (each prompt repeated ``G`` times; a string, or a list of
  ``{"role", "content"}`` messages for a conversational dataset), ``completions`` (strings, or
  ``[{"role": "assistant", "content": text}]`` when the prompt is conversational),
  ``completion_ids`` (the generated token ids, up to the first EOS) and every other dataset
  column as a list of ``N`` values. ``None`` means "not applicable to this sample": it is left
  out of the weighted sum. ``async def`` functions are run concurrently.
* **verl** (``"verl"``): ``compute_score(data_source, solution_str, ground_truth, extra_info)
  -> float | dict``, per sample; :func:`verl_reward` adapts it to the TRL convention
  (``ground_truth`` from a ``reward_model`` column's ``"ground_truth"``, else a
  ``ground_truth`` column, else ``answer``; a returned dict gives its ``"score"``).
* **OpenRLHF** (``"openrlhf"``): ``reward_func(queries, prompts, labels) -> tensor | dict``,
  called once per step, positionally, with the ``N`` samples' ``queries`` (prompt and
  completion decoded together from their ids, special tokens kept), ``prompts`` (the rendered
  prompt texts) and ``labels`` (the answers, OpenRLHF's ``--label_key`` column); a returned dict
  gives its ``"rewards"`` (:mod:`rl_envs._openrlhf`).

:func:`detect_reward_style` reads the style from the signature; :func:`score_samples` calls
every function once per step (the coroutines of all ``async`` functions gathered together on
one event loop, kept in a daemon thread, so it works from synchronous code and from inside a
running loop alike), checks each return (an error names the function and the sample) and
combines them (``reward_timeout``, off by default, bounds each call; see
:func:`score_samples`):

.. math::

    r_n = \sum_{k:\, v_{kn} \neq \text{None}} w_k v_{kn}

A sample that every function leaves ``None`` gets reward 0, with a warning (TRL does the same).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
import os
import threading
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl_envs import _timeout
from rl_envs._openrlhf import openrlhf_arguments, openrlhf_rewards
from rl_envs._signature import accepted as _accepted
from rl_envs._signature import callable_name as _name
from rl_envs._signature import is_batched_reward
from rl_envs._signature import parameters as _parameters
from rl_envs._verl import verl_reward

__all__ = [
    "REWARD_STYLES",
    "RewardFunctionError",
    "RewardSamples",
    "RewardScores",
    "detect_reward_style",
    "resolve_reward_styles",
    "score_samples",
    "verl_reward",
]

#: The reward-function conventions :func:`score_samples` knows.
REWARD_STYLES = ("agilerl", "trl", "verl", "openrlhf")


class RewardFunctionError(RuntimeError):
    """A reward function raised or timed out; the message names the function and the sample."""


@dataclass(frozen=True)
class RewardSamples:
    """The ``N = B*G`` samples of one step, prompt-major (sample ``n`` is prompt ``n // G``)."""

    group_size: int
    """``G``, completions per prompt."""
    prompts: list[Any]
    """``[N]`` the prompt of each sample: a string, or the conversation (a list of messages)."""
    completions: list[str]
    """``[N]`` the decoded completions."""
    completion_ids: list[list[int]]
    """``[N]`` the generated token ids (up to and including the first EOS, no padding)."""
    columns: dict[str, list[Any]]
    """Every other dataset column, ``N`` values each (a prompt's value repeated ``G`` times)."""
    answers: list[str]
    """``[N]`` reference answers (AgileRL's ``answer``)."""
    questions: list[str]
    """``[N]`` questions (AgileRL's ``question``)."""
    prompt_texts: list[str] | None = None
    """``[N]`` the rendered prompt texts (chat template applied; OpenRLHF's ``prompts``), or
    None."""
    queries: list[str] | None = None
    """``[N]`` prompt and completion decoded together from their ids, special tokens kept
    (OpenRLHF's ``queries``), or None."""

    def where(self, n: int) -> str:
        """Sample ``n`` in words, for error messages."""
        return f"sample {n} (prompt {n // self.group_size}, completion {n % self.group_size})"


@dataclass(frozen=True)
class RewardScores:
    """What :func:`score_samples` returns."""

    total: torch.Tensor
    """``[N]`` float32, the weighted sum over the functions that did not return ``None``."""
    components: dict[str, torch.Tensor]
    """Function name -> ``[N]`` float32 values, NaN where it returned ``None``."""
    not_applicable: list[int]
    """Samples every function left ``None`` (their total is 0)."""


def detect_reward_style(fn: Callable[..., Any]) -> str:
    """The convention of ``fn``, read from its signature.

    ``"verl"`` if it takes ``solution_str``; ``"openrlhf"`` if it takes ``queries`` and not
    ``completions``; ``"trl"`` if it takes ``completions``, ``prompts`` or ``completion_ids``,
    or only ``**kwargs``; else ``"agilerl"`` (three positional parameters, or no readable
    signature).

    Args:
        fn: A reward function.

    Returns:
        One of :data:`REWARD_STYLES`.
    """
    found = _parameters(fn)
    if found is None:
        return "agilerl"
    if "solution_str" in found[0]:
        return "verl"
    if "queries" in found[0] and "completions" not in found[0]:
        return "openrlhf"
    return "trl" if is_batched_reward(fn) else "agilerl"


def resolve_reward_styles(
    fns: Sequence[Callable[..., Any]], style: str | Sequence[str] | None
) -> list[str]:
    """One style per function: ``style`` (one for all, or one each), ``None``/``"auto"`` detected.

    Args:
        fns: The reward functions.
        style: ``None``/``"auto"``, one of :data:`REWARD_STYLES`, or a list of them.

    Returns:
        ``len(fns)`` styles.

    Raises:
        ValueError: An unknown style or a list of the wrong length.
    """
    styles = [style] * len(fns) if style is None or isinstance(style, str) else list(style)
    if len(styles) != len(fns):
        raise ValueError(
            f"`reward_style` has {len(styles)} entries for {len(fns)} reward functions: give "
            "one per function, or one string for all"
        )
    out = []
    for fn, s in zip(fns, styles, strict=True):
        if s is None or s == "auto":
            out.append(detect_reward_style(fn))
        elif s in REWARD_STYLES:
            out.append(str(s))
        else:
            raise ValueError(
                f"`reward_style` {s!r} for {_name(fn)} is unknown: use 'auto' or one of "
                f"{', '.join(REWARD_STYLES)}"
            )
    return out


# -- one event loop for every async reward function --------------------------------------------

_LOOP_LOCK = threading.Lock()
_LOOPS: dict[int, asyncio.AbstractEventLoop] = {}  # process id -> its loop


def _event_loop() -> asyncio.AbstractEventLoop:
    """The shared loop, running in a daemon thread (started on first use, again after a fork)."""
    with _LOOP_LOCK:
        pid = os.getpid()
        if pid not in _LOOPS:
            _LOOPS.clear()  # a forked child: the parent's loop thread did not come along
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rl-envs-rewards", daemon=True).start()
            _LOOPS[pid] = loop
        return _LOOPS[pid]


def _gather(awaitables: list[Awaitable[Any]], timeout: float | None = None) -> list[Any]:
    """Run ``awaitables`` concurrently on the shared loop; results or exceptions, in order.

    Raises:
        CallTimeoutError: Not all finished within ``timeout`` seconds (all are cancelled); its
            argument is the index of the first unfinished one.
    """
    finished = [False] * len(awaitables)

    async def track(i: int, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        finally:
            finished[i] = True

    async def run() -> list[Any]:
        calls = [track(i, a) for i, a in enumerate(awaitables)]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    future = asyncio.run_coroutine_threadsafe(run(), _event_loop())
    done, _ = concurrent.futures.wait([future], timeout)
    if not done:
        stuck = next((i for i, f in enumerate(finished) if not f), 0)
        future.cancel()  # cancels the gather and its coroutines on the loop
        raise _timeout.CallTimeoutError(stuck)
    return future.result()


# -- calling and checking -------------------------------------------------------------------------


def _number(value: Any) -> Any:
    """A one-element tensor or numpy value as a Python number; anything else as it is.

    Numpy values: ``np.float32``, ``np.bool_``, 0-d arrays (TRL takes them as numbers).
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if type(value).__module__ == "numpy" and getattr(value, "size", 0) == 1:
        return value.item()
    return value


def _check_agilerl(name: str, value: Any, samples: RewardSamples, n: int) -> float:
    value = _number(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(
            f"reward_fn {name} returned {value!r} for {samples.where(n)}; it must return a "
            f"finite number. Completion: {samples.completions[n]!r}"
        )
    return float(value)


def _check_batch(name: str, out: Any, samples: RewardSamples) -> list[float | None]:
    total = len(samples.completions)
    if hasattr(out, "tolist") and not isinstance(out, list):  # a tensor or a numpy array
        out = out.tolist()
    if isinstance(out, str | bytes | dict) or not isinstance(out, Sequence):
        raise ValueError(
            f"reward function {name} returned a {type(out).__name__}; it must return a list "
            f"of {total} floats (None where it does not apply), one per completion"
        )
    if len(out) != total:
        groups = total // samples.group_size
        raise ValueError(
            f"reward function {name} returned {len(out)} values for {total} samples ({groups} "
            f"prompts x {samples.group_size} completions); return one per completion"
        )
    values: list[float | None] = []
    for n, raw in enumerate(out):
        value = _number(raw)
        if value is None:
            values.append(None)
            continue
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise ValueError(
                f"reward function {name} returned {value!r} for {samples.where(n)}; each "
                f"value must be a finite number or None. Completion: {samples.completions[n]!r}"
            )
        values.append(float(value))
    return values


def _batch_kwargs(samples: RewardSamples) -> dict[str, Any]:
    conversational = [not isinstance(p, str) for p in samples.prompts]
    completions = [
        [{"role": "assistant", "content": text}] if conv else text
        for text, conv in zip(samples.completions, conversational, strict=True)
    ]
    kwargs: dict[str, Any] = dict(samples.columns)
    kwargs.update(
        prompts=list(samples.prompts),
        completions=completions,
        completion_ids=[list(ids) for ids in samples.completion_ids],
    )
    return kwargs


def _timed_out(name: str, timeout: float, samples: RewardSamples, n: int | None) -> Exception:
    where = f"the batch of {len(samples.completions)} samples" if n is None else samples.where(n)
    return RewardFunctionError(
        f"reward function {name} did not return within {timeout} s (reward_timeout) on "
        f"{where}; raise reward_timeout or fix the function"
    )


def _raised(name: str, exc: BaseException, samples: RewardSamples, n: int | None) -> Exception:
    if n is None:
        return RewardFunctionError(
            f"reward function {name} raised {exc!r} on the batch of "
            f"{len(samples.completions)} samples"
        )
    return RewardFunctionError(
        f"reward_fn {name} raised {exc!r} on {samples.where(n)}; completion: "
        f"{samples.completions[n]!r}"
    )


def score_samples(
    fns: Sequence[Callable[..., Any]],
    weights: Sequence[float],
    styles: Sequence[str],
    samples: RewardSamples,
    *,
    reward_timeout: float | None = None,
) -> RewardScores:
    """Score one step's samples with every reward function and combine them.

    Synchronous functions run first, in order; then the coroutines of every ``async``
    function (all samples of a per-sample one) run concurrently on one event loop.

    Args:
        fns: The reward functions.
        weights: One weight each (finite).
        styles: One of :data:`REWARD_STYLES` each (:func:`resolve_reward_styles`).
        samples: The ``N`` samples.
        reward_timeout: Seconds each call of a synchronous function (one sample of a
            per-sample function, the batch of a batched one) may take, and the ``async``
            functions' coroutines together; None (default): no limit, and synchronous functions
            run on the calling thread. When set, synchronous functions run on a daemon worker
            thread (signal-based verifiers such as ``math_verify``, which need the main thread,
            then fail); one that does not return in time keeps running there, abandoned.

    Returns:
        The :class:`RewardScores` (``total`` ``[N]``).

    Raises:
        RewardFunctionError: A function raised, or did not return within ``reward_timeout``
            (the message names it, and the sample for a per-sample function).
        ValueError: A non-finite weight or a bad ``reward_timeout``; or a function returned a
            wrong value: not a list of ``N`` entries, a non-number, NaN or infinity, or
            ``None`` from an AgileRL-style function, or a value that overflows the float32
            rewards (alone, times its weight, or in the sum; the message names the function
            and the sample).
    """
    timeout = _timeout.check_timeout("reward_timeout", reward_timeout)
    names = [_name(fn) for fn in fns]
    for k, w in enumerate(weights):
        if not math.isfinite(float(w)):
            raise ValueError(
                f"`weights` must be finite numbers; weight {k} (of {names[k]}) is {w!r}"
            )
    total = len(samples.completions)
    values: list[list[float | None]] = [[None] * total for _ in fns]
    pending: list[tuple[int, int | None, Awaitable[Any]]] = []  # (function, sample, awaitable)
    try:
        _call_all(fns, styles, samples, names, values, pending, timeout)
    except BaseException:
        for *_, awaitable in pending:  # not awaited: close them quietly
            if inspect.iscoroutine(awaitable):
                awaitable.close()
        raise
    if pending:
        try:
            results = _gather([a for *_, a in pending], timeout)
        except _timeout.CallTimeoutError as exc:
            k, n, _ = pending[exc.args[0]]
            assert timeout is not None
            raise _timed_out(names[k], timeout, samples, n) from None
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        for (k, n, _), result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                if result is failure:
                    raise _raised(names[k], result, samples, n) from result
            elif n is None:
                values[k] = _check_batch(names[k], _rewards(styles[k], names[k], result), samples)
            else:
                values[k][n] = _check_agilerl(names[k], result, samples, n)
    return _combine(names, weights, values, samples)


def _call_all(
    fns: Sequence[Callable[..., Any]],
    styles: Sequence[str],
    samples: RewardSamples,
    names: list[str],
    values: list[list[float | None]],
    pending: list[tuple[int, int | None, Awaitable[Any]]],
    timeout: float | None,
) -> None:
    """Call every function: ``values`` gets the synchronous results, ``pending`` awaitables."""
    for k, (fn, style) in enumerate(zip(fns, styles, strict=True)):
        name = names[k]
        if style == "agilerl":
            # an async function only makes its coroutine here: no need for the worker thread
            limit = None if inspect.iscoroutinefunction(fn) else timeout
            for n, text in enumerate(samples.completions):
                try:
                    out = _timeout.call(fn, limit, text, samples.answers[n], samples.questions[n])
                except _timeout.CallTimeoutError:
                    assert timeout is not None
                    raise _timed_out(name, timeout, samples, n) from None
                except Exception as exc:
                    raise _raised(name, exc, samples, n) from exc
                if inspect.isawaitable(out):
                    pending.append((k, n, out))
                else:
                    values[k][n] = _check_agilerl(name, out, samples, n)
            continue
        call = verl_reward(fn) if style == "verl" else fn
        limit = None if inspect.iscoroutinefunction(call) else timeout
        # OpenRLHF's positionally, as OpenRLHF calls it; the others with the names they take
        args = openrlhf_arguments(name, samples) if style == "openrlhf" else ()
        kwargs = {} if args else _accepted(call, _batch_kwargs(samples))
        try:
            out = _timeout.call(call, limit, *args, **kwargs)
        except _timeout.CallTimeoutError:
            assert timeout is not None
            raise _timed_out(name, timeout, samples, None) from None
        except Exception as exc:
            raise _raised(name, exc, samples, None) from exc
        if inspect.isawaitable(out):
            pending.append((k, None, out))
        else:
            values[k] = _check_batch(name, _rewards(style, name, out), samples)


def _rewards(style: str, name: str, out: Any) -> Any:
    """A batched function's rewards: OpenRLHF's dict gives its ``"rewards"``."""
    return openrlhf_rewards(name, out) if style == "openrlhf" else out


def _overflow(
    names: list[str],
    weights: Sequence[float],
    values: list[list[float | None]],
    table: torch.Tensor,
    weighted: torch.Tensor,
    samples: RewardSamples,
) -> ValueError:
    """The error for a reward that is finite in float64 but overflows the float32 rewards."""
    fix = "scale the function's rewards down (float32 holds at most 3.4e38)"
    for k, n in torch.nonzero(torch.isinf(table)).tolist():
        return ValueError(
            f"reward function {names[k]} returned {values[k][n]!r} for {samples.where(n)}: "
            f"it overflows the float32 rewards; {fix}"
        )
    for k, n in torch.nonzero(~torch.isfinite(weighted)).tolist():
        return ValueError(
            f"reward function {names[k]}'s {values[k][n]!r} times its weight {weights[k]!r} "
            f"(reward_weights[{k}]) overflows the float32 rewards on {samples.where(n)}; "
            f"lower the weight or {fix}"
        )
    n = int(torch.nonzero(~torch.isfinite(weighted.sum(0)))[0])
    return ValueError(
        f"the weighted sum of the rewards overflows float32 on {samples.where(n)} (values "
        f"{[row[n] for row in values]}, reward_weights {list(weights)}); lower the weights or "
        f"{fix}"
    )


def _combine(
    names: list[str],
    weights: Sequence[float],
    values: list[list[float | None]],
    samples: RewardSamples,
) -> RewardScores:
    table = torch.tensor(
        [[math.nan if v is None else v for v in row] for row in values], dtype=torch.float32
    ).reshape(len(values), len(samples.completions))
    weight = torch.tensor([float(w) for w in weights], dtype=torch.float32)[:, None]
    present = ~torch.isnan(table)
    weighted = torch.where(present, table * weight, torch.zeros_like(table))
    total = weighted.sum(0)
    if not bool(torch.isfinite(total).all()):
        raise _overflow(names, weights, values, table, weighted, samples)
    missing = [int(n) for n in torch.nonzero(~present.any(0)).flatten()]
    if missing:
        warnings.warn(
            f"every reward function returned None for {len(missing)} of {total.numel()} samples "
            f"({samples.where(missing[0])} first): their reward is 0",
            stacklevel=3,
        )
    components: dict[str, torch.Tensor] = {}
    for k, name in enumerate(names):
        key = name if name not in components else f"{name}_{k}"
        components[key] = table[k]
    return RewardScores(total, components, missing)
