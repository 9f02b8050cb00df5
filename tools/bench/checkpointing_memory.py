"""Peak CPU memory of one ``GRPO.learn()`` with and without gradient checkpointing (issue 37).

Model and batch: ``bench_learn``'s ~19M-parameter random Qwen2 (hidden 384, 6 layers, 6 heads,
2 KV heads, intermediate 1536, vocabulary 8192, untied head; SDPA attention), LoRA r=8 on every
linear layer with a frozen reference adapter (beta 0.04), and its batch of 8 prompts x 8
completions (``N = 64`` rows of 16 prompt tokens and 8..48 completion tokens, right-padded to
``L = 64``), the whole batch in one micro-batch, one optimizer step per call.

Configurations: ``gradient_checkpointing`` off / on x ``use_sequence_packing`` ``True``
(packed) / ``False`` (padded). Each runs in a fresh process (``--worker``) with one torch
thread: a call on one short group first pays the one-time costs (lazy imports, thread pools,
the optimizer's state), then the measured call on the full batch.

Method: torch has no CPU allocator statistics (``torch.cuda.max_memory_allocated`` is CUDA
only, and ``tracemalloc`` does not see torch's allocations), so the figure is the process's
peak resident memory over the measured call minus the peak before it (Linux ``VmHWM``, as
``bench_learn._max_rss_bytes``). The workers run with ``MALLOC_MMAP_THRESHOLD_=65536``, so
glibc serves every block of 64 KiB or more (all activations here) with its own ``mmap`` and
returns it at ``free``: without it, glibc's dynamic threshold keeps freed large blocks in the
heap and the peak varied by 200 MiB between identical runs. Each configuration runs
``REPEATS`` times (fresh processes); the table gives the median and the range. The figure
still includes the allocator's slack, so differences of a few MiB mean nothing.

Recomputation is made visible by counting, over the measured call, the forwards of the
layers' attention modules (a forward hook on every ``self_attn``) and the checkpointed
recomputations (``rl_adapters.replay``'s replay context, entered once per recomputed layer):
with checkpointing the actor's layers run forward a second time in the backward.

Usage: ``uv run python tools/bench/checkpointing_memory.py`` (prints a Markdown table and
one JSON line per configuration).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_learn import (
    BETA,
    LR,
    MAX_GRAD_NORM,
    PAD_ID,
    SEED,
    G,
    N,
    _experience,
    _max_rss_bytes,
    _model,
)

REPEATS = 3
CONFIGS = [
    {"use_sequence_packing": packing, "gradient_checkpointing": gc}
    for packing in (True, False)
    for gc in (False, True)
]


def _agent(gradient_checkpointing: bool, use_sequence_packing: bool) -> Any:
    from peft import LoraConfig
    from rl_algos import GRPO

    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    return GRPO(
        pad_token_id=PAD_ID, pad_token="<pad>", actor_network=_model("20M"), lora_config=lora,
        group_size=G, loss_type="grpo", beta=BETA, update_epochs=1, batch_size=N,
        micro_batch_size_per_gpu=None, max_grad_norm=MAX_GRAD_NORM, lr=LR, temperature=1.0,
        device="cpu", seed=SEED, gradient_checkpointing=gradient_checkpointing,
        use_sequence_packing=use_sequence_packing,
    )  # fmt: skip


def _worker(gradient_checkpointing: bool, use_sequence_packing: bool) -> dict[str, Any]:
    """In a fresh process: the measured call's peak RSS delta and its forward counts."""
    from rl_adapters import replay

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    agent = _agent(gradient_checkpointing, use_sequence_packing)
    model = agent.policy.causal_lm
    vocab = int(model.config.vocab_size)
    counts = {"attention_forwards": 0, "recomputations": 0}

    def attention_hook(*_: object) -> None:
        counts["attention_forwards"] += 1

    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            module.register_forward_hook(attention_hook)
    enter = replay._Replay.__enter__

    def counted(self: Any) -> None:
        counts["recomputations"] += 1
        enter(self)

    replay._Replay.__enter__ = counted  # type: ignore[method-assign]

    def learn(exp: Any) -> float:
        return float(agent.learn((exp.ids, exp.action_mask, exp.rewards))["loss"])

    learn(_experience(vocab, torch.device("cpu"), prompts=1, completion_len=8))  # one-time costs
    exp = _experience(vocab, torch.device("cpu"))
    counts.update(dict.fromkeys(counts, 0))
    base = _max_rss_bytes()
    loss = learn(exp)
    peak = _max_rss_bytes() - base
    return {
        "gradient_checkpointing": gradient_checkpointing,
        "use_sequence_packing": use_sequence_packing,
        "checkpointed": bool(getattr(model, "_rl_checkpoint", None)),
        "peak_extra_MiB": round(peak / 2**20, 1),
        "loss": loss,
        **counts,
    }


def main() -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    table = []
    for config in CONFIGS:
        args = [str(config["gradient_checkpointing"]), str(config["use_sequence_packing"])]
        runs = []
        for _ in range(REPEATS):
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", *args],
                capture_output=True, text=True, check=True, env=env,
            )  # fmt: skip
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
        table.append(runs)
    print(
        "\n| batch | checkpointing | peak extra MiB: median (range) "
        "| attention forwards | recomputations | loss |"
    )
    print("|---|---|---|---:|---:|---|")
    for runs in table:
        r = runs[0]
        peaks = sorted(x["peak_extra_MiB"] for x in runs)
        print(
            f"| {'packed' if r['use_sequence_packing'] else 'padded'} "
            f"| {'on' if r['gradient_checkpointing'] else 'off'} "
            f"| {statistics.median(peaks)} ({peaks[0]}-{peaks[-1]}) "
            f"| {r['attention_forwards']} | {r['recomputations']} | {r['loss']:.6g} |"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(sys.argv[2] == "True", sys.argv[3] == "True")))
    else:
        sys.exit(main())
