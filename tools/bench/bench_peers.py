"""Side by side: one GRPO step of ours against TRL 1.16 and AgileRL 2.58 on the same workload.

Usage (see tools/bench/README.md and docs/benchmarks.md)::

    uv run nox -s bench-peers                          # both shapes
    uv run nox -s bench-peers -- --shape small --rounds 3
    python tools/bench/bench_peers.py --shape small    # from an env holding our packages

The peers are never imported here nor installed in the workspace: each one gets a throwaway
virtual environment outside the repository (``--venv-dir``, default
``~/.cache/rl-bench-peers/<peer>-<version>``, created with ``uv venv`` + ``uv pip install`` and
reused when present), and its runner script (``peers/run_<peer>.py``) runs with that
environment's Python. Ours runs with this interpreter through our public API
(``peers/run_ours.py``), the floor (``peers/run_bare.py``: bare batched ``model.generate`` on the
base model, no LoRA) too. Every (shape, gradient checkpointing, implementation) is a fresh
subprocess; they run one after another, the order rotated each round, rounds interleaved.

The workload (``peers/common.py``): a random-init Qwen2 saved once to a temporary directory
that every runner loads, a word-level tokenizer, LoRA r=8 alpha=16 dropout 0 on q,k,v,o,gate,
up,down, prompts of 16 tokens, exactly ``new_tokens`` new tokens (EOS suppressed until then),
plain sampling at temperature 1, beta 0.04, clip 0.2, lr 1e-5, one thread.

Figures per step: ``learn`` (including the reference forward), ``generate`` (get_action /
generation of all rows), ``step`` (generate + reward + learn). On the large shape, ours' learn
FLOP rate is also reported as a fraction of the one-thread ``torch.mm`` peak measured in the
same run (MFU; the formulas are printed with the figures).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
ROOT = HERE.parent.parent
sys.path.insert(0, str(PEERS_DIR))

from common import SHAPES, Shape  # noqa: E402  (the workload's definition; no peer code)
from peers_paired import paired_ratios, paired_table, stats  # noqa: E402


@dataclass(frozen=True)
class Peer:
    """A peer library: its throwaway venv and runner."""

    name: str
    label: str
    requirements: tuple[str, ...]
    runner: str

    @property
    def venv_name(self) -> str:
        """``<name>-<version>`` of the pinned requirement."""
        version = self.requirements[0].split("==")[1]
        return f"{self.name}-{version}"


PEERS = {
    # peft pinned to the version our uv.lock holds, so that the LoRA layers are the same code
    "trl": Peer("trl", "TRL 1.16", ("trl==1.16.0", "peft==0.21.2"), "run_trl.py"),
    "agilerl": Peer(
        "agilerl",
        "AgileRL 2.58 (gc.collect stubbed)",
        ("agilerl[cpu-llm]==2.58.0",),
        "run_agilerl.py",
    ),
}
IMPLS = ("bare", "ours", "trl", "agilerl")
LABELS = {
    "ours": "ours",
    "trl": PEERS["trl"].label,
    "agilerl": PEERS["agilerl"].label,
    "bare": "bare `generate`",
}
FIGURES = (
    ("learn", "learn, incl. the reference forward"),
    ("generate", "get_action / generate (all rows)"),
    ("step", "whole step (generate + reward + learn)"),
)


def log(msg: str) -> None:
    print(f"[bench-peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- environments ----------------------------------------------------------------------------------


def base_python() -> str:
    """The interpreter the peer venvs are created from (this one's base installation)."""
    candidate = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    )
    return str(candidate) if candidate.exists() else sys.executable


def ensure_venv(peer: Peer, venv_dir: Path) -> Path:
    """The peer's venv Python, creating or updating the venv when its requirements changed."""
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("bench-peers needs `uv` on PATH to create the peers' environments")
    venv = venv_dir / peer.venv_name
    python = venv / "bin" / "python"
    marker = venv / ".rl-bench-peers-requirements"
    wanted = "\n".join(peer.requirements)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    log(f"creating {venv} ({', '.join(peer.requirements)})")
    if not python.exists():
        subprocess.run([uv, "venv", "-q", "--python", base_python(), str(venv)], check=True)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(python), *peer.requirements], check=True
    )
    marker.write_text(wanted)
    return python


# -- running ---------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    # the peers' venvs must not see the workspace's packages
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        PYTHONWARNINGS="ignore",
    )
    return env


