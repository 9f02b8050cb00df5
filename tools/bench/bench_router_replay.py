"""``GRPO.learn()`` on a mixture-of-experts model with and without routing replay (R2).

Model: a random Qwen3-MoE of hidden 128, 4 layers of 8 experts (MLP width 64), 2 routed per
token, vocabulary 4096; LoRA r=8 on the attention, no KL term (beta 0: every forward is the
actor's).
Batch: ``B = 4`` prompts x ``G = 4`` completions, prompts of 32 tokens, completions of uniform
random length in 16..64, packed forwards (the default). ``update_epochs = 2``: both variants
run the forward that scores the old log-probs, and two optimizer steps (the second replays).
One CPU thread.

Variants: ``afresh`` (``router_replay=None``, the baseline: every forward routes again; the
group's rows share their prompt's forward, the default), ``afresh unshared`` (the same with
``share_prompt_prefix=False``: R2's forwards do not share) and ``R2`` (the old forward records
the routes, the update's forwards force them). The agents start from identical weights and
receive the same batch; their calls interleave round by round (the order rotating), so a change
of the machine's load hits all; ``round_ratios`` are the per-round times over ``afresh``'s. ``route_flips``: the fraction of routes R2's update replaced (mean over the
calls); ``routes_KiB``: the recorded routes of the batch (``[N, L, Y, k]`` int16).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch
from harness import Row, Timing, measure, with_ratios
from peft import LoraConfig
from rl_algos import GRPO
from rl_testing.models import tiny_qwen3_moe

SEED = 0
#: variant -> (router_replay, share_prompt_prefix)
VARIANTS: dict[str, tuple[str | None, bool | None]] = {
    "afresh": (None, None),
    "afresh unshared": (None, False),
    "R2": ("R2", None),  # its forwards do not share: the same forwards as "afresh unshared"
}
B, G, PROMPT, LONGEST, VOCAB = 4, 4, 32, 64, 4096
MODEL: dict[str, Any] = {
    "hidden_size": 128, "num_hidden_layers": 4, "num_experts": 8, "moe_intermediate_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
}  # fmt: skip


def _agent(mode: str | None, share: bool | None) -> GRPO:
    model = tiny_qwen3_moe(
        VOCAB, seed=SEED, pad_token_id=0, bos_token_id=1, eos_token_id=2, **MODEL
    )
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    return GRPO(
        pad_token_id=0, pad_token="<pad>", actor_network=model, lora_config=lora, group_size=G,
        beta=0.0, batch_size=10**6, update_epochs=2, lr=1e-3, max_grad_norm=1.0, device="cpu",
        seed=SEED, router_replay=mode, share_prompt_prefix=share,
    )  # fmt: skip


def _experience() -> tuple[Any, int, int]:
    """``((ids, action mask, rewards), real tokens, padded width)``."""
    gen = torch.Generator().manual_seed(SEED)
    N, L = B * G, PROMPT + LONGEST
    prompts = torch.randint(3, VOCAB, (B, PROMPT), generator=gen)
    prompts[:, 0] = 1
    ids = torch.randint(3, VOCAB, (N, L), generator=gen)
    ids[:, :PROMPT] = prompts.repeat_interleave(G, 0)
    lengths = torch.randint(LONGEST // 4, LONGEST + 1, (N,), generator=gen)
    pos = torch.arange(L)
    real = pos[None] < (PROMPT + lengths)[:, None]
    ids = ids.masked_fill(~real, 0)
    action = real[:, 1:] & (pos[None, 1:] >= PROMPT)
    return (ids, action, torch.rand(N, generator=gen)), int(real.sum()), L


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(1)
    repeats = 1 if quick else int(os.environ.get("BENCH_REPLAY_ROUNDS", "9"))
    experiences, tokens, width = _experience()
    calls, samples, flips = {}, {}, {}
    for variant, (mode, share) in VARIANTS.items():
        agent = _agent(mode, share)
        seen: list[float] = []

        def call(agent: GRPO = agent, seen: list[float] = seen) -> None:
            metrics = agent.learn(experiences)
            if "route_flips" in metrics:
                seen.append(metrics["route_flips"])

        call()  # warm-up
        calls[variant], samples[variant], flips[variant] = call, [], seen
    load = [round(os.getloadavg()[0], 2)]
    names = list(VARIANTS)
    for r in range(repeats):
        for variant in names[r % 3 :] + names[: r % 3]:
            samples[variant].append(measure(calls[variant], repeats=1, warmup=0).samples[0])
    load.append(round(os.getloadavg()[0], 2))
    label = f"Qwen3-MoE h128 4x8 experts k=2: B={B} G={G} prompt {PROMPT}, completions <= {LONGEST}"
    layers, k = MODEL["num_hidden_layers"], 2
    rows = []
    for variant in VARIANTS:
        extra: dict[str, Any] = {
            "tokens": tokens,
            "tokens_per_s": round(tokens / Timing(samples[variant]).median),
            "load_avg_1min": load,
        }
        if variant != "afresh":
            extra["round_ratios"] = [
                round(a / b, 3) for a, b in zip(samples[variant], samples["afresh"], strict=True)
            ]
        if variant == "R2":  # the mechanism's own cost: the same forwards, unshared
            ratios = [a / b for a, b in zip(samples["R2"], samples["afresh unshared"], strict=True)]
            extra["median_round_ratio_to_afresh_unshared"] = round(statistics.median(ratios), 3)
            extra["route_flips"] = round(sum(flips["R2"]) / max(len(flips["R2"]), 1), 4)
            extra["routes_KiB"] = round(B * G * width * layers * k * 2 / 1024, 1)
        rows.append(Row("router_replay", label, variant, Timing(samples[variant]), extra=extra))
    return with_ratios(rows, baseline="afresh")
