"""``GRPO.learn()`` with and without shared prompts (``share_prompt_prefix``).

Batch: ``B`` prompts x ``G`` completions, each group's rows repeating its prompt, completions
of uniform random length in ``C/4..C`` (ragged), right-padded, packed forwards (the default).
One optimizer step per call (on-policy), a frozen reference adapter (beta 0.04), LoRA r=8 on
every linear layer, one CPU thread.

Cases:

* ``toy``: the small shape of ``bench_peers.py`` (hidden 64, 2 layers, vocabulary 1000),
  ``B = 4``, ``G = 4``, prompts of 16 tokens, completions of up to 32: the fixed cost of the
  shared layout against little saved work.
* ``long prompts``: a random Qwen2 of hidden 256, 4 layers (vocabulary 8192), ``B = 2``,
  ``G = 8``, prompts of 256 tokens (a system prompt and few-shot examples), completions of up
  to 64.
* ``short prompts``: the same model, ``B = 2``, ``G = 8``, prompts of 32 tokens, completions of
  up to 256.

Variants: ``unshared`` (``share_prompt_prefix=False``, the baseline), ``shared`` (``True``:
wherever a token is saved) and ``default`` (``None``: where the saved work reaches
``rl_algos.shared_prefix.MIN_SAVED_WORK``). The three agents start from identical weights and
receive the same updates; their calls are interleaved round by round (the order rotating), so
a change of the machine's load hits all three; ``round_ratios`` are the per-round times over
``unshared``'s. ``tokens`` counts real tokens, ``packed_tokens`` those the shared layout runs.
``peak_extra_MiB`` (full runs only): the peak resident memory of one ``learn()`` in a fresh
process above the resident memory before it (Linux: ``/proc/self/clear_refs`` resets the peak;
a first call pays the one-time costs; ``MALLOC_MMAP_THRESHOLD_=65536``), the median of
:data:`MEMORY_REPEATS` processes per (case, variant). It includes the allocator's slack.
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
from harness import Row, Timing, measure, status_kib, with_memory_ratios, with_ratios
from peft import LoraConfig
from rl_algos import GRPO
from rl_testing.models import tiny_qwen2

SEED = 0
VARIANTS = {"unshared": False, "shared": True, "default": None}
#: name -> (model config, B, G, prompt tokens, longest completion)
CASES: dict[str, tuple[dict[str, Any], int, int, int, int]] = {
    "toy": (
        {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "heads": 2,
         "kv_heads": 2, "intermediate_size": 128},
        4, 4, 16, 32,
    ),
    "long prompts": (
        {"vocab_size": 8192, "hidden_size": 256, "num_hidden_layers": 4, "heads": 4,
         "kv_heads": 2, "intermediate_size": 1024},
        2, 8, 256, 64,
    ),
    "short prompts": (
        {"vocab_size": 8192, "hidden_size": 256, "num_hidden_layers": 4, "heads": 4,
         "kv_heads": 2, "intermediate_size": 1024},
        2, 8, 32, 256,
    ),
}  # fmt: skip


def _agent(config: dict[str, Any], group: int, share: bool | None) -> GRPO:
    cfg = dict(config)
    vocab = cfg.pop("vocab_size")
    model = tiny_qwen2(
        vocab, seed=SEED, num_attention_heads=cfg.pop("heads"),
        num_key_value_heads=cfg.pop("kv_heads"), tie_word_embeddings=False, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, attn_implementation="sdpa", **cfg,
    )  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    return GRPO(
        pad_token_id=0, pad_token="<pad>", actor_network=model, lora_config=lora,
        group_size=group, beta=0.04, batch_size=10**6, lr=1e-4, max_grad_norm=1.0,
        temperature=1.0, device="cpu", seed=SEED, share_prompt_prefix=share,
    )  # fmt: skip


def _experience(vocab: int, B: int, G: int, prompt: int, longest: int) -> tuple[Any, int, int]:
    """``((ids, action mask, rewards), real tokens, tokens after sharing)``."""
    gen = torch.Generator().manual_seed(SEED)
    N, L = B * G, prompt + longest
    prompts = torch.randint(3, vocab, (B, prompt), generator=gen)
    prompts[:, 0] = 1
    ids = torch.randint(3, vocab, (N, L), generator=gen)
    ids[:, :prompt] = prompts.repeat_interleave(G, 0)
    lengths = torch.randint(max(1, longest // 4), longest + 1, (N,), generator=gen)
    pos = torch.arange(L)
    real = pos[None] < (prompt + lengths)[:, None]
    ids = ids.masked_fill(~real, 0)
    action = real[:, 1:] & (pos[None, 1:] >= prompt)
    rewards = torch.rand(N, generator=gen)
    tokens = int(real.sum())
    return (ids, action, rewards), tokens, tokens - B * (G - 1) * prompt


def _worker(case: str, variant: str) -> dict[str, int]:
    """In a fresh process: peak RSS of one ``learn()`` minus the RSS before it (Linux).

    A first ``learn()`` on the same batch pays the one-time costs (imports, thread pools,
    optimizer state); the peak of the second is measured.
    """
    torch.set_num_threads(1)
    config, B, G, prompt, longest = CASES[case]
    agent = _agent(config, G, VARIANTS[variant])
    experiences = _experience(config["vocab_size"], B, G, prompt, longest)[0]
    agent.learn(experiences)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak resident set size
    before = status_kib("VmRSS")
    agent.learn(experiences)
    return {"peak_extra_bytes": (status_kib("VmHWM") - before) * 1024}


#: Fresh processes per (case, variant) for the memory figure; the median is reported.
MEMORY_REPEATS = 3


def _peak_extra_mib(case: str, variant: str) -> float | None:
    # glibc serves every block of 64 KiB or more with its own mmap and returns it at free
    # (as tools/bench/checkpointing_memory.py): its dynamic threshold otherwise keeps freed
    # blocks in the heap, and the peak moves by tens of MiB between identical runs
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "MALLOC_MMAP_THRESHOLD_": "65536",
    }
    args = [sys.executable, __file__, "--worker", case, variant]
    peaks = []
    for _ in range(MEMORY_REPEATS):
        proc = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            print(f"{case} {variant}: memory worker failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            return None
        peaks.append(int(json.loads(proc.stdout.strip().splitlines()[-1])["peak_extra_bytes"]))
    return round(statistics.median(peaks) / 2**20, 1)


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(1)
    repeats = 1 if quick else int(os.environ.get("BENCH_SHARED_ROUNDS", "5"))
    rows: list[Row] = []
    for case, (config, B, G, prompt, longest) in CASES.items():
        experiences, tokens, packed = _experience(config["vocab_size"], B, G, prompt, longest)
        losses: dict[str, float] = {}
        shared_forwards: dict[str, int] = {}
        calls, samples = {}, {}
        load = [round(os.getloadavg()[0], 2)]
        for variant, share in VARIANTS.items():
            agent = _agent(config, G, share)

            def call(
                agent: GRPO = agent,
                name: str = variant,
                exp: Any = experiences,
                out: dict[str, float] = losses,
                shared: dict[str, int] = shared_forwards,
            ) -> None:
                out[name] = agent.learn(exp)["loss"]
                shared[name] = agent.packing_report.shared_forwards

            call()  # warm-up
            calls[variant] = call
            samples[variant] = []
        names = list(VARIANTS)
        for r in range(repeats):
            for variant in names[r % 3 :] + names[: r % 3]:
                samples[variant].append(measure(calls[variant], repeats=1, warmup=0).samples[0])
        load.append(round(os.getloadavg()[0], 2))
        label = f"{case}: B={B} G={G} prompt {prompt}, completions <= {longest}"
        for variant in VARIANTS:
            extra: dict[str, Any] = {
                "tokens": tokens,
                "packed_tokens": packed if shared_forwards[variant] else tokens,
                "shared_forwards": shared_forwards[variant],
                "tokens_per_s": round(tokens / Timing(samples[variant]).median),
                "loss": f"{losses[variant]:.6g}",
                "load_avg_1min": load,
            }
            if variant != "unshared":
                extra["round_ratios"] = [
                    round(a / b, 3)
                    for a, b in zip(samples[variant], samples["unshared"], strict=True)
                ]
            peak = None if quick else _peak_extra_mib(case, variant)
            if peak is not None:
                extra["peak_extra_MiB"] = peak
            rows.append(Row("shared_prefix", label, variant, Timing(samples[variant]), extra=extra))
    return with_memory_ratios(with_ratios(rows, baseline="unshared"), baseline="unshared")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    print(json.dumps(_worker(sys.argv[2], sys.argv[3])))
