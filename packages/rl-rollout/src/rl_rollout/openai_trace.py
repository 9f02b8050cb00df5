"""Token-in/token-out training rows from the OpenAI-style calls of an episode.

An agent that only speaks the OpenAI protocol sends text and gets text back; the rollout
server (:class:`~rl_rollout.RolloutServer`) records, per call, the exact token ids it rendered
(the chat template's output, or the completion prompt's tokens) and the ids and sampling
log-probs it sampled, keyed by the episode id the agent sends (the ``X-Episode-Id`` header, or
the request's ``user`` field). :func:`trace_rows` turns an episode's calls into training rows
without re-tokenising anything:

* a call whose prompt starts with an earlier row's tokens (prompt + completion) extends that
  row: the tokens in between (a tool result, the next user message, the template's markers)
  join it as tokens that are not the model's, then the new completion as the model's;
* any other call (the agent rewrote its history, or the template renders an earlier reply
  differently from how it was sampled) starts a row of its own.

So a multi-turn conversation whose history the template renders as it was sampled becomes one
row per sampled branch, with ``sampled_mask`` marking the model's tokens and ``logprobs`` their
sampling log-probs (what ``learn(..., sampling_logps=...)`` takes), and nothing is ever lost:
the worst case is one row per call.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TraceCall", "TraceRecorder", "TraceRow", "trace_rows"]


@dataclass(frozen=True)
class TraceCall:
    """One call to the server: the prompt it rendered and the ``n`` completions it sampled."""

    route: str
    """``"chat"``, ``"completions"`` or ``"generate"`` (the token route)."""
    prompt_ids: tuple[int, ...]
    """The exact prompt token ids the engine generated from."""
    completion_ids: tuple[tuple[int, ...], ...]
    """Per choice, the sampled ids up to and including the one that ended it (EOS or stop)."""
    logprobs: tuple[tuple[float, ...], ...]
    """Per choice, the sampling log-prob of each sampled id (the processed distribution)."""
    finish_reasons: tuple[str, ...]
    """Per choice, ``"stop"`` or ``"length"``."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.logprobs) != n or len(self.finish_reasons) != n:
            raise ValueError(
                f"`completion_ids` has {n} choices but `logprobs` has {len(self.logprobs)} and "
                f"`finish_reasons` {len(self.finish_reasons)}; pass one entry per choice"
            )
        for k, (ids, lps) in enumerate(zip(self.completion_ids, self.logprobs, strict=True)):
            if len(ids) != len(lps):
                raise ValueError(
                    f"choice {k}: `completion_ids` has {len(ids)} tokens but `logprobs` has "
                    f"{len(lps)}; pass one log-prob per sampled token"
                )

    def to_json(self) -> dict[str, Any]:
        """The call as JSON lists (float32 log-probs round-trip exactly through a double)."""
        return {
            "route": self.route,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": [list(c) for c in self.completion_ids],
            "logprobs": [list(lp) for lp in self.logprobs],
            "finish_reasons": list(self.finish_reasons),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TraceCall:
        """Inverse of :meth:`to_json`."""
        return cls(
            route=str(data["route"]),
            prompt_ids=tuple(int(t) for t in data["prompt_ids"]),
            completion_ids=tuple(tuple(int(t) for t in c) for c in data["completion_ids"]),
            logprobs=tuple(tuple(float(x) for x in lp) for lp in data["logprobs"]),
            finish_reasons=tuple(str(r) for r in data["finish_reasons"]),
        )


@dataclass
class TraceRow:
    """One training row: a prompt and everything after it, the model's tokens marked."""

    prompt_ids: list[int]
    """The first call's prompt ids (never trained on)."""
    completion_ids: list[int]
    """Every token after the prompt: the model's and those between its calls."""
    sampled_mask: list[bool]
    """Aligned with ``completion_ids``: True where the model sampled the token."""
    logprobs: list[float]
    """Aligned with ``completion_ids``: the sampling log-prob where sampled, 0.0 elsewhere."""
    calls: list[tuple[int, int]] = field(default_factory=list)
    """``(call index, choice index)`` of each call merged into the row, in order."""
    finish_reason: str = "length"
    """The last merged call's finish reason."""

    @property
    def token_ids(self) -> list[int]:
        """Prompt and completion ids: the whole sequence the row trains on."""
        return [*self.prompt_ids, *self.completion_ids]

    @property
    def turns(self) -> int:
        """Number of calls merged into the row."""
        return len(self.calls)


def trace_rows(calls: Sequence[TraceCall]) -> list[TraceRow]:
    """Training rows of an episode's calls (in call order); see the module docstring.

    Each choice of each call ends up in exactly one row. A call extends the longest earlier
    row whose whole sequence is a prefix of its prompt; each of its ``n`` choices extends a
    copy of that row (so ``n > 1`` forks it). Rows that a later call extended are not returned
    themselves, only their extensions.
    """
    rows: list[TraceRow] = []
    extended: list[bool] = []
    for i, call in enumerate(calls):
        prompt = list(call.prompt_ids)
        parent = None
        for j, row in enumerate(rows):
            seq = row.token_ids
            longer = parent is None or len(seq) > len(rows[parent].token_ids)
            if longer and len(seq) <= len(prompt) and prompt[: len(seq)] == seq:
                parent = j
        for k, (ids, lps) in enumerate(zip(call.completion_ids, call.logprobs, strict=True)):
            if parent is None:
                row = TraceRow(prompt_ids=prompt, completion_ids=[], sampled_mask=[], logprobs=[])
                gap: list[int] = []
            else:
                base = rows[parent]
                row = TraceRow(
                    prompt_ids=list(base.prompt_ids),
                    completion_ids=list(base.completion_ids),
                    sampled_mask=list(base.sampled_mask),
                    logprobs=list(base.logprobs),
                    calls=list(base.calls),
                )
                gap = prompt[len(base.token_ids) :]
            row.completion_ids += [*gap, *ids]
            row.sampled_mask += [False] * len(gap) + [True] * len(ids)
            row.logprobs += [0.0] * len(gap) + [float(x) for x in lps]
            row.calls.append((i, k))
            row.finish_reason = call.finish_reasons[k]
            rows.append(row)
            extended.append(False)
        if parent is not None:
            extended[parent] = True
    return [row for row, done in zip(rows, extended, strict=True) if not done]


class TraceRecorder:
    """Thread-safe store of the calls of each episode (the server writes, the trainer reads).

    The server records a call only when the request names an episode; rows are built on
    demand with :func:`trace_rows`. Call :meth:`pop` once an episode is trained on: nothing is
    dropped otherwise.
    """

    def __init__(self) -> None:
        self._calls: dict[Hashable, list[TraceCall]] = {}
        self._lock = threading.Lock()

    def record(self, episode_id: Hashable, call: TraceCall) -> None:
        """Append ``call`` to episode ``episode_id``."""
        with self._lock:
            self._calls.setdefault(episode_id, []).append(call)

    def episodes(self) -> list[Hashable]:
        """Ids of the episodes recorded so far, in first-call order."""
        with self._lock:
            return list(self._calls)

    def calls(self, episode_id: Hashable) -> list[TraceCall]:
        """The episode's calls in order (empty for an unknown episode)."""
        with self._lock:
            return list(self._calls.get(episode_id, []))

    def rows(self, episode_id: Hashable) -> list[TraceRow]:
        """The episode's training rows (:func:`trace_rows` of its calls)."""
        return trace_rows(self.calls(episode_id))

    def pop(self, episode_id: Hashable) -> list[TraceCall]:
        """Remove the episode and return its calls (empty for an unknown episode)."""
        with self._lock:
            return self._calls.pop(episode_id, [])

    def clear(self, episode_ids: Iterable[Hashable] | None = None) -> None:
        """Forget these episodes (all of them with ``None``)."""
        with self._lock:
            if episode_ids is None:
                self._calls.clear()
            for key in episode_ids or ():
                self._calls.pop(key, None)
