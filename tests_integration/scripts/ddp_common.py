"""The agent and the fixed batches shared by the distributed script and its single-process twin."""

from __future__ import annotations

from typing import Any

import torch
from peft import LoraConfig
from rl_algos import GRPO
from rl_testing.models import tiny_causal_lm

GROUP = 3
PROMPTS = 4  # global; each of the 2 ranks gets 2
STEPS = 3
L = 14
#: The DeepSpeed runs' extra agent arguments: 2 micro-batches per rank's minibatch (6 rows).
DS_AGENT = {"micro_batch_size_per_gpu": 4, "max_output_tokens": 6}
#: Padding-free training (issue 20): packed rows in micro-batches of at most 20 tokens, so the
#: ranks' rows (lengths 6..14) need different numbers of micro-batches.
PACKED_AGENT = {"use_sequence_packing": True, "micro_batch_tokens": 20}


def make_agent(**kw: Any) -> GRPO:
    model, tok = tiny_causal_lm("qwen2", seed=0)
    return GRPO(
        actor_network=model, pad_token_id=tok.pad_token_id, pad_token=tok.pad_token,
        group_size=GROUP, batch_size=64, lr=1e-2, beta=0.05, max_grad_norm=1.0, seed=3,
        **{"lora_config": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0), **kw},
    )  # fmt: skip


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """``STEPS`` batches of ``PROMPTS * GROUP`` rows: ids [N, L], masks [N, L-1], rewards [N]."""
    g = torch.Generator().manual_seed(0)
    out = []
    N = PROMPTS * GROUP
    for _ in range(STEPS):
        ids = torch.randint(8, 40, (N, L), generator=g)
        lengths = torch.randint(6, L + 1, (N,), generator=g)
        ids[torch.arange(L)[None] >= lengths[:, None]] = 0
        masks = torch.zeros(N, L - 1, dtype=torch.bool)
        for n in range(N):
            masks[n, 3 : int(lengths[n]) - 1] = True
        rewards = torch.randn(N, generator=g)
        out.append((ids, masks, rewards, N // 2))
    return out
