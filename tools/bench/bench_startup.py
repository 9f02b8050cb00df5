"""Start-up of the ``rl-train`` command and the packages, each in a fresh interpreter.

Every variant is a subprocess, timed from launch to exit (medians over repeats, one run):

* ``python -c pass`` is the floor (interpreter start);
* ``rl-train --help`` and ``rl-train run typo.yaml`` (an unknown key ``train.stepz``, answered
  with ``did you mean 'train.steps'?``) are compared with ``trl --help`` when a ``trl``
  command is found (``$TRL`` or ``/tmp/trlvenv/bin/trl``; install it into a throwaway venv:
  ``uv venv /tmp/trlvenv && uv pip install --python /tmp/trlvenv trl``), else with the floor;
* ``import rl_losses`` is compared with ``import torch``: what rl-losses adds over torch;
* ``rl-train demo`` (full run: 300 steps, accuracy 0.00 -> 1.00) is timed once per repeat,
  and skipped with ``--quick``.

``python -X importtime -c "import rl_train.cli"`` shows what is left to import: stdlib,
PyYAML and the torch-free ``rl_algos.names`` / ``rl_envs.tasks``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Row, Timing, with_ratios

PY = sys.executable
RL_TRAIN = [PY, "-m", "rl_train"]


def _trl() -> list[str] | None:
    candidates = [os.environ.get("TRL"), "/tmp/trlvenv/bin/trl", shutil.which("trl")]
    for c in candidates:
        if c and Path(c).is_file():
            return [c]
    return None


def _time(argv: list[str], repeats: int, warmup: int, cwd: Path, ok: tuple[int, ...]) -> Timing:
    samples = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        if proc.returncode not in ok:
            raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr[-2000:]}")
        if i >= warmup:
            samples.append(elapsed)
    return Timing(samples)


def run(quick: bool) -> list[Row]:
    repeats, warmup = (3, 1) if quick else (9, 2)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "typo.yaml").write_text("algo: grpo\ntrain:\n  stepz: 3\n")
        trl = _trl()
        cases = {
            "floor": ([PY, "-c", "pass"], (0,)),
            "rl-train --help": ([*RL_TRAIN, "--help"], (0,)),
            "rl-train run typo.yaml": ([*RL_TRAIN, "run", "typo.yaml"], (2,)),
        }
        if trl is not None:
            cases["trl --help"] = ([*trl, "--help"], (0,))
        baseline = "trl --help" if trl is not None else "floor"
        for variant, (argv, ok) in cases.items():
            rows.append(
                Row("startup", "command line", variant, _time(argv, repeats, warmup, cwd, ok))
            )
        with_ratios(rows, baseline, floor="floor")
        imports = [
            Row("startup", "import", v, _time([PY, "-c", c], repeats, warmup, cwd, (0,)))
            for v, c in (
                ("import torch", "import torch"),
                ("import torch, rl_losses", "import torch, rl_losses"),
                ("import rl_train", "import rl_train"),
                ("import rl_algos", "import rl_algos"),
            )
        ]
        with_ratios(imports, "import torch")
        torch_s = imports[0].timing.median
        for r in imports:
            r.extra["over_torch_ms"] = round((r.timing.median - torch_s) * 1000, 1)
        rows += imports
        if not quick:
            demo = [*RL_TRAIN, "demo", "--quiet", "--run-dir", str(cwd / "demo")]
            timing = _time(demo, 3, 1, cwd, (0,))
            rows.append(Row("startup", "demo (300 steps)", "rl-train demo", timing))
    return rows
