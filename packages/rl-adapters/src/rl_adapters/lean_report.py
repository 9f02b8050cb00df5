"""What the lean forwards serve on a model, and what runs the library's own forward (and why).

:class:`~rl_adapters.PolicyModel` (``lean_forwards="auto"`` or True) surveys its model once
(:func:`rl_adapters.lean_survey.survey`),
when it is built (and again when its adapters are rebuilt), with the same checks the swaps run:
which lean forward (``"lora"``, ``"rotary"``, ``"rms_norm"``, ``"swiglu"``) is set on how many
modules of which classes, and which candidates keep peft's or transformers' own forward, with
the reason. The result is a :class:`LeanReport` (``policy.lean_report``, in rl-algos
``agent.lean_report``), logged once with this module's logger: the summary at INFO, each
fallback caused by a missing or renamed library internal (:mod:`rl_adapters._compat`) at
WARNING.

The survey is of the model as built. A check that depends on the call (an input dtype,
autocast, dropout in training mode, a trained base weight) is made again at each call, and a
call it fails runs the library's own forward; the report does not count those.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "LeanFallback",
    "LeanForwards",
    "LeanReport",
    "LeanSwap",
    "check_lean_forwards",
    "log_report",
    "make_report",
]

logger = logging.getLogger(__name__)

#: The ``lean_forwards`` option: ``"auto"`` (where the checks pass), True (the same, and
#: raise where nothing passes), False (peft's and transformers' own forwards everywhere).
LeanForwards = Literal["auto"] | bool

#: The lean forwards, in the order they are reported.
FORWARDS = ("lora", "rotary", "rms_norm", "swiglu")


def check_lean_forwards(value: Any) -> LeanForwards:
    """``value`` as a ``lean_forwards`` option.

    Raises:
        ValueError: Anything but ``"auto"``, True or False (names the argument).
    """
    if value == "auto" or isinstance(value, bool):
        return value  # type: ignore[no-any-return]
    raise ValueError(
        f"`lean_forwards` must be 'auto' (lean forwards where they apply), True (the same, and "
        f"raise where none applies) or False (peft's and transformers' own), got {value!r}"
    )


@dataclass(frozen=True)
class LeanSwap:
    """One lean forward and the modules it is set on."""

    forward: str
    """``"lora"``, ``"rotary"``, ``"rms_norm"`` or ``"swiglu"``."""
    modules: int
    """How many modules run it (for ``"rotary"``: modeling modules whose function is swapped)."""
    classes: tuple[str, ...]
    """Their class names (for ``"rotary"``: the modeling modules' names), sorted."""


@dataclass(frozen=True)
class LeanFallback:
    """Candidates of one lean forward that run the library's own forward, and why."""

    forward: str
    """``"lora"``, ``"rotary"``, ``"rms_norm"`` or ``"swiglu"``."""
    target: str
    """The class (or modeling module) name of the candidates."""
    modules: int
    """How many candidates."""
    reason: str
    """Why they keep their own forward."""
    unexpected: bool = False
    """A library internal the lean forward reads is missing or renamed (logged as a warning);
    False for an expected variant (DoRA, Gemma's norm, GeGLU, ...)."""


@dataclass(frozen=True)
class LeanReport:
    """What the lean forwards serve on one model (:mod:`rl_adapters.lean_report`)."""

    mode: LeanForwards
    """The ``lean_forwards`` option it was made under."""
    model: str
    """The model's class name."""
    swapped: tuple[LeanSwap, ...] = ()
    """The lean forwards set on the model, in :data:`FORWARDS` order (empty with False)."""
    fallbacks: tuple[LeanFallback, ...] = ()
    """The candidates that keep the library's own forward."""

    @property
    def forwards(self) -> tuple[str, ...]:
        """The names of the lean forwards that run (``("lora", "rotary", ...)``)."""
        return tuple(s.forward for s in self.swapped)

    def modules(self, forward: str) -> int:
        """How many modules run the lean ``forward`` (0 when it runs nowhere)."""
        return sum(s.modules for s in self.swapped if s.forward == forward)

    def summary(self) -> str:
        """One line: what was swapped, what fell back and why."""
        if self.mode is False:
            return f"{self.model}: lean forwards off (lean_forwards=False)"
        done = "; ".join(
            f"{s.forward} on {s.modules} ({', '.join(s.classes)})" for s in self.swapped
        )
        line = f"{self.model}: lean forwards {done or 'nowhere'}"
        if self.fallbacks:
            rest = "; ".join(
                f"{f.forward} {f.target} x{f.modules}: {f.reason}" for f in self.fallbacks
            )
            line += f"; own forward for {rest}"
        return line


def make_report(
    mode: LeanForwards,
    model: Any,
    parts: Iterable[tuple[LeanSwap | None, list[LeanFallback]]],
) -> LeanReport:
    """The report of ``model`` from each lean forward's survey ``(swap or None, fallbacks)``."""
    swapped: list[LeanSwap] = []
    fallbacks: list[LeanFallback] = []
    for swap, fell in parts:
        if swap is not None and swap.modules:
            swapped.append(swap)
        fallbacks += fell
    return LeanReport(mode, type(model).__name__, tuple(swapped), tuple(fallbacks))


def log_report(report: LeanReport) -> None:
    """Log ``report``: the summary at INFO, each unexpected fallback at WARNING."""
    from rl_adapters import _compat

    logger.info("%s", report.summary())
    for f in report.fallbacks:
        if f.unexpected:
            _compat.first_warning(f.reason)  # the forwards' own reads do not repeat it
            logger.warning(
                "lean %s falls back to the library's own forward on %d %s module(s): %s (%s)",
                f.forward,
                f.modules,
                f.target,
                f.reason,
                _compat.library_versions(),
            )


def group_fallbacks(forward: str, entries: Iterable[tuple[str, str, bool]]) -> list[LeanFallback]:
    """:class:`LeanFallback` records from ``(target, reason, unexpected)`` per module, counted."""
    counts: dict[tuple[str, str, bool], int] = {}
    for entry in entries:
        counts[entry] = counts.get(entry, 0) + 1
    return [LeanFallback(forward, t, n, r, u) for (t, r, u), n in counts.items()]


def count_swap(forward: str, classes: Iterable[str]) -> LeanSwap:
    """A :class:`LeanSwap` of the modules whose class names are ``classes`` (one per module)."""
    names = list(classes)
    return LeanSwap(forward, len(names), tuple(sorted(set(names))))
