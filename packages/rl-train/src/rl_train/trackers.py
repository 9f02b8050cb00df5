"""Experiment trackers beside the run directory's files: W&B, MLflow, trackio, ClearML.

``report_to`` takes TRL's names: a list of ``tensorboard``, ``wandb``, ``mlflow``, ``trackio``,
``clearml``, or ``"none"`` (files and console only) or ``"all"`` (TensorBoard and every tracker
installed); objects with ``log(step, metrics)`` and ``close()`` (:class:`Tracker`) in the list
are a user's own trackers (SwanLab, Comet, ...) and get every row too. Each named tracker's
package is optional, installed through an extra (``pip install 'rl-train[mlflow]'``) and
imported only when named; a missing one fails with the extra to install, before training.

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
- ``clearml``: ``Task.init(project_name=project, task_name=...)`` with every automatic hook off
  (no framework, argparse, console or resource patching: only the scalars we send), reporting
  from a thread rather than ClearML's forked subprocess (``RL_TRAIN_CLEARML_SUBPROCESS=1`` keeps
  the fork; :func:`_report_from_a_thread` says why); the server
  of ``clearml.conf`` / ``CLEARML_API_*``; offline (a session folder and zip under ClearML's
  cache, ``offline/<task id>``) with ``CLEARML_OFFLINE_MODE=1``, imported later with
  ``Task.import_offline_session``. Without a configured server and not offline it refuses:
  ClearML would otherwise send the run to its public demo server.

A resumed run (``train.resume=true``) continues the tracker's run where the tracker can: W&B
(the run id) and MLflow (the run id, same tracking URI) from ``run_dir/trackers.json``, written
when the run starts; trackio by the run's name. ClearML starts a new task of the same name.
The steps the resumed run computes again (after its checkpoint) are not sent a second time
(:class:`rl_train.metrics.MetricsLogger`).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "TRACKERS",
    "ReportTo",
    "Tracker",
    "check_report_to",
    "custom_trackers",
    "open_tracker",
    "resolve_report_to",
]

_log = logging.getLogger(__name__)

#: Every name ``report_to`` takes -> the module it needs (None: always there).
TRACKERS: dict[str, str | None] = {
    "tensorboard": None,
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
    "clearml": "clearml",
}


class Tracker(Protocol):
    """What :class:`~rl_train.metrics.MetricsLogger` sends each row to.

    An optional ``continued`` attribute (True: in a resumed run, the tracker continues the run
    it had, which holds the steps logged before) makes the logger send only the steps after
    those; without it, a resumed run sends the tracker the rows kept so far first.
    """

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step``."""

    def close(self) -> None:
        """Flush and finish the run."""


#: What ``report_to`` takes: a name, a :class:`Tracker` object, a list of both, or None.
ReportTo = str | Tracker | Sequence[str | Tracker] | None


def _is_tracker(value: object) -> bool:
    return not isinstance(value, str) and all(
        callable(getattr(value, m, None)) for m in ("log", "close")
    )


def _names(report_to: ReportTo) -> str | list[str] | None:
    """The names of ``report_to`` (its :class:`Tracker` objects left out)."""
    if report_to is None or isinstance(report_to, str):
        return report_to
    items = [report_to] if _is_tracker(report_to) else list(report_to)  # type: ignore[arg-type]
    for item in items:
        if not isinstance(item, str) and not _is_tracker(item):
            raise ValueError(
                f"report_to: {item!r} is neither a tracker name nor an object with log(step, "
                "metrics) and close() methods (rl_train.trackers.Tracker)"
            )
    return [item for item in items if isinstance(item, str)]


def custom_trackers(report_to: ReportTo) -> list[Tracker]:
    """The :class:`Tracker` objects of ``report_to`` (a user's own trackers), in order."""
    if report_to is None or isinstance(report_to, str):
        return []
    if _is_tracker(report_to):
        return [report_to]  # type: ignore[list-item]
    return [item for item in report_to if _is_tracker(item)]  # type: ignore[union-attr,misc]


def _installed(name: str) -> bool:
    module = TRACKERS[name]
    return module is None or importlib.util.find_spec(module) is not None


def resolve_report_to(report_to: ReportTo) -> list[str]:
    """The tracker names of a ``report_to`` value (TRL's convention).

    Args:
        report_to: A name, a list of names, ``"none"`` or ``"all"`` (TensorBoard and every
            tracker installed); None: ``["tensorboard"]``. :class:`Tracker` objects in it
            (:func:`custom_trackers`) are not names and are left out: ``[my_tracker]`` alone
            is no named tracker, ``["tensorboard", my_tracker]`` is TensorBoard.

    Returns:
        The names, in :data:`TRACKERS` order, without duplicates.

    Raises:
        ValueError: An unknown name (with the nearest valid one).
    """
    given = _names(report_to)
    if given is None:
        return ["tensorboard"]
    names = [given] if isinstance(given, str) else given
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


