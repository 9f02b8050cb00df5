"""The asynchronous loop against the synchronous one on the demo task (``rl-train demo``).

The embedded tiny Qwen2 (~80k parameters, full fine-tuning) on ``successor_digit`` with the
demo's settings (GRPO: 8 prompts x 8 samples; REINFORCE: 64 prompts x 1, lr 1e-3, 2 output
tokens), built by ``rl_train.builder.build`` from ``DemoConfig(algo=...).run_config()``. Every
process uses one torch thread (the trainer and the worker share 2 cores); the synchronous loop
is measured with one thread too (on an idle 2-core box, two threads for the synchronous
process is the other fair baseline: ``variant="sync@2t"`` in ``_run``).

Per algo, ``ROUNDS`` interleaved rounds (``--quick``: one, GRPO only); round ``k`` runs sync,
``max_staleness: 1`` and ``max_staleness: 2`` once each with seed ``k`` (the order rotated by
round). Each run goes up to 375 steps (the synchronous budget of 300 + 25%) and stops at the
first greedy evaluation (every 25 steps, 40 test prompts) with accuracy >= 0.9. The async runs
use the tutorial's setting for stale batches (the agent's ``clip_against_sampler``: the
clipped ratio against the sampler's log-probs). Per run:

* ``samples/s``: samples learned per second of loop wall time from the end of step 1 to the
  end of the last step, evaluations excluded (the one-time worker start is in step 1);
* ``p10_samples/s``: the same from the 10th percentile of
  the per-step wall times (steady state; on a machine shared with other jobs the low
  percentile is the least disturbed estimate);
* ``to_0.9_s``: the same wall time (evaluations excluded) up to the evaluation that reached
  0.9, and ``to_0.9_step`` its step (None: not reached within 375 steps);
* ``startup_s``: step 1's time (the async worker's start: a fresh interpreter importing torch
  and transformers, and building its model copy);
* staleness mean and dropped batches of the async runs.

Per variant the row reports medians over the rounds: ``speedup`` (and its range) is the
median of each round's ratio to that round's synchronous run (paired, so a busy moment of a
shared machine hits both), ``p10_speedup`` the same from the 10th percentile, ``to_0.9_step``
each round's step, ``load`` the 1-minute load average after each run. The "median" column is
the seconds per step.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from harness import Row, Timing
from rl_train.async_loop import AsyncReasoningSource
from rl_train.builder import build, rollout_pieces
from rl_train.config import AsyncConfig
from rl_train.demo import DemoConfig
from rl_train.evaluation import greedy_accuracy
from rl_train.hooks import Evaluation, Hook, LoopState
from rl_train.loop import train_loop
from rl_train.sources import ReasoningSource, Source

TARGET, BUDGET, EVERY = 0.9, 375, 25
#: Interleaved rounds (round ``k``: every variant once, seed ``k``); ``--quick``: one.
ROUNDS = 3
SHOWN = ("samples_per_s", "p10_samples_per_s", "to_target_step", "staleness_mean")


@dataclass
class _Clock(Hook):
    """Step end times, evaluation seconds, and a stop at the target accuracy."""

    ends: list[float] = field(default_factory=list)
    evals: float = 0.0
    reached: int | None = None
    reached_at: float = 0.0
    rows: list[dict[str, float]] = field(default_factory=list)

    def after_step(self, state: LoopState, row: dict[str, float]) -> None:
        self.ends.append(time.perf_counter() - self.evals)
        self.rows.append(dict(row))
        if row.get("eval_accuracy", 0.0) >= TARGET and self.reached is None:
            self.reached, self.reached_at = state.step, self.ends[-1]
            state.stop = True


def _run(algo: str, variant: str, seed: int = 0) -> dict[str, Any]:
    threads = 2 if variant == "sync@2t" else 1
    torch.set_num_threads(threads)
    demo = DemoConfig(algo=algo, steps=BUDGET, evaluation_interval=EVERY, seed=seed)
    config = demo.run_config()
    staleness = {"async_s1": 1, "async_s2": 2}.get(variant)
    if staleness is not None:  # the docs' settings for stale batches (docs/tutorials/async.md)
        config.agent["clip_against_sampler"] = True
    built = build(config, distributed=False)
    clock = _Clock()

    def accuracy(agent: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        value = greedy_accuracy(agent, built.env)
        clock.evals += time.perf_counter() - t0
        return {"eval_accuracy": value}

    source: Source = ReasoningSource(built.env)
    if staleness is not None:
        source = AsyncReasoningSource(
            functools.partial(rollout_pieces, config),
            AsyncConfig(max_staleness=staleness, worker_threads=1),
        )
    start = time.perf_counter()
    train_loop(
        [built.agent], source, steps=BUDGET, hooks=[Evaluation(EVERY, extra=accuracy), clock]
    )
    per_step = int(built.agent.batch_size)  # samples per step (64 in both demos)
    steps = len(clock.ends)
    wall = clock.ends[-1] - clock.ends[0]
    gaps = sorted(b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False))
    p50 = gaps[len(gaps) // 2] if gaps else float("nan")
    p10 = gaps[len(gaps) // 10] if gaps else float("nan")
    return {
        "p50_samples_per_s": per_step / p50,
        "p10_samples_per_s": per_step / p10,
        "steps": steps,
        "samples_per_s": per_step * (steps - 1) / wall,
        "to_target_s": None if clock.reached is None else clock.reached_at - clock.ends[0],
        "to_target_step": clock.reached,
        "startup_s": clock.ends[0] - start,
        "staleness_mean": sum(r.get("async_staleness_mean", 0.0) for r in clock.rows) / steps,
        "dropped": sum(r.get("async_dropped", 0.0) for r in clock.rows),
        "seconds_per_step": wall / max(1, steps - 1),
    }


def _round(algo: str, k: int, variants: list[str]) -> dict[str, dict[str, Any]]:
    """One run of each variant with seed ``k``, in an order rotated by ``k`` (interleaved)."""
    order = variants[k % len(variants) :] + variants[: k % len(variants)]
    out = {}
    for variant in order:
        result = _run(algo, variant, seed=k)
        result["load"] = os.getloadavg()[0]
        out[variant] = result
        print(algo, f"round {k}", variant, {key: result[key] for key in SHOWN}, flush=True)
    return out


def run(quick: bool) -> list[Row]:
    algos = ["grpo"] if quick else ["grpo", "reinforce"]
    variants = ["sync", "async_s1", "async_s2"]
    rounds = 1 if quick else ROUNDS
    rows: list[Row] = []
    for algo in algos:
        results = [_round(algo, k, variants) for k in range(rounds)]
        for variant in variants:
            runs = [r[variant] for r in results]
            speedups = [r[variant]["samples_per_s"] / r["sync"]["samples_per_s"] for r in results]
            p10 = [
                r[variant]["p10_samples_per_s"] / r["sync"]["p10_samples_per_s"] for r in results
            ]
            reached = [r["to_target_s"] for r in runs if r["to_target_s"] is not None]
            extra = {
                "samples/s": round(statistics.median(r["samples_per_s"] for r in runs), 1),
                "speedup": round(statistics.median(speedups), 2),
                "speedup_range": (round(min(speedups), 2), round(max(speedups), 2)),
                "p10_speedup": round(statistics.median(p10), 2),
                "to_0.9_step": [r["to_target_step"] for r in runs],
                "to_0.9_s": round(statistics.median(reached), 1) if reached else None,
                "startup_s": round(statistics.median(r["startup_s"] for r in runs), 1),
                "staleness_mean": round(statistics.median(r["staleness_mean"] for r in runs), 2),
                "dropped": sum(r["dropped"] for r in runs),
                "load": [round(r["load"], 1) for r in runs],
            }
            seconds = [r["seconds_per_step"] for r in runs]
            base = statistics.median(r["sync"]["seconds_per_step"] for r in results)
            rows.append(
                Row(
                    "async",
                    f"demo {algo}",
                    variant,
                    Timing(seconds),
                    baseline="sync",
                    ratio_to_baseline=statistics.median(seconds) / base,
                    extra=extra,
                )
            )
            print(algo, variant, extra, flush=True)
    return rows
