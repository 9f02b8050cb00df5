"""Loop checkpoints: ``run_dir/checkpoints/step_<n>/`` written atomically, and resume.

Layout of one checkpoint: ``agent_<i>/`` (each agent's ``save_checkpoint``), ``loop.json``
(``{"step": n, "env": source state}``) and, under a launcher, ``env_rank<r>.json`` (each
process's own data cursor). ``checkpoints/latest.json`` names the newest complete one; it is
replaced atomically after everything else is on disk, so a kill at any moment leaves the
previous checkpoint the latest complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_train.collective import barrier, distributed, is_main_process, rank

__all__ = ["LATEST", "Resumed", "latest_checkpoint", "resume", "save_checkpoint"]

#: The pointer file to the newest complete checkpoint.
LATEST = "latest.json"


@dataclass(frozen=True)
class Resumed:
    """What :func:`resume` restored."""

    step: int
    """The loop step the checkpoint was written at."""
    source_state: dict[str, Any] | None
    """This process's data-source state (None when the source had none)."""
    path: Path
    """The checkpoint directory."""


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory of a run.

    Args:
        run_dir: The run directory.

    Returns:
        ``run_dir/checkpoints/step_<n>``, or None when there is none.
    """
    pointer = Path(run_dir) / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = Path(run_dir) / "checkpoints" / json.loads(pointer.read_text())["name"]
    return path if path.is_dir() else None


def save_checkpoint(
    run_dir: Path, step: int, agents: Sequence[Any], source_state: dict[str, Any] | None
) -> Path:
    """Write ``checkpoints/step_<n>/agent_<i>`` + ``loop.json``, then the ``latest.json`` pointer.

    Every process calls it (ZeRO-3 gathers weights collectively); only process 0 writes the
    pointer and ``loop.json``.

    Args:
        run_dir: The run directory.
        step: The loop step just finished.
        agents: The population.
        source_state: The data source's state (``state_dict()``), or None.

    Returns:
        The checkpoint directory.
    """
    root = run_dir / "checkpoints"
    name = f"step_{step:08d}"
    target = root / name
    if is_main_process() and target.exists():
        shutil.rmtree(target)
    barrier()
    for i, agent in enumerate(agents):
        agent.save_checkpoint(target / f"agent_{i}")
    if distributed():  # each process's data shard has its own cursor and pending batch
        (target / f"env_rank{rank()}.json").write_text(json.dumps(source_state))
        barrier()
    if is_main_process():
        (target / "loop.json").write_text(json.dumps({"step": step, "env": source_state}))
        tmp = root / (LATEST + ".tmp")
        tmp.write_text(json.dumps({"name": name, "step": step}))
        os.replace(tmp, root / LATEST)
    barrier()
    return target


def resume(run_dir: str | Path, agents: Sequence[Any]) -> Resumed | None:
    """Load the latest checkpoint of ``run_dir`` into ``agents``.

    Args:
        run_dir: The run directory.
        agents: The population (agent ``i`` loads ``agent_<i>``).

    Returns:
        The step and this process's source state, or None when there is no checkpoint.
    """
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return None
    loop = json.loads((ckpt / "loop.json").read_text())
    for i, agent in enumerate(agents):
        agent.load_checkpoint(ckpt / f"agent_{i}")
    state = loop["env"]
    if distributed():
        own = ckpt / f"env_rank{rank()}.json"
        state = json.loads(own.read_text()) if own.is_file() else state
    return Resumed(int(loop["step"]), state, ckpt)
