"""Ours against ours: this checkout's core against another checkout's, interleaved, with MFU.

``uv run python tools/bench/bench_ours_ab.py --before DIR --shape large --rounds 2`` runs the
peer benchmark's ``peers/run_ours.py`` (the same workload and timing as ``bench_peers.py``)
alternately from ``DIR`` (with ``DIR/.venv/bin/python``: the "before" core, e.g. a worktree
of ``main``) and from this checkout (with this interpreter), the order swapped every round, and
prints each side's ``learn()``, ``get_action`` and whole-step medians, the ratio after/before,
and, on the large shape, ``learn()``'s MFU against the 1-thread ``torch.mm`` peak each
subprocess measures (``bench_peers.mfu_report``). Both sides read the same saved model.
Results (every sample and the load average before each subprocess) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_peers import build_workload, child_env, log, machine_info, mfu_report  # noqa: E402
from common import SHAPES  # noqa: E402  (bench_peers put peers/ on the path)


def run_side(python: str, root: Path, workdir: Path, shape: str, gc: str) -> dict[str, Any]:
    """One ``run_ours.py`` subprocess of the checkout at ``root``; its ``RESULT``.

    The warm-up and timed step counts are this checkout's, passed to both sides.
    """
    counts = ["--warmup", str(SHAPES[shape].warmup), "--steps", str(SHAPES[shape].steps)]
    cmd = [python, str(root / "tools" / "bench" / "peers" / "run_ours.py"), "--workdir",
           str(workdir), "--shape", shape, "--gc", gc, *counts]  # fmt: skip
    if shape == "large":
        cmd.append("--mfu")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{root}: rc {proc.returncode}\n{(proc.stderr or proc.stdout)[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="large")
    parser.add_argument("--gc", choices=["on", "off"], default="off")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ours_ab.json")
    args = parser.parse_args(argv)
    sides = {
        "before": (str(args.before / ".venv" / "bin" / "python"), args.before.resolve()),
        "after": (sys.executable, HERE.parent.parent),
    }
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rl-bench-ab-") as tmp:
        workdir = Path(tmp) / args.shape
        build_workload(SHAPES[args.shape], workdir)
        for k in range(args.rounds):
            for name in ["before", "after"] if k % 2 == 0 else ["after", "before"]:
                load = os.getloadavg()[0]
                log(f"round {k + 1}: {name} (load average {load:.2f})")
                result = run_side(*sides[name], workdir, args.shape, args.gc)
                result.update(impl="ours", side=name, round=k, shape=args.shape, gc=args.gc)
                result["loadavg_1min_before"] = load
                runs.append(result)
                med = {f: statistics.median(v) for f, v in result["samples"].items()}
                log("  " + ", ".join(f"{f} {v * 1e3:.1f} ms" for f, v in med.items()))
    report: dict[str, Any] = {"machine": machine_info(), "command": sys.argv, "runs": runs}
    lines = []
    for fig in ("learn", "generate", "step"):
        meds = {}
        for name in sides:
            samples = [s for r in runs if r["side"] == name for s in r["samples"][fig]]
            meds[name] = (statistics.median(samples), min(samples))
        ratio = meds["after"][0] / meds["before"][0]
        ratio_min = meds["after"][1] / meds["before"][1]
        lines.append(
            f"{fig}: before {meds['before'][0] * 1e3:.1f} ms (min {meds['before'][1] * 1e3:.1f}), "
            f"after {meds['after'][0] * 1e3:.1f} ms (min {meds['after'][1] * 1e3:.1f}): "
            f"after/before {ratio:.3f}x ({ratio_min:.3f}x of minima)"
        )
    if args.shape == "large":
        for name in sides:
            mfu = mfu_report([r for r in runs if r["side"] == name], SHAPES["large"])
            report[f"mfu_{name}"] = mfu
            if mfu:
                m = mfu["by_gc"][args.gc]
                lines.append(
                    f"MFU ({name}), LoRA-exact: {m['mfu_necessary']:.1%} median step "
                    f"({m['mfu_necessary_best_step']:.1%} fastest), peak "
                    f"{m['matmul_peak_flops'] / 1e9:.1f} GFLOP/s"
                )
    report["summary"] = lines
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {args.out}; load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
