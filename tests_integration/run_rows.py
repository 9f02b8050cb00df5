"""Runs compared row by row: the demo's small settings and its metrics rows without timings."""

from __future__ import annotations

from pathlib import Path

from rl_train import MetricsLogger

#: A demo small enough for several runs per test (80 questions, 4 prompts x 4 samples a step).
SMALL = {"n_train": 80, "n_test": 8, "prompts_per_step": 4, "group_size": 4}


def metric_rows(run_dir: Path) -> list[dict[str, float]]:
    """The run's ``metrics.jsonl`` rows without ``step_time`` (the one wall-clock column)."""
    rows = MetricsLogger.read(run_dir / "metrics.jsonl")
    for row in rows:
        row.pop("step_time")
    return rows


def sync_part(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The rows without the asynchronous loop's own columns (``async_*``)."""
    return [{k: v for k, v in r.items() if not k.startswith("async_")} for r in rows]
