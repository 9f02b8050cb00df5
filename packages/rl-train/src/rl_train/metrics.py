"""Metrics to the console, CSV, JSONL, TensorBoard and the trackers of ``report_to``.

The trackers (W&B, MLflow, trackio) are in :mod:`rl_train.trackers`; the reward-curve PNG is
drawn by :func:`plot_reward_curve`.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any

from rl_train.collective import is_main_process
from rl_train.trackers import ReportTo, Tracker, check_report_to, custom_trackers, open_tracker

__all__ = ["MetricsLogger", "NullLogger", "curve_figure", "open_logger", "plot_reward_curve"]


class MetricsLogger:
    """Writes one row per logged step to ``metrics.jsonl`` and ``metrics.csv`` in ``run_dir``.

    TensorBoard event files go to ``run_dir/tensorboard`` (when the ``tensorboard`` package is
    importable), flushed at most every :attr:`tb_flush_s` seconds and on :meth:`close`;
    the trackers of ``report_to`` (W&B, MLflow, trackio, ClearML) get every row too. The JSONL
    and CSV files get each row as it is logged (the CSV is rewritten only when a new column
    appears).

    Args:
        run_dir: The run directory (created).
        tensorboard: Also write TensorBoard scalars (when ``report_to`` is None).
        wandb_project: A W&B project name to log to, or None (when ``report_to`` is None).
        resume: Keep the existing files and append (a resumed run). A tracker that continues
            its run (``continued`` True: :mod:`rl_train.trackers`) gets only the steps after
            the last one it got (a resumed run computes the steps after its checkpoint again:
            it keeps the first values); one that starts a new run gets the rows kept
            (:meth:`truncate`) first, then every step.
        report_to: TRL's ``report_to``: ``tensorboard``, ``wandb``, ``mlflow``, ``trackio``,
            ``clearml`` (a name or a list), ``"none"`` or ``"all"``; replaces ``tensorboard`` and
            ``wandb_project``. Objects with ``log(step, metrics)`` and ``close()`` in the list
            are trackers of your own (process 0 calls them). See :mod:`rl_train.trackers`.
        project: The trackers' project (W&B project, MLflow experiment, trackio project,
            ClearML project).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        resume: bool = False,
        report_to: ReportTo = None,
        project: str = "rl-train",
    ) -> None:
        if report_to is not None:
            names = check_report_to(report_to)
            tensorboard = "tensorboard" in names
            wandb_project = None
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.csv = self.run_dir / "metrics.csv"
        if not resume:
            for path in (self.jsonl, self.csv):
                path.unlink(missing_ok=True)
        self.history: list[dict[str, Any]] = self.read(self.jsonl) if resume else []
        #: The last step the trackers got before the run was resumed (-1: none): they continue
        #: their run, and the steps computed again after the checkpoint are not sent twice.
        self.tracked_through = max((int(r["step"]) for r in self.history), default=-1)
        self._replay_pending = resume  # at the first row or close (after truncate())
        self._csv_fields: list[str] | None = None  # the CSV's columns; None: rewrite it
        self.tb_flush_s = 5.0
        self._tb_flushed = time.monotonic()
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # a dependency of rl-train: a broken install
                raise ValueError(
                    "report_to includes 'tensorboard' (the default) but TensorBoard does not "
                    f"import ({exc}): pip install tensorboard, or pass report_to='none' (YAML: "
                    "train.report_to: none)"
                ) from exc
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        self.trackers: list[Tracker] = []
        if wandb_project is not None:  # finetune_llm_reasoning(wb=True)
            self.trackers.append(open_tracker("wandb", self.run_dir, wandb_project, resume=resume))
        if report_to is not None:
            self.trackers += [
                open_tracker(name, self.run_dir, project, resume=resume)
                for name in names
                if name != "tensorboard"
            ]
            self.trackers += custom_trackers(report_to)

    @staticmethod
    def read(path: str | Path) -> list[dict[str, Any]]:
        """The rows of a ``metrics.jsonl`` file (empty if missing)."""
        p = Path(path)
        if not p.is_file():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def _replay(self) -> None:
        """After a resume, the trackers that started a new run get the rows kept so far."""
        if not self._replay_pending:
            return
        self._replay_pending = False
        for tracker in self.trackers:
            if not getattr(tracker, "continued", False):
                for r in self.history:
                    tracker.log(int(r["step"]), {k: v for k, v in r.items() if k != "step"})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step`` everywhere."""
        self._replay()
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._csv_fields is not None and set(row) - {"step"} <= set(self._csv_fields):
            with self.csv.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=["step", *self._csv_fields]).writerow(row)
        else:  # a new column (or a first or resumed write): the whole file again
            self._csv_fields = sorted({k for r in self.history for k in r} - {"step"})
            with self.csv.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=["step", *self._csv_fields])
                writer.writeheader()
                for r in self.history:
                    writer.writerow(r)
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            if time.monotonic() - self._tb_flushed >= self.tb_flush_s:
                self._tb.flush()
                self._tb_flushed = time.monotonic()
        for tracker in self.trackers:
            if step > self.tracked_through or not getattr(tracker, "continued", False):
                tracker.log(step, {k: v for k, v in row.items() if k != "step"})

    def truncate(self, step: int) -> None:
        """Drop rows after ``step`` (resuming from a checkpoint written at ``step``; 0: all).

        TensorBoard hides the events after ``step`` too (``SummaryWriter(purge_step=)``), so
        the steps the resumed run computes again are shown once.
        """
        self.history = [r for r in self.history if r["step"] <= step]
        self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        self._csv_fields = None  # the CSV is rewritten at the next row
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb.close()
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=step + 1)

    def close(self) -> None:
        """Flush and close the writers."""
        self._replay()
        if self._tb is not None:
            self._tb.close()
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


class NullLogger:
    """The metrics logger of processes other than 0: keeps the history, writes nothing."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step`` in :attr:`history` only."""
        self.history.append({"step": step, **metrics})

    def truncate(self, step: int) -> None:
        """Drop rows after ``step``."""
        self.history = [r for r in self.history if r["step"] <= step]

    def close(self) -> None:
        """Nothing to close."""


