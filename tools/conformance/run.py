"""Peer conformance: our functions against verl, OpenRLHF, TRL, Liger and AgileRL's own code.

``uv run nox -s conformance`` (or ``python tools/conformance/run.py`` in the workspace venv):

1. makes each peer's throwaway venv under ``$RL_CONFORMANCE_HOME`` (default
   ``~/.cache/rl-conformance``, outside the workspace) unless it exists: the released peer
   ``--no-deps``, the workspace's torch, numpy and the few imports its math modules need
   (``matrix.PEER_EXTRAS``);
2. saves the shared seeded float64 batches (``inputs.py``: groups of 2, 4, 5; padded, holed
   and empty rows) and runs ``peer_<peer>.py`` in each venv, which calls the peer's functions;
3. computes the same cases with ours under the documented mapping (``ours.py``), compares
   (rtol = atol = 1e-10 unless ``matrix.TOLERANCES`` gives a reason), and writes
   ``docs/conformance.md``. Exits 1 on any unexplained difference.

Options: ``--peers verl,trl`` (a subset), ``--no-install`` (fail instead of creating venvs),
``--out PATH`` (the report; default docs/conformance.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402
import matrix  # noqa: E402
import read  # noqa: E402
from ours import OURS  # noqa: E402

HOME = Path(os.environ.get("RL_CONFORMANCE_HOME", Path.home() / ".cache" / "rl-conformance"))


def venv_python(peer: str) -> Path:
    return HOME / peer / "bin" / "python"


def ensure_venv(peer: str, install: bool) -> None:
    py = venv_python(peer)
    if py.exists():
        return
    if not install:
        raise SystemExit(f"no venv for {peer} at {py}; run without --no-install to create it")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    torch_pin = f"torch=={importlib.metadata.version('torch').split('+')[0]}"
    subprocess.run(["uv", "venv", "-q", "--python", version, str(HOME / peer)], check=True)
    pip = ["uv", "pip", "install", "-q", "--python", str(py)]
    subprocess.run([*pip, "--no-deps", matrix.PEER_PACKAGES[peer]], check=True)
    subprocess.run([*pip, torch_pin, "numpy", *matrix.PEER_EXTRAS[peer]], check=True)


def run_peer(peer: str, batches: Path, work: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = work / f"{peer}.pt"
    env = {**os.environ, "PYTHONPATH": str(HERE), "PYTHONWARNINGS": "ignore"}
    cmd = [str(venv_python(peer)), str(HERE / f"peer_{peer}.py"), str(batches), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode:
        raise SystemExit(f"{peer} script failed:\n{proc.stderr[-4000:]}")
    return torch.load(out)  # type: ignore[no-any-return]


def tolerance(peer: str, case: str) -> tuple[float, str]:
    key = f"{peer}:{case.split('#', 1)[0]}"
    best = ""
    for k in matrix.TOLERANCES:
        if (key.startswith(k) or k == peer) and len(k) > len(best):
            best = k
    return matrix.TOLERANCES[best] if best else (matrix.DEFAULT_TOL, "")


def compare(
    peer: str, theirs: dict, batches: dict[str, dict[str, torch.Tensor]]
) -> dict[str, dict[str, object]]:
    """{case: {"max_diff", "tol", "ok", "n"}} over every batch."""
    results: dict[str, dict[str, object]] = {}
    for key, b in batches.items():
        for case, mine in OURS[peer](b, int(key[1:])).items():
            base = case.split("#")[0]
            got = theirs.get(f"{base}@{key}")
            tol, _ = tolerance(peer, case)
            res = results.setdefault(case, {"max_diff": 0.0, "tol": tol, "ok": True, "n": 0})
            if got is None:
                res["ok"], res["max_diff"] = False, float("inf")
                continue
            only = matrix.ONLY.get(f"{peer}:{base}")
            valid = b["mask"]
            if f"{peer}:{base}" in matrix.DIFFERS:  # rows without a hole, per-row outputs only
                only = matrix.DIFFERS[f"{peer}:{base}"][1]
                m = b["mask"]
                prefix = m.cumsum(1) == torch.arange(1, m.shape[1] + 1)
                valid = m & (m.sum(1) == (m & prefix).sum(1))[:, None]
            for name, v in mine.items():
                if name not in got or (only and name not in only):
                    continue
                a, w = v, got[name]
                if a.shape == b["mask"].shape:  # token outputs: valid tokens only
                    a, w = a[valid], w[valid]
                diff = float((a - w).abs().max()) if a.numel() else 0.0
                res["max_diff"] = max(float(res["max_diff"]), diff)  # type: ignore[arg-type]
                if not torch.allclose(a, w, rtol=tol, atol=tol):
                    res["ok"] = False
            res["n"] = int(res["n"]) + 1  # type: ignore[call-overload]
    return results


STATUS = {"equal": "equal", "args": "equal with", "design": "differs by design:", "none": "—"}


def cell_text(
    peer: str, cell: matrix.Cell, results: dict[str, dict[str, dict[str, object]]]
) -> str:
    status, text, cases = cell
    if status == "none":
        return f"— ({text})" if text != "no counterpart" else "—"
    label = STATUS[status]
    body = f"{label} {text}" if status != "equal" else f"equal: {text}"
    if not cases:
        return body + " *(read from source)*"
    res = results.get(peer, {})
    runs = sum(int(res[c]["n"]) for c in cases if c in res)  # type: ignore[call-overload]
    if any(f"{peer}:{c}" in matrix.DIFFERS for c in cases):
        return body + f" *(shown: {runs} runs)*"
    return body + f" *(checked: {runs} runs)*"


def write_report(
    path: Path, results: dict, timings: dict[str, float], unexplained: list[str]
) -> None:
    counts = {"equal": 0, "args": 0, "design": 0, "none": 0}
    for row in matrix.MATRIX.values():
        for cell in row.values():
            counts[cell[0]] += 1
    lines = [
        "# Peer conformance",
        "",
        "Each of our public estimators and losses against the peers' own released code:",
        "`uv run nox -s conformance` installs each peer into a throwaway venv outside the",
        "workspace, calls the peer's functions and ours on shared seeded float64 batches (groups of",
        "2, 4 and 5 with right-padded, holed and empty rows) and writes this page.",
        "",
        "A cell is **equal** (our defaults reproduce the peer), **equal with** the arguments",
        "shown, **differs by design** (the reason), or — (the peer has no counterpart).",
        "*checked: n runs* means the cell's cases ran against the peer and agreed (value and",
        "gradient; rtol = atol = 1e-10 unless a tolerance below gives the reason); *read from",
        "source* cells are documented from the peer's code but have no case yet; *shown* cells",
        "ran cases that differ exactly where the reason says.",
        "",
        f"Cells: {counts['equal']} equal, {counts['args']} equal with arguments, "
        f"{counts['design']} differ by design, {counts['none']} without counterpart. "
        f"Unexplained differences: {len(unexplained)}.",
        "",
        "| function | " + " | ".join(matrix.PEER_LABELS[p] for p in matrix.PEERS) + " |",
        "|---|" + "---|" * len(matrix.PEERS),
    ]
    for name, row in matrix.MATRIX.items():
        cells = [cell_text(p, row[p], results).replace("|", "\\|") for p in matrix.PEERS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Read, not run",
        "",
        "Peers outside the columns above whose released code was read and not run (the reason",
        "is in each line); the function's row above says so too.",
        "",
        "| function | peer and source read | our call and why it is not run |",
        "|---|---|---|",
    ]
    for name, (peer, text) in read.READ.items():
        lines.append(f"| `{name}` | {peer} | {text} |")
    lines += [
        "",
        "## Tolerances above 1e-10",
        "",
        "| peer / case | tolerance | reason |",
        "|---|---|---|",
    ]
    for key, (tol, why) in matrix.TOLERANCES.items():
        lines.append(f"| `{key}` | {tol:g} | {why} |")
    lines += [
        "",
        "## Cases",
        "",
        "| peer | case | runs | max abs diff | tolerance | result |",
        "|---|---|---|---|---|---|",
    ]
    for peer in matrix.PEERS:
        for case, r in sorted(results.get(peer, {}).items()):
            design = matrix.DIFFERS.get(f"{peer}:{case}")
            verdict = "equal" if r["ok"] else "**UNEXPLAINED**"
            if design:
                verdict += f" on rows without holes ({design[0]}: differs by design)"
            lines.append(
                f"| {peer} | `{case}` | {r['n']} | {float(r['max_diff']):.2e} | {float(r['tol']):g} | {verdict} |"  # type: ignore[arg-type]
            )
    lines += ["", "## Peers", ""]
    for peer in matrix.PEERS:
        extras = ", ".join(matrix.PEER_EXTRAS[peer]) or "nothing else"
        doc = (HERE / f"peer_{peer}.py").read_text().split('"""')[1].strip().splitlines()
        lines.append(
            f"* **{matrix.PEER_LABELS[peer]}** (`{matrix.PEER_PACKAGES[peer]}` `--no-deps` + torch, "
            f"numpy, {extras}; {timings.get(peer, 0.0):.1f} s): " + " ".join(d.strip() for d in doc)
        )
    lines += [
        "",
        "Regenerate: `uv run nox -s conformance` (about a minute once the venvs exist).",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=",".join(matrix.PEERS))
    ap.add_argument("--no-install", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "conformance.md")
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    torch.set_default_dtype(torch.float64)
    batches = inputs.all_batches()
    results: dict[str, dict[str, dict[str, object]]] = {}
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        saved = work / "inputs.pt"
        torch.save(batches, saved)
        for peer in peers:
            start = time.perf_counter()
            ensure_venv(peer, not args.no_install)
            theirs = run_peer(peer, saved, work)
            results[peer] = compare(peer, theirs, batches)
            timings[peer] = time.perf_counter() - start
            print(f"{peer}: {len(results[peer])} cases in {timings[peer]:.1f} s")
    unexplained = []
    for peer, res in results.items():
        for case, r in res.items():
            if not r["ok"]:
                unexplained.append(f"{peer}:{case} (max diff {float(r['max_diff']):.2e})")  # type: ignore[arg-type]
    referenced = {
        (p, c) for row in matrix.MATRIX.values() for p, cell in row.items() for c in cell[2]
    }
    for peer, case in sorted(referenced):
        if peer in results and case not in results[peer]:
            unexplained.append(f"{peer}:{case} is named in the matrix but has no case")
    write_report(args.out, results, timings, unexplained)
    for u in unexplained:
        print("UNEXPLAINED:", u)
    print(f"wrote {args.out}; unexplained: {len(unexplained)}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
