"""Experiment trackers beside the run directory's files: W&B, MLflow and trackio (``report_to``).

``report_to`` takes TRL's names: a list of ``tensorboard``, ``wandb``, ``mlflow``, ``trackio``, or
``"none"`` (files and console only) or ``"all"`` (TensorBoard and every tracker installed). Each
tracker's package is optional, installed through an extra (``pip install 'rl-train[mlflow]'``)
and imported only when named; a missing one fails with the extra to install, before training.

Where each run goes (the run directory is ``run_dir``, the run's name its last part):

- ``wandb``: ``wandb.init(project=project, name=..., dir=run_dir)``; offline (no account, files
  under ``run_dir/wandb/offline-run-*``) with ``WANDB_MODE=offline``, synced later with
  ``wandb sync``.
- ``mlflow``: ``MLFLOW_TRACKING_URI`` if set, else a SQLite store ``run_dir/mlflow.db``
  (MLflow 3 refuses its old file store); experiment ``project``. Read it back with
  ``mlflow.tracking.MlflowClient("sqlite:///run_dir/mlflow.db")`` or ``mlflow ui
  --backend-store-uri ...``.
- ``trackio``: its local SQLite store in ``TRACKIO_DIR`` (set to ``run_dir/trackio`` when
  unset and trackio is not yet imported; trackio reads the variable once, at import);
  ``trackio show --project project``.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["TRACKERS", "Tracker", "check_report_to", "open_tracker", "resolve_report_to"]

#: Every name ``report_to`` takes -> the module it needs (None: always there).
TRACKERS: dict[str, str | None] = {
    "tensorboard": None,
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
}


class Tracker(Protocol):
    """What :class:`~rl_train.metrics.MetricsLogger` sends each row to."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step``."""

    def close(self) -> None:
        """Flush and finish the run."""


def _installed(name: str) -> bool:
    module = TRACKERS[name]
    return module is None or importlib.util.find_spec(module) is not None


def resolve_report_to(report_to: str | Sequence[str] | None) -> list[str]:
    """The tracker names of a ``report_to`` value (TRL's convention).

    Args:
        report_to: A name, a list of names, ``"none"`` or ``"all"`` (TensorBoard and every
            tracker installed); None: ``["tensorboard"]``.

    Returns:
        The names, in :data:`TRACKERS` order, without duplicates.

    Raises:
        ValueError: An unknown name (with the nearest valid one).
    """
    if report_to is None:
        return ["tensorboard"]
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return [name for name in TRACKERS if _installed(name)]
    for name in names:
        if name not in TRACKERS:
            close = difflib.get_close_matches(str(name), list(TRACKERS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"report_to: unknown tracker {name!r}{hint} Choose from "
                f"{', '.join(TRACKERS)}, or 'none' / 'all'"
            )
    return [name for name in TRACKERS if name in names]


def check_report_to(report_to: str | Sequence[str] | None) -> list[str]:
    """:func:`resolve_report_to`, and each named tracker's package installed (nothing imported).

    Raises:
        ValueError: An unknown name, or a tracker whose package is missing (naming the extra).
    """
    names = resolve_report_to(report_to)
    for name in names:
        if not _installed(name):
            raise ValueError(
                f"report_to names {name!r} but {TRACKERS[name]} is not installed: install the "
                f"extra, pip install 'rl-train[{name}]' (or uv sync --extra {name})"
            )
    return names


def open_tracker(name: str, run_dir: Path, project: str, *, resume: bool = False) -> Tracker:
    """Start the tracker ``name`` (not ``tensorboard``, which the logger writes itself).

    Args:
        name: ``wandb``, ``mlflow`` or ``trackio``.
        run_dir: The run directory (the run is named after its last part).
        project: W&B project, MLflow experiment, trackio project.
        resume: Continue the run of this name where the tracker can.

    Returns:
        The open tracker.
    """
    check_report_to([name])
    if name == "wandb":
        return WandbTracker(run_dir, project, resume=resume)
    if name == "mlflow":
        return MlflowTracker(run_dir, project, resume=resume)
    if name == "trackio":
        return TrackioTracker(run_dir, project, resume=resume)
    raise ValueError(f"open_tracker: {name!r} is written by the logger itself, not a tracker")


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}


class WandbTracker:
    """A Weights & Biases run in ``run_dir/wandb`` (offline with ``WANDB_MODE=offline``)."""

    def __init__(self, run_dir: Path, project: str, *, resume: bool = False) -> None:
        import wandb

        try:
            self.run = wandb.init(
                project=project,
                name=run_dir.resolve().name,
                dir=str(run_dir),
                resume="allow" if resume else None,
            )
        except wandb.errors.UsageError as exc:  # no account: say how to go offline
            raise ValueError(
                f"report_to wandb: {exc} Or set WANDB_MODE=offline to write the run under "
                f"{run_dir / 'wandb'} without an account (upload it later with `wandb sync`)"
            ) from exc

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """``run.log(metrics, step=step)``."""
        self.run.log(_finite(metrics), step=step)

    def close(self) -> None:
        """``run.finish()``."""
        self.run.finish()


class MlflowTracker:
    """An MLflow run (``MLFLOW_TRACKING_URI``, else SQLite in ``run_dir/mlflow.db``)."""

    def __init__(self, run_dir: Path, project: str, *, resume: bool = False) -> None:
        from mlflow.tracking import MlflowClient

        del resume  # a resumed run is a new MLflow run of the same name
        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or (
            f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        )
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(project)
        )
        self.run_id: str = self.client.create_run(
            experiment_id, run_name=run_dir.resolve().name
        ).info.run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One ``log_batch`` of the finite values."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in _finite(metrics).items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        """Mark the run finished."""
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    """A trackio run in its local store (``TRACKIO_DIR``; default here ``run_dir/trackio``)."""

    def __init__(self, run_dir: Path, project: str, *, resume: bool = False) -> None:
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str((run_dir / "trackio").resolve())
        import trackio

        self.directory = Path(trackio.utils.TRACKIO_DIR)
        self.run = trackio.init(
            project=project,
            name=run_dir.resolve().name,
            resume="allow" if resume else "never",
            embed=False,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """``run.log(metrics, step=step)``."""
        self.run.log(_finite(metrics), step=step)

    def close(self) -> None:
        """``run.finish()`` (writes the queued rows)."""
        self.run.finish()
