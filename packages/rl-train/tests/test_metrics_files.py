"""MetricsLogger's CSV and JSONL hold every logged row, also across new columns and resumes.

The CSV is appended row by row and rewritten only when a row brings a new column (or after a
truncation), so a long run does not rewrite the whole file at every step.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from rl_train import MetricsLogger
from rl_train.hooks import MetricsLog


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _as_csv(rows: list[dict[str, float]]) -> list[dict[str, str]]:
    fields = sorted({k for r in rows for k in r} - {"step"})
    return [{k: ("" if k not in r else str(r[k])) for k in ["step", *fields]} for r in rows]


def test_csv_and_jsonl_hold_every_row_across_new_columns_and_resume(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"loss": 1.5})
    logger.log(2, {"loss": 1.25})
    logger.log(3, {"loss": 1.0, "kl": 0.5})  # a new column: earlier rows get it empty
    logger.log(4, {"kl": 0.25})  # a missing column: empty in this row
    expected = [
        {"step": 1, "loss": 1.5},
        {"step": 2, "loss": 1.25},
        {"step": 3, "loss": 1.0, "kl": 0.5},
        {"step": 4, "kl": 0.25},
    ]
    assert MetricsLogger.read(tmp_path / "metrics.jsonl") == expected
    assert _csv_rows(tmp_path / "metrics.csv") == _as_csv(expected)
    logger.close()

    resumed = MetricsLogger(tmp_path, tensorboard=False, resume=True)
    resumed.truncate(2)  # resuming from the checkpoint of step 2
    resumed.log(3, {"loss": 0.75, "entropy": 2.0})
    resumed.log(4, {"loss": 0.5})
    expected = [*expected[:2], {"step": 3, "loss": 0.75, "entropy": 2.0}, {"step": 4, "loss": 0.5}]
    assert MetricsLogger.read(tmp_path / "metrics.jsonl") == expected
    assert _csv_rows(tmp_path / "metrics.csv") == _as_csv(expected)
    resumed.close()


def test_tensorboard_scalars_are_all_written_by_close(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.tb_flush_s = 3600.0  # no flush during the run: close() must write everything
    for step in range(1, 6):
        logger.log(step, {"loss": 1.0 / step})
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4, 5]


def test_a_missing_tensorboard_or_matplotlib_is_an_error_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both are rl-train's dependencies; a broken install says which and the fix when the run
    starts (the curve is drawn at the end), not silently or after the training."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ValueError, match=r"report_to.*pip install tensorboard"):
        MetricsLogger(tmp_path / "tb")
    MetricsLogger(tmp_path / "none", report_to="none").close()  # the way around it

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match=r"matplotlib.*plot=False"):
        MetricsLog(None, curve=tmp_path / "reward_curve.png")
    MetricsLog(None, curve=None)


def test_the_curve_has_whole_steps_and_plots_what_an_offline_run_computes(tmp_path: Path) -> None:
    """A 3-step run's x axis has no fractional steps; offline training (logged rewards, not
    earned) plots its evaluations, or its loss when it has none."""
    import matplotlib.pyplot as plt
    from rl_train.metrics import curve_figure, plot_reward_curve

    rows = [{"step": s, "mean_reward": 0.1 * s, "loss": 1.0 / s} for s in (1, 2, 3)]
    rows[-1]["eval_accuracy"] = 0.5
    fig = curve_figure(rows)
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert [line.get_label() for line in ax.get_lines()] == [
        "train reward",
        "greedy accuracy (test)",
    ]
    plt.close(fig)

    fig = curve_figure(rows, "offline", train_reward=False)
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["greedy accuracy (test)"]
    assert fig.axes[0].get_ylabel() == "accuracy"
    plt.close(fig)
    fig = curve_figure([{k: v for k, v in r.items() if k != "eval_accuracy"} for r in rows],
                       "offline", train_reward=False)  # fmt: skip
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["training loss"]
    assert fig.axes[0].get_ylabel() == "loss"
    plt.close(fig)
    assert plot_reward_curve(rows, tmp_path / "c.png") == tmp_path / "c.png"
    assert (tmp_path / "c.png").is_file()


def test_a_metric_is_the_mean_over_the_agents_that_report_it() -> None:
    """An agent that took no step (DAPO with every group filtered) reports no loss: the row's
    loss is the others' mean, not pulled towards 0 by a missing value."""
    import torch
    from rl_train.experience import StepOutput
    from rl_train.loop import step_row

    outputs = [
        StepOutput({"loss": 0.5, "kept_groups": 2.0}, torch.tensor([1.0, 0.0])),
        StepOutput({"kept_groups": 0.0}, torch.tensor([0.0, 0.0])),
        StepOutput({"loss": 1.5, "kept_groups": 1.0}, torch.tensor([1.0, 1.0])),
    ]
    row = step_row(outputs, ("loss", "kept_groups", "grad_norm"), 0.25)
    assert row == {"loss": 1.0, "kept_groups": 1.0, "mean_reward": 0.5, "step_time": 0.25}
