"""Timing harness shared by the benchmarks: medians, ratios, machine description."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class Timing:
    """Wall-clock samples of one callable, in seconds."""

    samples: list[float]

    @property
    def median(self) -> float:
        """Median of the samples."""
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        """Inter-quartile range of the samples (0 with fewer than two)."""
        if len(self.samples) < 2:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]


@dataclass
class Row:
    """One line of a benchmark table: a case, a variant, its timing and ratios."""

    bench: str
    case: str
    variant: str
    timing: Timing
    baseline: str | None = None
    ratio_to_baseline: float | None = None
    floor: str | None = None
    ratio_to_floor: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the median and IQR spelled out."""
        d = asdict(self)
        d["median_s"] = self.timing.median
        d["iqr_s"] = self.timing.iqr
        return d


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], object],
    *,
    repeats: int = 20,
    warmup: int = 3,
    device: torch.device | None = None,
) -> Timing:
    """Time ``fn()`` ``repeats`` times after ``warmup`` discarded calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return Timing(samples)


def with_ratios(rows: list[Row], baseline: str, floor: str | None = None) -> list[Row]:
    """Fill each row's ratio to the ``baseline`` (and ``floor``) variant of the same case."""
    by_case = {(r.case, r.variant): r for r in rows}
    for r in rows:
        base = by_case.get((r.case, baseline))
        if base is not None:
            r.baseline, r.ratio_to_baseline = baseline, r.timing.median / base.timing.median
        low = by_case.get((r.case, floor)) if floor else None
        if low is not None:
            r.floor, r.ratio_to_floor = floor, r.timing.median / low.timing.median
    return rows


def with_memory_ratios(rows: list[Row], baseline: str) -> list[Row]:
    """Add ``mem_vs_<baseline>``: each row's ``peak_extra_MiB`` over its case's baseline's."""
    by_case = {(r.case, r.variant): r for r in rows}
    for r in rows:
        base = by_case.get((r.case, baseline))
        if base is not None and r.extra.get("peak_extra_MiB") and base.extra.get("peak_extra_MiB"):
            r.extra[f"mem_vs_{baseline}"] = round(
                r.extra["peak_extra_MiB"] / base.extra["peak_extra_MiB"], 3
            )
    return rows


def status_kib(field: str) -> int:
    """A field of Linux's ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``), 0 if absent."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