def run_one(
    impl: str, python: str, workdir: Path, shape: Shape, gc: str, extra: list[str], timeout: float
) -> dict[str, Any]:
    """One runner subprocess; its parsed ``RESULT`` (or the error)."""
    runner = {"bare": "run_bare.py", "ours": "run_ours.py"}.get(impl) or PEERS[impl].runner
    cmd = [
        python, str(PEERS_DIR / runner), "--workdir", str(workdir), "--shape", shape.name,
        "--gc", gc, *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=child_env(), timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"impl": impl, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-3000:]
        log(f"{impl} ({shape.name}, gc {gc}) failed (rc {proc.returncode}):\n{tail}")
        return {"impl": impl, "error": f"rc {proc.returncode}", "stderr_tail": tail, "wall_s": wall}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["wall_s"] = wall
    return result


def build_workload(shape: Shape, workdir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(PEERS_DIR / "common.py"), "build", "--shape", shape.name,
         "--out", str(workdir)],
        capture_output=True, text=True, env=child_env(), check=False,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"building the {shape.name} workload failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


# -- FLOPs -----------------------------------------------------------------------------------------


def flop_counts(shape: Shape, lora_r: int = 8) -> dict[str, Any]:
    """Analytic FLOPs of one ``learn()`` on ``shape`` (see the formulas returned with them)."""
    h, i, layers = shape.hidden, shape.intermediate, shape.layers
    kv = shape.kv_heads * (h // shape.heads)
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]  # q k v o gate up down
    n_body = layers * sum(a * b for a, b in linears)
    n_head = shape.vocab * h  # tied lm_head: one [vocab, hidden] matmul per scored position
    n_lora = layers * sum(lora_r * (a + b) for a, b in linears)
    seq = shape.prompt_len + shape.new_tokens
    tokens = shape.rows * seq
    scored = shape.rows * shape.new_tokens  # positions whose log-prob the loss needs
    attn = layers * 4 * seq * h  # QK^T and AV per token, full (non-causal) square
    n_all = n_body + n_head + n_lora
    conventional = (6 + 2 + 2) * n_all * tokens + (3 + 1 + 1) * attn * tokens
    lora_path = 2 * (n_body + n_lora) * tokens  # frozen + LoRA matmuls of one forward
    head = 2 * n_head * scored  # one forward of the tied (frozen) lm_head on scored positions
    necessary = (
        (lora_path + attn * tokens + head)  # training forward
        + (lora_path + 2 * attn * tokens + head)  # input-gradient backward (attention: 2x)
        + 2 * n_lora * tokens  # LoRA weight gradients (frozen weights get none)
        + (2 * n_body * tokens + attn * tokens + head)  # reference forward (adapter off)
    )
    return {
        "params_body": n_body,
        "params_lm_head": n_head,
        "params_lora": n_lora,
        "tokens": tokens,
        "scored_positions": scored,
        "conventional": conventional,
        "necessary": necessary,
        "formulas": {
            "conventional": (
                "6*N*T (training fwd+bwd) + 2*N*T (reference fwd) + 2*N*T (old-policy fwd), "
                "N = body linears + tied lm_head + LoRA params, T = rows*(prompt+new) tokens, "
                "plus attention 4*S*h*layers per token per forward (x3 training, x1 each other)"
            ),
            "necessary": (
                "LoRA-exact, no old-policy forward: training fwd 2*(Nb+Nl)*T + A + 2*V*h*C, "
                "input-grad bwd 2*(Nb+Nl)*T + 2*A + 2*V*h*C, LoRA weight grads 2*Nl*T, "
                "reference fwd 2*Nb*T + A + 2*V*h*C; Nb = body linears, Nl = LoRA params, "
                "V*h = tied lm_head (frozen), T = rows*(prompt+new) tokens, C = rows*new "
                "scored positions, A = 4*S*h*layers*T (attention scores and values)"
            ),
        },
    }


# -- summary ---------------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{shape: {gc: {impl: {figure: stats}}}}`` pooled over rounds, plus the ratios."""
    out: dict[str, Any] = {}
    for r in runs:
        if "samples" not in r:
            continue
        cell = out.setdefault(r["shape"], {}).setdefault(r["gc"], {}).setdefault(r["impl"], {})
        for fig, values in r["samples"].items():
            cell.setdefault(fig, []).extend(values)
    for by_gc in out.values():
        for row in by_gc.values():
            for impl, figs in list(row.items()):
                row[impl] = {f: stats(v) for f, v in figs.items()}
            row["ratios"] = ratios(row)
    return out


