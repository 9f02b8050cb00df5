"""The survey of a model's lean forwards: :class:`~rl_adapters.lean_report.LeanReport`.

Apart from :mod:`rl_adapters.lean_report` because it asks each lean forward's module, and those
modules record their findings with :mod:`~rl_adapters.lean_report`'s records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_adapters import lean_mlp, lean_norm, lean_rotary
from rl_adapters.lean_report import LeanForwards, LeanReport, log_report, make_report

if TYPE_CHECKING:
    from rl_adapters.roles import LoraSites

__all__ = ["survey"]


def survey(mode: LeanForwards, model: Any, sites: LoraSites | None = None) -> LeanReport:
    """The :class:`LeanReport` of ``model`` under ``mode``, logged (:func:`log_report`).

    Args:
        mode: The ``lean_forwards`` option; False surveys nothing.
        model: The transformers model (LoRA layers injected).
        sites: Its :class:`~rl_adapters.roles.LoraSites`, or None without LoRA.

    Raises:
        ValueError: ``mode`` True and no lean forward applies (names the option and the
            reasons).
    """
    parts = []
    if mode is not False:
        parts = [
            *([sites.survey("actor")] if sites is not None else []),
            lean_rotary.survey(model),
            lean_norm.survey(model),
            lean_mlp.survey(model),
        ]
    report = make_report(mode, model, parts)
    if mode is True and not report.swapped:
        reasons = (
            "; ".join(f"{f.forward} {f.target}: {f.reason}" for f in report.fallbacks)
            or "no LoRA layer, rotary, RMSNorm or gated MLP found"
        )
        raise ValueError(
            f"lean_forwards=True: no lean forward applies to {type(model).__name__} ({reasons}); "
            "pass lean_forwards='auto' (own forwards where none applies) or False"
        )
    log_report(report)
    return report
