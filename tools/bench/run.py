"""Run the benchmarks in this folder; print a Markdown table, write results/<bench>.json."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Row, machine  # noqa: E402

#: Benchmarks with their own command line and nox session (not ``run(quick)`` modules).
STANDALONE = {"bench_peers", "bench_gpu"}  # bench_gpu: `nox -s gpu` (tools/gpu/run.py)


def table(rows: list[Row]) -> str:
    lines = [
        "| bench | case | variant | median (ms) | IQR (ms) | / plain | / floor | extra |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        base = f"{r.ratio_to_baseline:.2f}" if r.ratio_to_baseline is not None else ""
        low = f"{r.ratio_to_floor:.2f}" if r.ratio_to_floor is not None else ""
        lines.append(
            f"| {r.bench} | {r.case} | {r.variant} | {r.timing.median * 1e3:.3f} "
            f"| {r.timing.iqr * 1e3:.3f} | {base} | {low} "
            f"| {', '.join(f'{k}={v}' for k, v in r.extra.items())} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="run benchmarks whose name contains this")
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    files = sorted(
        p for p in HERE.glob("bench_*.py") if args.only in p.stem and p.stem not in STANDALONE
    )
    if not files:
        print(f"no benchmark matches {args.only!r}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    print("machine:", json.dumps(info))
    for file in files:
        rows = importlib.import_module(file.stem).run(args.quick)
        print(f"\n## {file.stem}\n\n{table(rows)}")
        payload = {"machine": info, "quick": args.quick, "rows": [r.as_dict() for r in rows]}
        (args.out / f"{file.stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
