"""Per-round paired ratios of the peer benchmark (``bench_peers.py``), stdlib only.

Each round of ``nox -s bench-peers`` runs every implementation once, one subprocess after the
other, within a minute or two. A shared box drifts over a run (its speed moved by 10-20%
within an hour here, see ``docs/benchmarks.md``), and the ratio of two pooled medians mixes that
drift into the comparison. The paired ratio divides ours by a peer *within each round* (each
side's median over its timed steps) and reports the median and range of those per-round
ratios: rounds taken on a slow stretch of the box count as much as rounds taken on a fast one.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["PEERS", "paired_ratios", "paired_table", "stats"]

#: The implementations ours is divided by, in table order.
PEERS = ("trl", "agilerl", "bare")


def stats(samples: list[float]) -> dict[str, float] | None:
    """``{"median", "min", "max", "n"}`` of ``samples``, or None when there are none."""
    if not samples:
        return None
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def paired_ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{shape: {gc: {"<figure>: ours/<peer>": stats of the per-round ratios}}}``.

    A round counts for a figure and a peer when both ours and that peer measured the figure in
    it (the round's subprocesses of one shape and gradient-checkpointing setting).
    """
    cells: dict[tuple[str, str, int], dict[str, dict[str, float]]] = {}
    for r in runs:
        if "samples" not in r:
            continue
        key = (r["shape"], r["gc"], r["round"])
        medians = {f: statistics.median(v) for f, v in r["samples"].items() if v}
        cells.setdefault(key, {})[r["impl"]] = medians
    per_round: dict[tuple[str, str], dict[str, list[float]]] = {}
    for (shape, gc, _), impls in sorted(cells.items()):
        ours = impls.get("ours", {})
        out = per_round.setdefault((shape, gc), {})
        for peer in PEERS:
            for fig, value in ours.items():
                other = impls.get(peer, {}).get(fig)
                if other:
                    out.setdefault(f"{fig}: ours/{peer}", []).append(value / other)
    result: dict[str, Any] = {}
    for (shape, gc), ratios in per_round.items():
        result.setdefault(shape, {})[gc] = {k: stats(v) for k, v in ratios.items()}
    return result


def paired_table(row: dict[str, Any], figures: tuple[tuple[str, str], ...]) -> str:
    """A Markdown table of one shape's paired ratios (``paired_ratios(...)[shape][gc]``)."""
    peers = [p for p in PEERS if any(k.endswith(f"ours/{p}") for k in row)]
    if not peers:
        return ""
    head = ["ratios paired by round: median (min-max, rounds)", *(f"ours/{p}" for p in peers)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(peers)]
    for fig, label in figures:
        cells = [label]
        for peer in peers:
            s = row.get(f"{fig}: ours/{peer}")
            cells.append(
                f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}, {s['n']})" if s else "-"
            )
        if any(c != "-" for c in cells[1:]):
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
