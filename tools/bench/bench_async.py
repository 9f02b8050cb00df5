"""The asynchronous loop against the synchronous one on the demo task (``rl-train demo``).

The embedded tiny Qwen2 (~80k parameters, full fine-tuning) on ``successor_digit`` with the
demo's settings (GRPO: 8 prompts x 8 samples; REINFORCE: 64 prompts x 1, lr 1e-3, 2 output
tokens), built by ``rl_train.builder.build`` from ``DemoConfig(algo=...).run_config()``. Every
process uses one torch thread (the trainer and the worker share 2 cores); the synchronous loop
is measured with one thread too (on an idle 2-core box, two threads for the synchronous
process is the other fair baseline: ``variant="sync@2t"`` in ``_run``).

Per (algo, variant), one run of up to 375 steps (the synchronous budget of 300 + 25%) that
stops at the first greedy evaluation (every 25 steps, 40 test prompts) with accuracy >= 0.9:

* ``samples/s``: samples learned per second of loop wall time from the end of step 1 to the
  end of the last step, evaluations excluded (the one-time worker start is in step 1);
* ``p50_samples/s`` / ``p10_samples/s``: the same from the median and the 10th percentile of
  the per-step wall times (steady state; on a machine shared with other jobs the low
  percentile is the least disturbed estimate);
* ``to_0.9_s``: the same wall time (evaluations excluded) up to the evaluation that reached
  0.9, and ``to_0.9_step`` its step (None: not reached within 375 steps);
* ``startup_s``: step 1's time (the async worker's start: a fresh interpreter importing torch
  and transformers, and building its model copy);
* staleness mean and dropped batches of the async runs.

The "median" column is the seconds per step (wall / steps); a run is one sample, so the IQR
is 0 and, on a shared machine, the numbers are noisy: repeat the run before trusting a ratio.
"""

from __future__ import annotations

import functools
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


def _run(algo: str, variant: str) -> dict[str, Any]:
    threads = 2 if variant == "sync@2t" else 1
    torch.set_num_threads(threads)
    config = DemoConfig(algo=algo, steps=BUDGET, evaluation_interval=EVERY).run_config()
    staleness = {"async_s1": 1, "async_s2": 2}.get(variant)
    if staleness is not None:  # the docs' setting for stale batches (docs/tutorials/async.md)
        config.agent["vllm_importance_sampling_correction"] = True
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


def run(quick: bool) -> list[Row]:
    algos = ["grpo"] if quick else ["grpo", "reinforce"]
    variants = ["sync", "async_s1"] if quick else ["sync", "async_s1", "async_s2"]
    rows: list[Row] = []
    for algo in algos:
        results = {v: _run(algo, v) for v in variants}
        base = results["sync"]
        for variant, r in results.items():
            extra = {
                "samples/s": round(r["samples_per_s"], 1),
                "speedup": round(r["samples_per_s"] / base["samples_per_s"], 2),
                "p50_samples/s": round(r["p50_samples_per_s"], 1),
                "p50_speedup": round(r["p50_samples_per_s"] / base["p50_samples_per_s"], 2),
                "p10_samples/s": round(r["p10_samples_per_s"], 1),
                "p10_speedup": round(r["p10_samples_per_s"] / base["p10_samples_per_s"], 2),
                "to_0.9_s": None if r["to_target_s"] is None else round(r["to_target_s"], 1),
                "to_0.9_step": r["to_target_step"],
                "startup_s": round(r["startup_s"], 1),
                "staleness_mean": round(r["staleness_mean"], 2),
                "dropped": r["dropped"],
            }
            ratio = base["seconds_per_step"] and r["seconds_per_step"] / base["seconds_per_step"]
            rows.append(
                Row(
                    "async",
                    f"demo {algo}",
                    variant,
                    Timing([r["seconds_per_step"]]),
                    baseline="sync",
                    ratio_to_baseline=ratio,
                    extra=extra,
                )
            )
            print(algo, variant, extra, flush=True)
    return rows
