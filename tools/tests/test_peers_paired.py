"""tools/bench/peers_paired.py: ratios of the peer benchmark paired round by round."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from peers_paired import paired_ratios, paired_table, stats

FIGURES = (("learn", "learn"), ("generate", "generate"))


def _run(impl: str, rnd: int, **samples: list[float]) -> dict[str, Any]:
    return {"impl": impl, "shape": "small", "gc": "off", "round": rnd, "samples": samples}


def test_each_round_is_divided_by_its_own_peer_run() -> None:
    runs = [
        _run("ours", 0, learn=[10.0, 12.0, 11.0]),  # median 11
        _run("agilerl", 0, learn=[22.0, 21.0, 23.0]),  # 22: ratio 0.5
        _run("ours", 1, learn=[30.0]),  # a slow stretch of the box: both sides slower
        _run("agilerl", 1, learn=[40.0]),  # ratio 0.75
        _run("ours", 2, learn=[12.0]),
        _run("agilerl", 2, learn=[20.0]),  # ratio 0.6
        _run("trl", 2, learn=[24.0], generate=[5.0]),  # only round 2 has TRL: one ratio
        {"impl": "trl", "shape": "small", "gc": "off", "round": 1, "error": "crashed"},
    ]
    got = paired_ratios(runs)["small"]["off"]
    assert got["learn: ours/agilerl"] == pytest.approx(
        {"median": 0.6, "min": 0.5, "max": 0.75, "n": 3}
    )
    # pooled medians (12 / 22) would give 0.545: the drift of round 1 is not paired away
    assert got["learn: ours/trl"] == pytest.approx({"median": 0.5, "min": 0.5, "max": 0.5, "n": 1})
    assert "generate: ours/trl" not in got  # ours measured no generate figure
    table = paired_table(got, FIGURES)
    assert "| learn | 0.50x (0.50-0.50, 1) | 0.60x (0.50-0.75, 3) |" in table
    assert "generate" not in table  # no pair for that figure: no row


def test_shapes_and_settings_stay_apart_and_empty_input_gives_nothing() -> None:
    runs = [
        _run("ours", 0, learn=[1.0]),
        {**_run("bare", 0, generate=[2.0]), "gc": "on"},
        {**_run("ours", 0, generate=[1.0]), "gc": "on"},
    ]
    got = paired_ratios(runs)
    assert got["small"]["off"] == {}
    assert got["small"]["on"]["generate: ours/bare"]["median"] == pytest.approx(0.5)
    assert paired_ratios([]) == {}
    assert paired_table({}, FIGURES) == ""
    assert stats([]) is None
    assert stats([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
