"""``GRPO.learn()`` padded vs packed (``use_sequence_packing``, ``micro_batch_tokens``).

Batch: 8 prompts x 8 completions (``N = 64`` rows), prompts of 16 tokens, completions of
uniform random length in ``8..MAX`` (``ragged``) or all ``MAX`` long (``uniform``), right-padded
to ``L = 16 + MAX``; ``MAX`` is ``BENCH_PACKING_MAX_LEN`` (default 512). Model: a random Qwen2 of
~19M parameters (hidden 384, 6 layers, 6 heads, 2 KV heads, intermediate 1536, vocabulary
8192; SDPA attention), LoRA r=8 on every linear layer, a frozen reference adapter (beta 0.04),
one optimizer step per call (on-policy: no old-log-prob forward).

* ``padded``: ``use_sequence_packing=False``, micro-batches of 16 rows (``16 * L`` tokens per
  forward, padding included).
* ``packed``: ``use_sequence_packing=True, micro_batch_tokens=16 * L``: the same token budget
  per forward, filled with real tokens only.
* ``default``: the default ``use_sequence_packing=None`` ("auto": packs where it can) with
  micro-batches of 16 rows, what a user who sets nothing but the micro-batch size gets.

``BENCH_PACKING_CASES`` picks the cases (``ragged,uniform``, the default, or one of them).

Both agents start from identical weights and receive the same updates. ``tokens/s`` counts
real tokens (prompt + completion) per second of ``learn()``; medians of 3 timed calls after one
warm-up, the variants' calls interleaved round by round (order rotating), so a change of
the machine's load hits both; ``round_ratios`` are the per-round packed / padded times and
``load_avg_1min`` the 1-minute load average before and after the timed rounds. ``peak_extra_MiB``: on CUDA the peak allocated memory of the warm-up call above what
was allocated before it; on CPU (full runs only) the peak resident memory of one call in a
fresh process per (case, variant) above the resident memory before it (Linux:
``/proc/self/clear_refs`` resets the peak; a call on short rows first pays the one-time
costs), which includes the allocator's slack. Runs with one CPU thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from harness import Row, Timing, measure, status_kib, with_memory_ratios, with_ratios
from peft import LoraConfig
from rl_algos import GRPO
from rl_testing.models import tiny_qwen2

B, G, PROMPT_LEN, ROWS_PER_MB, SEED = 8, 8, 16, 16, 0
VARIANTS = ("padded", "packed", "default")
N = B * G


def _agent(device: torch.device, **options: Any) -> GRPO:
    model = tiny_qwen2(
        8192, seed=SEED, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
        num_key_value_heads=2, intermediate_size=1536, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa",
    )  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    return GRPO(
        pad_token_id=0, pad_token="<pad>", actor_network=model, lora_config=lora, group_size=G,
        beta=0.04, batch_size=N, lr=1e-4, max_grad_norm=1.0, temperature=1.0, device=device,
        seed=SEED, **options,
    )  # fmt: skip


def _experience(max_len: int, ragged: bool, device: torch.device) -> tuple[Any, int]:
    gen = torch.Generator().manual_seed(SEED)
    L = PROMPT_LEN + max_len
    ids = torch.randint(3, 8192, (N, L), generator=gen)
    ids[:, 0] = 1
    lengths = torch.randint(8, max_len + 1, (N,), generator=gen) if ragged else None
    if lengths is None:
        lengths = torch.full((N,), max_len)
    pos = torch.arange(L)
    real = pos[None] < (PROMPT_LEN + lengths)[:, None]
    ids = ids.masked_fill(~real, 0)
    action = real[:, 1:] & (pos[None, 1:] >= PROMPT_LEN)
    rewards = torch.rand(N, generator=gen)
    return (ids.to(device), action.to(device), rewards.to(device)), int(real.sum())


def _options(variant: str, budget: int) -> dict[str, Any]:
    if variant == "padded":
        return {"use_sequence_packing": False, "micro_batch_size_per_gpu": ROWS_PER_MB}
    if variant == "default":
        return {"micro_batch_size_per_gpu": ROWS_PER_MB}
    return {"use_sequence_packing": True, "micro_batch_tokens": budget}


def _worker(max_len: int, ragged: bool, variant: str) -> dict[str, int]:
    """In a fresh process: peak RSS of one full call minus the RSS before it.

    A call on a batch of short rows first pays the one-time costs (lazy imports, thread
    pools, optimizer state) without raising the peak much.
    """
    torch.set_num_threads(1)
    device = torch.device("cpu")
    agent = _agent(device, **_options(variant, ROWS_PER_MB * (PROMPT_LEN + max_len)))
    agent.learn(_experience(8, False, device)[0])
    experiences = _experience(max_len, ragged, device)[0]
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak resident set size (Linux)
    before = status_kib("VmRSS")
    agent.learn(experiences)
    return {"peak_extra_bytes": (status_kib("VmHWM") - before) * 1024}


def _peak_extra_mib(max_len: int, ragged: bool, variant: str, device: torch.device) -> Any:
    if device.type == "cuda":
        return None  # measured in-process by _cuda_peak_extra_mib
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    args = [sys.executable, __file__, "--worker", str(max_len), str(int(ragged)), variant]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        print(f"{variant}: memory worker failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return round(int(result["peak_extra_bytes"]) / 2**20, 1)


def _cuda_peak_extra_mib(fn: Any, device: torch.device) -> float | None:
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1)


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    max_len = int(os.environ.get("BENCH_PACKING_MAX_LEN", "512"))
    repeats = 1 if quick else 3
    budget = ROWS_PER_MB * (PROMPT_LEN + max_len)
    rows: list[Row] = []
    cases = os.environ.get("BENCH_PACKING_CASES", "ragged,uniform").split(",")
    unknown = sorted(set(cases) - {"ragged", "uniform"})
    if unknown:
        raise ValueError(f"BENCH_PACKING_CASES: unknown {unknown}; use ragged and/or uniform")
    for ragged in [c == "ragged" for c in ("ragged", "uniform") if c in cases]:
        experiences, tokens = _experience(max_len, ragged, device)
        case = f"{'ragged 8' if ragged else 'uniform ' + str(max_len)}..{max_len} N={N}"
        losses: dict[str, float] = {}
        calls, peaks, samples = {}, {}, {}
        load = [round(os.getloadavg()[0], 2)]
        for variant in VARIANTS:
            agent = _agent(device, **_options(variant, budget))

            def call(
                agent: GRPO = agent, name: str = variant, exp: Any = experiences, out: Any = losses
            ) -> None:
                out[name] = agent.learn(exp)["loss"]

            calls[variant] = call
            peaks[variant] = _cuda_peak_extra_mib(call, device)  # also the warm-up
            samples[variant] = []
        # interleaved rounds (the machine is shared: load varies)
        for r in range(repeats):  # rotate the order: each variant goes first once in 3 rounds
            for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
                samples[variant].append(measure(calls[variant], repeats=1, warmup=0).samples[0])
        load.append(round(os.getloadavg()[0], 2))
        calls.clear()
        for variant in VARIANTS:
            peak = peaks[variant]
            if peak is None and not quick:
                peak = _peak_extra_mib(max_len, ragged, variant, device)
            timing = Timing(samples[variant])
            extra: dict[str, Any] = {
                "tokens": tokens,
                "padded_tokens": N * (PROMPT_LEN + max_len),
                "tokens_per_s": round(tokens / timing.median),
                "loss": f"{losses[variant]:.5g}",
                "load_avg_1min": load,
            }
            if variant != "padded":
                extra["round_ratios"] = [
                    round(a / b, 3)
                    for a, b in zip(samples[variant], samples["padded"], strict=True)
                ]
            if peak is not None:
                extra["peak_extra_MiB"] = peak
            rows.append(Row("packing", case, variant, timing, extra=extra))
    return with_memory_ratios(with_ratios(rows, baseline="padded"), baseline="padded")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    print(json.dumps(_worker(int(sys.argv[2]), bool(int(sys.argv[3])), sys.argv[4])))