def check_report_to(report_to: ReportTo) -> list[str]:
    """:func:`resolve_report_to`, with each named tracker's package installed (none imported).

    For ``clearml``, also a destination other than ClearML's public demo server.

    Raises:
        ValueError: An unknown name, a tracker whose package is missing (naming the extra), or
            ``clearml`` with no configured server and not offline.
    """
    names = resolve_report_to(report_to)
    for name in names:
        if not _installed(name):
            raise ValueError(
                f"report_to names {name!r} but {TRACKERS[name]} is not installed: install the "
                f"extra, pip install 'rl-train[{name}]' (or uv sync --extra {name})"
            )
    if "clearml" in names:
        _check_clearml_destination()
    return names


def open_tracker(name: str, run_dir: Path, project: str, *, resume: bool = False) -> Tracker:
    """Start the tracker ``name`` (not ``tensorboard``, which the logger writes itself).

    Args:
        name: ``wandb``, ``mlflow``, ``trackio`` or ``clearml``.
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
    if name == "clearml":
        return ClearMLTracker(run_dir, project, resume=resume)
    raise ValueError(f"open_tracker: {name!r} is written by the logger itself, not a tracker")


#: The file in the run directory that holds each tracker's run id, for a resumed run.
STATE_FILE = "trackers.json"


def _remembered(run_dir: Path, name: str) -> dict[str, Any] | None:
    """What tracker ``name`` stored for its run in ``run_dir/trackers.json`` (None: nothing)."""
    path = run_dir / STATE_FILE
    if not path.is_file():
        return None
    entry = json.loads(path.read_text()).get(name)
    return entry if isinstance(entry, dict) else None


def _remember(run_dir: Path, name: str, entry: dict[str, Any]) -> None:
    """Store ``entry`` as tracker ``name``'s in ``run_dir/trackers.json``.

    The file is replaced whole: a crash while writing leaves the previous one.
    """
    path = run_dir / STATE_FILE
    state = json.loads(path.read_text()) if path.is_file() else {}
    state[name] = entry
    tmp = path.with_name(f".{STATE_FILE}.tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}


class WandbTracker:
    """A Weights & Biases run in ``run_dir/wandb`` (offline with ``WANDB_MODE=offline``)."""

    def __init__(self, run_dir: Path, project: str, *, resume: bool = False) -> None:
        import wandb

        previous = _remembered(run_dir, "wandb") if resume else None
        run_id = None if previous is None else str(previous["id"])
        try:
            self.run = wandb.init(
                project=project,
                name=run_dir.resolve().name,
                dir=str(run_dir),
                id=run_id,
                resume="allow" if run_id is not None else None,
            )
        except wandb.errors.UsageError as exc:  # no account: say how to go offline
            raise ValueError(
                f"report_to wandb: {exc} Or set WANDB_MODE=offline to write the run under "
                f"{run_dir / 'wandb'} without an account (upload it later with `wandb sync`)"
            ) from exc
        _remember(run_dir, "wandb", {"id": self.run.id})
        self.continued = run_id is not None

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

        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or (
            f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        )
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        previous = _remembered(run_dir, "mlflow") if resume else None
        if previous is not None and previous.get("tracking_uri") == self.tracking_uri:
            self.run_id: str = str(previous["run_id"])
            self.client.get_run(self.run_id)  # gone (deleted): MLflow's error names it
            self.client.update_run(self.run_id, status="RUNNING")
            self.continued = True
            return
        self.continued = False
        if previous is not None:
            _log.warning(
                "report_to mlflow: the run was tracked at %s, now MLFLOW_TRACKING_URI is %s: "
                "a new MLflow run",
                previous.get("tracking_uri"),
                self.tracking_uri,
            )
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(project)
        )
        self.run_id = self.client.create_run(
            experiment_id, run_name=run_dir.resolve().name
        ).info.run_id
        _remember(run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": self.tracking_uri})

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
        self.continued = resume  # trackio resumes the run of this name

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """``run.log(metrics, step=step)``."""
        self.run.log(_finite(metrics), step=step)

    def close(self) -> None:
        """``run.finish()`` (writes the queued rows)."""
        self.run.finish()


def _clearml_offline() -> bool:
    return os.environ.get("CLEARML_OFFLINE_MODE", "").strip().lower() in ("1", "true", "yes", "on")


def _clearml_configured() -> bool:
    """A server to send to: ``CLEARML_API_*`` credentials or a ``clearml.conf`` file."""
    if os.environ.get("CLEARML_API_ACCESS_KEY") and os.environ.get("CLEARML_API_SECRET_KEY"):
        return True
    for name in ("CLEARML_CONFIG_FILE", "TRAINS_CONFIG_FILE"):
        if os.environ.get(name) and Path(os.environ[name]).expanduser().is_file():
            return True
    return any((Path.home() / f).is_file() for f in ("clearml.conf", "trains.conf"))


#: ClearML's class attribute for ``sdk.development.report_use_subprocess`` (True on Linux).
_SUBPROCESS_ATTR = "_report_subprocess_enabled"
#: The environment variable that keeps ClearML's own reporting subprocess.
CLEARML_SUBPROCESS_ENV = "RL_TRAIN_CLEARML_SUBPROCESS"
_UNCHANGED, _ABSENT = object(), object()


def _report_from_a_thread(task_class: Any) -> object:
    """Make ClearML report from a thread of this process, not from a forked subprocess.

    On Linux ClearML forks its reporter when the task starts. A process running torch's and
    the other trackers' threads can deadlock in that fork, and ``task.close()`` then waits for
    the child forever (seen in this repository's tests about one run in two). The switch is
    ClearML's class attribute for its own ``report_use_subprocess`` setting, set on
    ``clearml.Task`` for the task's lifetime and restored on close; it is logged, skipped with
    a warning where a release no longer has the attribute, and left alone with
    ``RL_TRAIN_CLEARML_SUBPROCESS=1``.

    Returns:
        The attribute's previous value on ``clearml.Task`` (``_ABSENT``: inherited), or
        ``_UNCHANGED`` where nothing was set.
    """
    if os.environ.get(CLEARML_SUBPROCESS_ENV, "").strip() == "1":
        _log.info("report_to clearml: %s=1: ClearML's subprocess", CLEARML_SUBPROCESS_ENV)
        return _UNCHANGED
    if not hasattr(task_class, _SUBPROCESS_ATTR):
        _log.warning(
            "report_to clearml: this ClearML release has no Task.%s; its own reporting setting "
            "stands (set sdk.development.report_use_subprocess: false in clearml.conf if closing "
            "the task hangs)",
            _SUBPROCESS_ATTR,
        )
        return _UNCHANGED
    previous = task_class.__dict__.get(_SUBPROCESS_ATTR, _ABSENT)
    setattr(task_class, _SUBPROCESS_ATTR, False)
    _log.info(
        "report_to clearml: reporting from a thread, not a forked subprocess (a fork beside "
        "torch's threads can deadlock); %s=1 keeps ClearML's default",
        CLEARML_SUBPROCESS_ENV,
    )
    return previous


def _check_clearml_destination() -> None:
    """Refuse ClearML's default destination: its public demo server (no config, not offline)."""
    if not _clearml_offline() and not _clearml_configured():
        raise ValueError(
            "report_to clearml: no ClearML server is configured (no clearml.conf, no "
            "CLEARML_API_ACCESS_KEY/CLEARML_API_SECRET_KEY), and ClearML would send the run "
            "to its public demo server. Run `clearml-init`, or set CLEARML_OFFLINE_MODE=1 to "
            "keep the run in a local session folder (import it later with "
            "Task.import_offline_session)"
        )


class ClearMLTracker:
    """A ClearML task (offline with ``CLEARML_OFFLINE_MODE=1``), scalars only."""

    def __init__(self, run_dir: Path, project: str, *, resume: bool = False) -> None:
        _check_clearml_destination()
        offline = _clearml_offline()
        from clearml import Task

        if offline:  # process-wide in ClearML, and going back online reconnects every session
            Task.set_offline(offline_mode=True)
        del resume  # a resumed run is a new ClearML task of the same name
        self.continued = False  # it gets the rows kept so far first
        self._subprocess_setting = _report_from_a_thread(Task)
        self.task: Any = Task.init(
            project_name=project,
            task_name=run_dir.resolve().name,
            reuse_last_task_id=False,
            auto_connect_arg_parser=False,
            auto_connect_frameworks=False,
            auto_resource_monitoring=False,
            auto_connect_streams=False,
        )
        self.logger: Any = self.task.get_logger()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One ``report_scalar`` per finite value: title and series are the metric's name."""
        for key, value in _finite(metrics).items():
            self.logger.report_scalar(title=key, series=key, value=value, iteration=step)

    def close(self) -> None:
        """``task.close()`` (offline: zips the session folder); ClearML's setting restored."""
        from clearml import Task

        self.task.close()
        if self._subprocess_setting is not _UNCHANGED:
            if self._subprocess_setting is _ABSENT:
                delattr(Task, _SUBPROCESS_ATTR)
            else:
                setattr(Task, _SUBPROCESS_ATTR, self._subprocess_setting)