def _stat(row: dict[str, Any], impl: str, fig: str, key: str) -> float | None:
    s = row.get(impl, {}).get(fig)
    return s[key] if s else None


def ratios(row: dict[str, Any]) -> dict[str, float]:
    """``"<figure>: ours/<peer>"`` (ratio of medians) and ``"... (min)"`` (ratio of minima)."""
    out = {}
    for fig, _ in FIGURES:
        for key, suffix in (("median", ""), ("min", " (min)")):
            ours = _stat(row, "ours", fig, key)
            for peer in ("trl", "agilerl", "bare"):
                other = _stat(row, peer, fig, key)
                if ours is not None and other:
                    out[f"{fig}: ours/{peer}{suffix}"] = ours / other
    return out


def fmt_ms(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f})"


def table(row: dict[str, Any], impls: list[str]) -> str:
    head = ["ms: median (min-max); ratios: of medians (of minima)", *(LABELS[i] for i in impls)]
    rat = [k for k in ("trl", "agilerl", "bare") if k in impls]
    head += [f"ours/{LABELS[k].split(' (')[0]}" for k in rat]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for fig, label in FIGURES:
        cells = [label]
        for impl in impls:
            s = row.get(impl, {}).get(fig)
            cells.append(fmt_ms(s) if not (impl == "bare" and fig != "generate") else "-")
        for k in rat:
            v = row["ratios"].get(f"{fig}: ours/{k}")
            low = row["ratios"].get(f"{fig}: ours/{k} (min)")
            cells.append(f"{v:.2f}x ({low:.2f}x)" if v is not None and low is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parts_table(row: dict[str, Any]) -> str:
    """TRL's parts and ours/AgileRL's reward time (what the learn figure is made of)."""
    lines = ["| part, ms: median (min-max) | value |", "|---|---:|"]
    for impl, fig in (
        ("trl", "train_part"), ("trl", "reference"), ("trl", "generate_with_text"),
        ("trl", "reward"), ("ours", "reward"), ("agilerl", "reward"),
    ):  # fmt: skip
        s = row.get(impl, {}).get(fig)
        if s:
            lines.append(f"| {impl} {fig} | {fmt_ms(s)} |")
    return "\n".join(lines)


def mfu_report(runs: list[dict[str, Any]], shape: Shape) -> dict[str, Any] | None:
    ours = [
        r for r in runs if r.get("impl") == "ours" and r["shape"] == shape.name and "samples" in r
    ]
    peaks = [max(r["matmul_peak_flops"].values()) for r in ours if r.get("matmul_peak_flops")]
    if not ours or not peaks:
        return None
    flops = flop_counts(shape)
    out: dict[str, Any] = {"flops": flops, "by_gc": {}}
    for gc in sorted({r["gc"] for r in ours}):
        learn = [s for r in ours if r["gc"] == gc for s in r["samples"]["learn"]]
        med = statistics.median(learn)
        peak = max(max(r["matmul_peak_flops"].values()) for r in ours if r["gc"] == gc)
        best = min(learn)
        out["by_gc"][gc] = {
            "learn_median_s": med,
            "learn_min_s": best,
            "mfu_necessary_best_step": flops["necessary"] / best / peak,
            "mfu_conventional_best_step": flops["conventional"] / best / peak,
            "matmul_peak_flops": peak,
            "matmul_peak_by_shape": [r["matmul_peak_flops"] for r in ours if r["gc"] == gc],
            "rate_conventional": flops["conventional"] / med,
            "rate_necessary": flops["necessary"] / med,
            "mfu_conventional": flops["conventional"] / med / peak,
            "mfu_necessary": flops["necessary"] / med / peak,
        }
    return out


def mfu_table(report: dict[str, Any]) -> str:
    lines = [
        "| gradient checkpointing | learn: median (fastest) | matmul peak (1 thread) "
        "| LoRA-exact FLOP rate | **MFU, LoRA-exact**: median (fastest step) "
        "| conventional FLOP rate | MFU, conventional: median (fastest step) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for gc, m in report["by_gc"].items():
        lines.append(
            f"| {gc} | {m['learn_median_s']:.2f} s ({m['learn_min_s']:.2f} s) "
            f"| {m['matmul_peak_flops'] / 1e9:.1f} GFLOP/s "
            f"| {m['rate_necessary'] / 1e9:.1f} GFLOP/s "
            f"| **{m['mfu_necessary']:.1%}** ({m['mfu_necessary_best_step']:.1%}) "
            f"| {m['rate_conventional'] / 1e9:.1f} GFLOP/s "
            f"| {m['mfu_conventional']:.1%} ({m['mfu_conventional_best_step']:.1%}) |"
        )
    f = report["flops"]
    lines.append("")
    lines.append(
        f"FLOPs per learn(): conventional {f['conventional'] / 1e9:.1f} GFLOP, LoRA-exact "
        f"{f['necessary'] / 1e9:.1f} GFLOP (body {f['params_body'] / 1e6:.2f}M, lm_head "
        f"{f['params_lm_head'] / 1e6:.2f}M, LoRA {f['params_lora'] / 1e6:.3f}M params; "
        f"{f['tokens']} tokens, {f['scored_positions']} scored positions)."
    )
    lines.append(f"- conventional: {f['formulas']['conventional']}")
    lines.append(f"- LoRA-exact: {f['formulas']['necessary'].removeprefix('LoRA-exact, ')}")
    return "\n".join(lines)


# -- machine ---------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()
        info["mem_gib"] = round(int(mem[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "packages"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        info["packages_dirty"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=["small", "large", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, small shape")
    parser.add_argument("--large-rounds", type=int, default=1, help="rounds of the large shape")
    parser.add_argument("--gc", choices=["on", "off", "both"], default="both",
                        help="gradient checkpointing rows of the small shape")  # fmt: skip
    parser.add_argument("--large-gc", choices=["on", "off", "both"], default="off",
                        help="gradient checkpointing rows of the large shape")  # fmt: skip
    parser.add_argument("--impls", default=",".join(IMPLS), help="subset of bare,ours,trl,agilerl")
    parser.add_argument("--venv-dir", type=Path, default=Path.home() / ".cache" / "rl-bench-peers")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "peers.json")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds per subprocess")
    parser.add_argument("--warmup", type=int, default=None, help="override the shapes' warm-up")
    parser.add_argument("--steps", type=int, default=None, help="override the shapes' timed steps")
    parser.add_argument(
        "--append", action="store_true",
        help="add this run's samples to those already in --out (rounds renumbered after them)",
    )  # fmt: skip
    parser.add_argument(
        "--from-json", type=Path, default=None,
        help="measure nothing: recompute the summary, MFU and tables of a saved results file "
        "(its samples untouched) and write them back into it",
    )  # fmt: skip
    return parser.parse_args(argv)


def rerender(args: argparse.Namespace) -> int:
    """``--from-json``: the tables of a saved run, recomputed with this file's code."""
    path = args.from_json
    payload = json.loads(path.read_text())
    runs = payload["runs"]
    shapes = [n for n in ("small", "large") if n in payload["shapes"]]
    impls = [i for i in IMPLS if any(r.get("impl") == i for r in runs)]
    mfu = mfu_report(runs, SHAPES["large"]) if "large" in shapes else None
    text = render(runs, impls, shapes, payload["machine"], mfu)
    print(text)
    payload.update(summary=summarize(runs), paired=paired_ratios(runs), mfu=mfu, markdown=text)
    payload["rerendered_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    path.write_text(json.dumps(payload, indent=1) + "\n")
    log(f"rewrote {path}")
    return 0


def make_plan(args: argparse.Namespace, shapes: list[str]) -> list[tuple[int, str, str]]:
    """``(round, shape, gradient checkpointing)`` in execution order."""
    gcs = {"on": ["on"], "off": ["off"], "both": ["off", "on"]}
    plan: list[tuple[int, str, str]] = []
    for name in shapes:
        rounds = args.rounds if name == "small" else args.large_rounds
        rows = gcs[args.gc if name == "small" else args.large_gc]
        plan += [(k, name, gc) for k in range(rounds) for gc in rows]
    return plan


def execute(
    args: argparse.Namespace, impls: list[str], pythons: dict[str, str], shapes: list[str]
) -> list[dict[str, Any]]:
    """Every planned subprocess, one after another; their results."""
    runs: list[dict[str, Any]] = []
    counts = []
    if args.warmup is not None:
        counts += ["--warmup", str(args.warmup)]
    if args.steps is not None:
        counts += ["--steps", str(args.steps)]
    with tempfile.TemporaryDirectory(prefix="rl-bench-peers-") as tmp:
        workdirs = {}
        for name in shapes:
            workdirs[name] = Path(tmp) / name
            built = build_workload(SHAPES[name], workdirs[name])
            log(f"{name} workload: {built['params'] / 1e6:.2f}M parameters")
        for k, name, gc in make_plan(args, shapes):
            order = impls[k % len(impls) :] + impls[: k % len(impls)]  # rotate per round
            for impl in order:
                extra = [*counts, "--mfu"] if impl == "ours" and name == "large" else counts
                log(f"round {k + 1}: {name}, gradient checkpointing {gc}: {impl}")
                load = os.getloadavg()[0]
                result = run_one(
                    impl, pythons[impl], workdirs[name], SHAPES[name], gc, extra, args.timeout
                )
                result.update(round=k, shape=name, gc=gc, loadavg_1min_before=load)
                runs.append(result)
                medians = {f: statistics.median(v) for f, v in result.get("samples", {}).items()}
                log("  " + ", ".join(f"{f} {v * 1e3:.1f} ms" for f, v in medians.items()))
    return runs


def render(
    runs: list[dict[str, Any]], impls: list[str], shapes: list[str], info: dict[str, Any],
    mfu: dict[str, Any] | None,
) -> str:  # fmt: skip
    """The Markdown report."""
    summary, paired = summarize(runs), paired_ratios(runs)
    md = [f"machine: {json.dumps(info)}", ""]
    for name in shapes:
        shape = SHAPES[name]
        for gc, row in summary.get(name, {}).items():
            mine = [r for r in runs if r["shape"] == name and r["gc"] == gc and "samples" in r]
            n = len({r["round"] for r in mine})
            steps = sorted({len(next(iter(r["samples"].values()))) for r in mine})
            md.append(
                f"### {name}: {shape.prompts} prompts x {shape.group} samples, "
                f"{shape.new_tokens} new tokens, gradient checkpointing {gc} ({n} round(s); "
                f"timed steps per subprocess: {'/'.join(map(str, steps))}, after warm-up)"
            )
            pairs = paired_table(paired.get(name, {}).get(gc, {}), FIGURES)
            md += ["", table(row, impls), "", pairs, "", parts_table(row), ""]
    if mfu:
        md += ["### MFU of ours' learn() on the large shape", "", mfu_table(mfu), ""]
    for r in runs:
        if "error" in r:
            md.append(
                f"FAILED: {r['impl']} ({r['shape']}, gc {r['gc']}, round {r['round'] + 1}): "
                f"{r['error']}"
            )
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return rerender(args)
    impls = [i for i in IMPLS if i in args.impls.split(",")]
    pythons = {"bare": sys.executable, "ours": sys.executable}
    for name in ("trl", "agilerl"):
        if name in impls:
            pythons[name] = str(ensure_venv(PEERS[name], args.venv_dir))
    shapes = ["small", "large"] if args.shape == "both" else [args.shape]
    info = machine_info()
    log(f"machine: {json.dumps(info)}")
    started = dt.datetime.now(dt.UTC)
    runs = execute(args, impls, pythons, shapes)
    info["loadavg_after"] = os.getloadavg()
    previous: dict[str, Any] = {}
    sessions: list[dict[str, Any]] = []
    if args.append and args.out.exists():
        previous = json.loads(args.out.read_text())
        keys = ("command", "started_utc", "machine")
        sessions = previous.get("sessions") or [{k: previous[k] for k in keys}]
        offset = 1 + max((r["round"] for r in previous["runs"]), default=-1)
        for r in runs:
            r["round"] += offset
            r["session"] = len(sessions) + 1
        runs = previous["runs"] + runs
        shapes = [n for n in ("small", "large") if n in shapes or n in previous["shapes"]]
        impls = [i for i in IMPLS if any(r.get("impl") == i for r in runs)]
    mfu = mfu_report(runs, SHAPES["large"]) if "large" in shapes else None
    text = render(runs, impls, shapes, info, mfu)
    print(text)
    versions: dict[str, Any] = {}
    for r in runs:
        if "versions" in r:
            versions.setdefault(r["impl"], r["versions"])
    command = [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
    started_utc = started.isoformat(timespec="seconds")
    sessions.append({"command": command, "started_utc": started_utc, "machine": info})
    payload = {
        "command": previous.get("command", command),
        "started_utc": previous.get("started_utc", started_utc),
        "sessions": sessions,
        "machine": info,
        "versions": versions,
        "shapes": {n: SHAPES[n].__dict__ for n in shapes},
        "overrides": {"warmup": args.warmup, "steps": args.steps},
        "runs": runs,
        "summary": summarize(runs),
        "paired": paired_ratios(runs),
        "mfu": mfu,
        "markdown": text,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    log(f"wrote {args.out}")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
