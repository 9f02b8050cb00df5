"""``report_to``: each tracker's run is read back by that tracker's own reader."""

from __future__ import annotations

import json
import logging
import math
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from rl_train.config import ConfigError, load_config
from rl_train.metrics import MetricsLogger
from rl_train.trackers import (
    _UNCHANGED,
    CLEARML_SUBPROCESS_ENV,
    TRACKERS,
    _report_from_a_thread,
    check_report_to,
    resolve_report_to,
)

ROWS = [
    (0, {"mean_reward": 0.25, "kl": 0.0}),
    (1, {"mean_reward": 0.5, "kl": 0.125, "eval_accuracy": 0.75}),
    (2, {"mean_reward": 1.0, "kl": math.nan}),  # a NaN is kept out of the trackers
]


def _log(run_dir: Path, report_to: list[str], **kwargs: object) -> MetricsLogger:
    logger = MetricsLogger(run_dir, report_to=report_to, project="rl-train-test", **kwargs)  # type: ignore[arg-type]
    for step, metrics in ROWS:
        logger.log(step, metrics)
    logger.close()
    return logger


def _only_mlflow_run(db: Path) -> tuple[Any, Any]:
    """``(client, run)`` of the SQLite store ``db``, whose experiment holds exactly one run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("rl-train-test")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_mlflow_run_read_back_with_mlflow_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run-mlflow"
    _log(run_dir, ["mlflow"])
    assert not (run_dir / "tensorboard").exists()  # report_to without tensorboard: none
    client, run = _only_mlflow_run(run_dir / "mlflow.db")
    assert run.info.run_name == "run-mlflow" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "mean_reward")
    assert [(m.step, m.value) for m in history] == [(0, 0.25), (1, 0.5), (2, 1.0)]
    kl = client.get_metric_history(run.info.run_id, "kl")
    assert [(m.step, m.value) for m in kl] == [(0, 0.0), (1, 0.125)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "eval_accuracy")] == [0.75]


def test_trackio_run_read_back_from_its_local_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = "trackio" not in sys.modules
    if fresh:  # trackio reads TRACKIO_DIR at import: ours goes to the run directory
        monkeypatch.delenv("TRACKIO_DIR", raising=False)
    run_dir = tmp_path / "run-trackio"
    logger = _log(run_dir, ["tensorboard", "trackio"])
    assert list((run_dir / "tensorboard").iterdir())  # TensorBoard as well
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    if fresh:
        assert Path(trackio.utils.TRACKIO_DIR) == (run_dir / "trackio").resolve()
        assert (run_dir / "trackio" / "rl-train-test.db").is_file()
    assert "run-trackio" in [run.name for run in trackio.Api().runs("rl-train-test")]
    logs = SQLiteStorage.get_logs("rl-train-test", "run-trackio")
    assert [(r["step"], r["mean_reward"]) for r in logs] == [(0, 0.25), (1, 0.5), (2, 1.0)]
    assert [r.get("kl") for r in logs] == [0.0, 0.125, None]
    assert logger.trackers == []  # closed


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B ``.wandb`` file (LevelDB log format: 32 KiB blocks, each record
    ``crc32 (4) | length (2) | type (1) | data``, after a 7-byte ``:W&B`` file header), with
    their checksums verified."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST, MIDDLE/LAST
        if kind in (1, 4):
            records.append(pending)
        pos += 7 + length
    return records


def test_wandb_offline_run_read_back_from_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from wandb.proto import wandb_internal_pb2

    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run-wandb"
    _log(run_dir, ["wandb"])
    import wandb

    wandb.teardown()  # the W&B service writes the run file; wait for it to exit
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history, run_name = [], None
    for data in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_name = record.run.display_name
            assert record.run.project == "rl-train-test"
        if kind == "history":
            items = record.history.item
            history.append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
            )
    assert run_name == "run-wandb"
    got = [(h["_step"], h["mean_reward"], h.get("kl")) for h in history]
    assert got == [(0, 0.25, 0.0), (1, 0.5, 0.125), (2, 1.0, None)]


def _clearml_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home without ``clearml.conf`` and a cache directory of the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml-cache"))
    for name in (
        "CLEARML_CONFIG_FILE",
        "TRAINS_CONFIG_FILE",
        "CLEARML_API_ACCESS_KEY",
        "CLEARML_API_SECRET_KEY",
        "CLEARML_OFFLINE_MODE",
    ):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "clearml-cache"


def test_clearml_offline_session_read_back_from_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from clearml import Task

    cache = _clearml_env(tmp_path, monkeypatch)
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.delenv(CLEARML_SUBPROCESS_ENV, raising=False)
    run_dir = tmp_path / "run-clearml"
    with caplog.at_level(logging.INFO, logger="rl_train.trackers"):
        logger = _log(run_dir, ["clearml"])
    assert "reporting from a thread, not a forked subprocess" in caplog.text
    assert "_report_subprocess_enabled" not in Task.__dict__  # ClearML's own setting again
    (session,) = [p for p in (cache / "offline").glob("offline-*") if p.is_dir()]
    assert (cache / "offline" / f"{session.name}.zip").is_file()  # closed: zipped for import
    task = json.loads((session / "task.json").read_text())
    assert task["name"] == "run-clearml"
    events = [
        event
        for line in (session / "metrics.jsonl").read_text().splitlines()
        for event in json.loads(line)
        if event["type"] == "training_stats_scalar"
    ]
    got = sorted((e["metric"], e["variant"], e["iter"], e["value"]) for e in events)
    assert got == [
        ("eval_accuracy", "eval_accuracy", 1, 0.75),
        ("kl", "kl", 0, 0.0),
        ("kl", "kl", 1, 0.125),  # the NaN at step 2 is kept out
        ("mean_reward", "mean_reward", 0, 0.25),
        ("mean_reward", "mean_reward", 1, 0.5),
        ("mean_reward", "mean_reward", 2, 1.0),
    ]
    assert logger.trackers == []  # closed


def test_clearml_without_a_server_refuses_instead_of_the_public_demo_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clearml_env(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=r"report_to clearml: .*CLEARML_OFFLINE_MODE=1"):
        MetricsLogger(tmp_path / "run", report_to="clearml")
    assert not (tmp_path / "clearml-cache").exists()  # refused before ClearML started
    # a run config is refused when it is loaded, before a model is built
    with pytest.raises(ConfigError, match=r"train\.report_to clearml: .*public demo server"):
        load_config(None, ["train.report_to=[tensorboard, clearml]"])
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    assert load_config(None, ["train.report_to=clearml"]).train.report_to == "clearml"


def test_clearml_reporting_switch_is_observable_and_can_be_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from clearml import Task

    monkeypatch.setenv(CLEARML_SUBPROCESS_ENV, "1")
    with caplog.at_level(logging.INFO, logger="rl_train.trackers"):
        assert _report_from_a_thread(Task) is _UNCHANGED
    assert "_report_subprocess_enabled" not in Task.__dict__
    assert f"{CLEARML_SUBPROCESS_ENV}=1" in caplog.text
    monkeypatch.delenv(CLEARML_SUBPROCESS_ENV)
    older_release = type("Task", (), {})  # a ClearML without the attribute
    with caplog.at_level(logging.WARNING, logger="rl_train.trackers"):
        assert _report_from_a_thread(older_release) is _UNCHANGED
    assert "no Task._report_subprocess_enabled" in caplog.text
    assert "_report_subprocess_enabled" not in vars(older_release)


def test_wandb_without_an_account_says_how_to_go_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no stored login either
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"report_to wandb: .*WANDB_MODE=offline"):
        MetricsLogger(tmp_path / "run", report_to="wandb")


def test_report_to_names_and_missing_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_report_to(None) == ["tensorboard"]
    assert resolve_report_to("none") == [] and resolve_report_to([]) == []
    assert resolve_report_to(["trackio", "tensorboard", "trackio"]) == ["tensorboard", "trackio"]
    assert resolve_report_to("all") == list(TRACKERS)  # the test group installs every extra
    with pytest.raises(ValueError, match="unknown tracker 'mlfow'; did you mean 'mlflow'"):
        resolve_report_to(["mlfow"])
    monkeypatch.setitem(TRACKERS, "mlflow", "mlflow_is_not_installed_here")
    assert resolve_report_to("all") == ["tensorboard", "wandb", "trackio", "clearml"]
    with pytest.raises(ValueError, match=r"pip install 'rl-train\[mlflow\]'"):
        check_report_to(["tensorboard", "mlflow"])
    with pytest.raises(ValueError, match=r"rl-train\[mlflow\]"):
        MetricsLogger("unused", report_to="mlflow")


def test_config_checks_report_to_and_reward_url_before_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_config(None, ["train.report_to=[tensorboard, mlflow]", "train.project=p"])
    assert config.train.report_to == ["tensorboard", "mlflow"] and config.train.project == "p"
    assert load_config(None).train.report_to == "tensorboard"  # today's behaviour by default
    with pytest.raises(ConfigError, match=r"train\.report_to: unknown tracker 'wandbb'"):
        load_config(None, ["train.report_to=wandbb"])
    monkeypatch.setitem(TRACKERS, "trackio", "trackio_is_not_installed_here")
    with pytest.raises(ConfigError, match=r"rl-train\[trackio\]"):
        load_config(None, ["train.report_to=trackio"])
    url = load_config(None, ["data.reward_url=http://10.0.0.2:8001", "data.reward_retries=0"])
    assert url.data.reward_url == "http://10.0.0.2:8001" and url.data.reward_retries == 0
    for bad, message in (
        ("data.reward_url=localhost:8001", "must look like 'http://host:port'"),
        ("data.reward_url=http://host", "must look like 'http://host:port'"),
        ("data.reward_timeout=0", "data.reward_timeout must be > 0"),
        ("data.reward_retries=-1", "data.reward_retries must be >= 0"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [bad])


class ListTracker:
    """A tracker of the user's own (what a SwanLab or Comet adapter would be): keeps the rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True


