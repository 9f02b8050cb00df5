"""``learn()`` with and without the lean LoRA forward, alternating call by call in one process.

``uv run python tools/bench/peers/ab_lean_lora.py --shape small --rounds 40`` builds the peer
benchmark's workload (``common.py``) and ours exactly as ``run_ours.py`` does, samples one
batch with ``get_action``, then times ``agent.learn`` on it, alternating (order swapped every
round) between the default (every plain LoRA layer one autograd node, ``rl_adapters.lean_lora``)
and peft's own LoRA forward (``PolicyModel.lean_lora`` disabled for that call). Both arms run
the same process, weights and batch, so load on a shared machine hits both alike. Prints the
medians and minima of each arm and their ratios; on the large shape also the LoRA-exact MFU of
each arm against the 1-thread ``torch.mm`` peak measured afterwards (formulas in
``bench_peers.flop_counts``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from common import SEED, SHAPES, build, load_model, prompt_dicts, rewards_for, setup_threads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    setup_threads()
    from bench_peers import flop_counts
    from run_ours import make_agent, matmul_peak

    tmp = tempfile.TemporaryDirectory()  # kept for the run: peft reads the model's config
    build(shape, Path(tmp.name))
    torch.manual_seed(SEED)
    agent = make_agent(load_model(Path(tmp.name)), shape)
    out = agent.get_action(prompt_dicts(shape))
    rewards = rewards_for(out.completion_ids, shape.prompt_len, shape)
    batch = (out.completion_ids, out.action_masks, rewards)
    policy = agent.policy
    lean_lora = type(policy).lean_lora
    times: dict[str, list[float]] = {"lean": [], "peft": []}
    print(f"load average before: {os.getloadavg()}", flush=True)
    for k in range(args.rounds + 1):  # round 0 is a warm-up of both arms
        for arm in ("lean", "peft") if k % 2 == 0 else ("peft", "lean"):
            enabled = arm == "lean"
            policy.lean_lora = lambda enabled=enabled: lean_lora(policy, enabled)  # type: ignore[method-assign]
            start = time.perf_counter()
            agent.learn(batch, sampling_logps=out.sampling_logprobs)
            if k:
                times[arm].append(time.perf_counter() - start)
    print(f"load average after: {os.getloadavg()}")
    med = {a: statistics.median(v) for a, v in times.items()}
    low = {a: min(v) for a, v in times.items()}
    for a in times:
        print(f"{a}: median {med[a] * 1e3:.2f} ms, min {low[a] * 1e3:.2f} ms ({args.rounds} calls)")
    print(
        f"lean/peft: {med['lean'] / med['peft']:.3f}x of medians, {low['lean'] / low['peft']:.3f}x of minima"
    )
    if args.shape == "large":
        tokens = shape.rows * (shape.prompt_len + shape.new_tokens)
        h, i = shape.hidden, shape.intermediate
        peak = max(matmul_peak(tokens, h, h), matmul_peak(tokens, h, i), matmul_peak(tokens, i, h))
        flops = flop_counts(shape)["necessary"]
        for a in times:
            print(
                f"MFU ({a}), LoRA-exact: {flops / med[a] / peak:.1%} median, "
                f"{flops / low[a] / peak:.1%} fastest (peak {peak / 1e9:.1f} GFLOP/s)"
            )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