def open_logger(
    run_dir: str | Path,
    *,
    tensorboard: bool = True,
    wandb_project: str | None = None,
    resume: bool = False,
    report_to: ReportTo = None,
    project: str = "rl-train",
) -> MetricsLogger | NullLogger:
    """A :class:`MetricsLogger` on process 0, a :class:`NullLogger` on the others.

    Args:
        run_dir: The run directory.
        tensorboard: Also write TensorBoard scalars.
        wandb_project: A W&B project name, or None.
        resume: Keep the existing files and append.
        report_to: The trackers (see :class:`MetricsLogger`); None: ``tensorboard`` and
            ``wandb_project`` decide.
        project: The trackers' project.

    Returns:
        The logger of this process.
    """
    if not is_main_process():
        return NullLogger()
    return MetricsLogger(
        run_dir,
        tensorboard=tensorboard,
        wandb_project=wandb_project,
        resume=resume,
        report_to=report_to,
        project=project,
    )


def plot_reward_curve(
    history: list[dict[str, Any]],
    path: str | Path,
    title: str = "reward",
    *,
    train_reward: bool = True,
) -> Path | None:
    """Plot the run's curves against the step (whole steps on the x axis) to a PNG.

    ``mean_reward`` (the training reward) with ``eval_accuracy`` / ``fitness`` (the
    evaluations) where present; a run without any of them (offline training without
    evaluations) plots its ``loss``.

    Args:
        history: The metrics rows (``{"step": n, ...}``).
        path: The PNG to write.
        title: The plot's title.
        train_reward: Plot ``mean_reward`` (False for offline training, whose batches'
            rewards were logged, not earned by the model).

    Returns:
        ``path``, or None when no row has anything to plot.
    """
    import matplotlib.pyplot as plt

    fig = curve_figure(history, title, train_reward=train_reward)
    if fig is None:
        return None
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def curve_figure(
    history: list[dict[str, Any]], title: str = "reward", *, train_reward: bool = True
) -> Any:
    """The matplotlib figure of :func:`plot_reward_curve` (None: nothing to plot).

    Args:
        history: The metrics rows.
        title: The plot's title.
        train_reward: Plot ``mean_reward``.

    Returns:
        A ``matplotlib.figure.Figure`` with one axes, or None.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    series = [
        ("mean_reward", "train reward", None),
        ("eval_accuracy", "greedy accuracy (test)", "o"),
        ("fitness", "test reward", "o"),
    ]
    if not train_reward:
        series = series[1:]
    shown = [s for s in series if any(s[0] in r for r in history)]
    if not shown and any("loss" in r for r in history):
        shown = [("loss", "training loss", None)]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, marker in shown:
        pts = [(r["step"], r[key]) for r in history if key in r]
        ax.plot(*zip(*pts, strict=True), marker=marker, label=label)
    keys = {key for key, _, _ in shown}
    ylabel = "loss" if keys == {"loss"} else "accuracy" if keys == {"eval_accuracy"} else "reward"
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
