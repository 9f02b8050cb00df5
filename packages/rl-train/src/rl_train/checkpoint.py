"""Loop checkpoints: ``run_dir/checkpoints/step_<n>/`` written atomically, and resume.

Layout of one checkpoint: ``agent_<i>/`` (each agent's ``save_checkpoint``), ``loop.json``
(``{"step": n, "env": source state}``) and, under a launcher, ``env_rank<r>.json`` (each
process's own data cursor). A checkpoint is written into a temporary sibling
(``.step_<n>.tmp``) and renamed into place once complete (an existing ``step_<n>`` is moved
aside first and deleted after), and ``checkpoints/latest.json`` names the newest complete one;
it is replaced atomically after everything else is on disk, so a kill at any moment leaves the
previous checkpoint the latest complete one. A checkpoint whose trainable parameters are not
all finite is refused. :func:`resume_point` is where a run with ``train.resume`` continues
from.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rl_train.collective import any_process, barrier, distributed, is_main_process, rank

if TYPE_CHECKING:
    from rl_train.config import RunConfig

__all__ = [
    "LATEST",
    "Resumed",
    "checkpoint_step",
    "latest_checkpoint",
    "resume",
    "save_checkpoint",
]

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

    A checkpoint that a kill interrupted while it replaced an earlier copy of itself (moved
    aside as ``.step_<n>.old``) is moved back first.

    Args:
        run_dir: The run directory.

    Returns:
        ``run_dir/checkpoints/step_<n>``, or None when there is none.
    """
    pointer = Path(run_dir) / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = Path(run_dir) / "checkpoints" / json.loads(pointer.read_text())["name"]
    _recover(path)
    return path if path.is_dir() else None


def _recover(target: Path) -> None:
    """Move ``.step_<n>.old`` back to ``step_<n>`` when a kill came between the two renames."""
    old = target.parent / f".{target.name}.old"
    if not target.exists() and old.is_dir():
        with contextlib.suppress(OSError):  # another process may have moved it first
            os.rename(old, target)


def checkpoint_step(path: str | Path) -> int:
    """The loop step a checkpoint directory (``step_<n>``) was written at.

    Args:
        path: The checkpoint directory.

    Returns:
        The step of its ``loop.json``.
    """
    return int(json.loads((Path(path) / "loop.json").read_text())["step"])


def _nonfinite(agents: Sequence[Any]) -> list[int]:
    """The indices of agents whose trainable parameters hold NaN or inf (on any process)."""
    bad = []
    for i, agent in enumerate(agents):
        groups = agent.param_groups() if callable(getattr(agent, "param_groups", None)) else []
        params = [p for group in groups for p in group["params"]]
        shards = [getattr(p, "ds_tensor", None) for p in params]  # ZeRO-3: this process's part
        flags = [
            torch.isfinite(p.detach() if s is None else s).all()
            for p, s in zip(params, shards, strict=True)
        ]
        # one read back per agent, not one per tensor
        local = bool(flags) and not bool(torch.stack([f.to(flags[0].device) for f in flags]).all())
        if any_process(local, getattr(agent, "device", "cpu")):
            bad.append(i)
    return bad


def save_checkpoint(
    run_dir: Path, step: int, agents: Sequence[Any], source_state: dict[str, Any] | None
) -> Path:
    """Write ``checkpoints/step_<n>/agent_<i>`` + ``loop.json``, then the ``latest.json`` pointer.

    Every process calls it (ZeRO-3 gathers weights collectively); only process 0 writes the
    pointer and ``loop.json``. The step is written into ``.step_<n>.tmp`` and renamed to
    ``step_<n>`` once complete, so an earlier ``step_<n>`` (which ``latest.json`` may name)
    stays whole until the new one is.

    Args:
        run_dir: The run directory.
        step: The loop step just finished.
        agents: The population.
        source_state: The data source's state (``state_dict()``), or None.

    Returns:
        The checkpoint directory.

    Raises:
        FloatingPointError: An agent's trainable parameters are not all finite (the update
            diverged): nothing is written, and ``latest.json`` still names the previous
            checkpoint.
    """
    root = run_dir / "checkpoints"
    name = f"step_{step:08d}"
    bad = _nonfinite(agents)
    if bad:
        latest = latest_checkpoint(run_dir)
        kept = f"{LATEST} still names {latest.name}" if latest else "there is no earlier one"
        raise FloatingPointError(
            f"checkpoint of step {step} refused: the trainable parameters of agent "
            f"{', '.join(map(str, bad))} hold NaN or inf (the update diverged: lower the "
            f"learning rate, agent.lr); {kept} in {root}"
        )
    target = root / name
    tmp, old = root / f".{name}.tmp", root / f".{name}.old"
    if is_main_process():
        _recover(target)
        for leftover in (tmp, old):  # what a kill left behind
            if leftover.exists():
                shutil.rmtree(leftover)
        tmp.mkdir(parents=True)
    barrier()
    for i, agent in enumerate(agents):
        agent.save_checkpoint(tmp / f"agent_{i}")
    if distributed():  # each process's data shard has its own cursor and pending batch
        (tmp / f"env_rank{rank()}.json").write_text(json.dumps(source_state))
        barrier()
    if is_main_process():
        (tmp / "loop.json").write_text(json.dumps({"step": step, "env": source_state}))
        if target.exists():  # latest.json may name it: moved aside until the new one is in place
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old)
        else:
            os.rename(tmp, target)
        pointer = root / (LATEST + ".tmp")
        pointer.write_text(json.dumps({"name": name, "step": step}))
        os.replace(pointer, root / LATEST)
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


def resume_point(config: RunConfig, say: Callable[[str], None]) -> tuple[Path, int] | None:
    """The checkpoint a run with ``train.resume`` continues from, and its step.

    With no checkpoint in ``train.run_dir`` the run starts at step 1 (``resume: true`` on a
    first launch, as preemptible jobs do), and ``say`` tells so; with one at ``train.steps``
    or later, ``say`` tells that the run already finished.

    Args:
        config: The run configuration.
        say: Where the line goes.

    Returns:
        ``(checkpoint directory, step)``, or None (no ``train.resume``, or no checkpoint).
    """
    t = config.train
    if not t.resume:
        return None
    path = latest_checkpoint(t.run_dir)
    if path is None:
        say(f"no checkpoint in {Path(t.run_dir) / 'checkpoints'}; starting at step 1")
        return None
    step = checkpoint_step(path)
    if step >= t.steps:
        say(
            f"already finished at step {step} (train.steps={t.steps}, "
            f"{Path(t.run_dir) / 'checkpoints' / LATEST}): nothing to train; raise train.steps "
            "to train further"
        )
    return path, step