def test_a_tracker_object_of_your_own_in_report_to_gets_every_row(tmp_path: Path) -> None:
    mine = ListTracker()
    logger = _log(tmp_path / "run-mine", ["tensorboard", mine])  # type: ignore[list-item]
    assert [step for step, _ in mine.rows] == [0, 1, 2] and mine.closed
    assert mine.rows[1][1] == {"mean_reward": 0.5, "kl": 0.125, "eval_accuracy": 0.75}
    assert math.isnan(mine.rows[2][1]["kl"])  # every row as logged: the NaN is yours to keep out
    assert list((tmp_path / "run-mine" / "tensorboard").iterdir())  # the named one as well
    assert logger.trackers == []
    alone = ListTracker()
    _log(tmp_path / "run-alone", alone)  # type: ignore[arg-type]
    assert len(alone.rows) == 3 and not (tmp_path / "run-alone" / "tensorboard").exists()
    with pytest.raises(ValueError, match=r"report_to: 3 is neither a tracker name nor an object"):
        resolve_report_to(["tensorboard", 3])  # type: ignore[list-item]


def _resume(run_dir: Path, report_to: list[Any]) -> MetricsLogger:
    """The run of :data:`ROWS` resumed from a checkpoint at step 1: step 2 is computed again
    (another value here, so the test sees which one a tracker keeps), then step 3."""
    logger = MetricsLogger(run_dir, report_to=report_to, project="rl-train-test", resume=True)
    logger.truncate(1)
    logger.log(2, {"mean_reward": 9.0, "kl": 0.5})
    logger.log(3, {"mean_reward": 0.75, "kl": 0.25})
    logger.close()
    assert [r["step"] for r in MetricsLogger.read(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    return logger


def test_a_resumed_run_continues_the_mlflow_run_and_sends_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run-mlflow"
    _log(run_dir, ["mlflow"])
    _resume(run_dir, ["mlflow"])
    client, run = _only_mlflow_run(run_dir / "mlflow.db")  # one run, not one per start
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "mean_reward")
    assert [(m.step, m.value) for m in history] == [(0, 0.25), (1, 0.5), (2, 1.0), (3, 0.75)]
    # another tracking store: the remembered run is not there, so a new run (and a warning)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    _resume(run_dir, ["mlflow"])
    other, run = _only_mlflow_run(tmp_path / "other.db")
    history = other.get_metric_history(run.info.run_id, "mean_reward")
    # a new run gets the rows kept at the resume first (the second resume kept steps 0-1)
    assert [(m.step, m.value) for m in history] == [(0, 0.25), (1, 0.5), (2, 9.0), (3, 0.75)]


def _wandb_run(path: Path) -> tuple[str, list[int]]:
    """The run id and the history steps of an offline ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    run_id, steps = "", []
    for data in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        if kind == "history":
            steps.append(int(record.history.step.num))
    return run_id, steps


def test_a_resumed_run_continues_the_wandb_run_by_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # W&B's process-wide settings of an earlier test (online) go
    run_dir = tmp_path / "run-wandb"
    first = _log(run_dir, ["wandb"])
    wandb.teardown()
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    _resume(run_dir, ["wandb"])
    wandb.teardown()
    (again,) = set((run_dir / "wandb").glob("offline-run-*/run-*.wandb")) - {path}
    run_id, steps = _wandb_run(path)
    assert steps == [0, 1, 2]
    assert _wandb_run(again) == (run_id, [3])  # the same run, and only the new step
    assert json.loads((run_dir / "trackers.json").read_text()) == {"wandb": {"id": run_id}}
    assert first.trackers == []


def test_a_resumed_run_sends_a_tracker_of_your_own_what_its_run_lacks(tmp_path: Path) -> None:
    """Without ``continued`` a tracker object is a new run: the rows kept, then every step;
    with ``continued = True`` it holds the steps sent before: only the later ones."""
    _log(tmp_path / "run", [ListTracker()])
    new = ListTracker()
    _resume(tmp_path / "run", [new])
    assert [(step, m["mean_reward"]) for step, m in new.rows] == [
        (0, 0.25), (1, 0.5), (2, 9.0), (3, 0.75)
    ]  # fmt: skip
    assert new.closed
    _log(tmp_path / "run2", [ListTracker()])
    going_on = ListTracker()
    going_on.continued = True  # type: ignore[attr-defined]
    _resume(tmp_path / "run2", [going_on])
    assert [step for step, _ in going_on.rows] == [3]
