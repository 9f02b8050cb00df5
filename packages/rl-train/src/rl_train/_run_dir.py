"""The run directory (``train.run_dir``): whether it already holds a run.

:data:`RUN_FILES` are what a run writes there, :func:`existing_run` lists those a directory
already holds, and :func:`check_run_dir`, called before the build, refuses a fresh run in a
directory that holds one (or in a file), so that two runs' metrics, checkpoints and TensorBoard
events never mix; a resumed run (``train.resume``) continues in its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rl_train.user_code import ConfigError

if TYPE_CHECKING:
    from rl_train.config import TrainConfig


#: What a run writes in its directory: a directory that holds any of them holds a run.
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "metrics.csv",
    "checkpoints",
    "tensorboard",
    "reward_curve.png",
    "summary.json",
)


def existing_run(run_dir: str | Path) -> list[str]:
    """The names of :data:`RUN_FILES` that ``run_dir`` holds (empty: none, or no directory).

    Args:
        run_dir: A run directory.

    Returns:
        The run files and folders found, in :data:`RUN_FILES` order.
    """
    run = Path(run_dir)
    return [name for name in RUN_FILES if (run / name).exists()] if run.is_dir() else []


def check_run_dir(train: TrainConfig) -> None:
    """A fresh run needs a new (or empty) ``train.run_dir``; a resumed one, a directory.

    Args:
        train: The run's ``train`` section.

    Raises:
        ConfigError: ``train.run_dir`` is a file, or already holds a run and
            ``train.resume`` is false (its metrics, checkpoints and TensorBoard events would
            mix with the new run's).
    """
    run = Path(train.run_dir)
    if run.exists() and not run.is_dir():
        raise ConfigError(
            f"train.run_dir {train.run_dir!r} is a file, not a directory: choose a directory"
        )
    found = [] if train.resume else existing_run(run)
    if found:
        raise ConfigError(
            f"train.run_dir {train.run_dir!r} already holds a run ({', '.join(found)}): pass "
            "train.resume=true to continue it, or choose a new train.run_dir, or delete it"
        )
