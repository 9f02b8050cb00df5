"""Long context under a memory cap: padded rows run out of memory, a token budget trains.

Run as a fresh process (``python packing_memory_cap.py``); prints one JSON line. Issue 20's
long-context case: a GRPO batch of ``N = 8`` completions, one of them ``LONG`` tokens and the
others short, right-padded to ``L = PROMPT + LONG``.

* ``padded``: ``use_sequence_packing=False`` (the opt-out; packing is the default), a fixed
  micro-batch of 8 rows: one forward over ``8 * L`` tokens, padding included.
* ``budget``: ``use_sequence_packing=True, micro_batch_tokens=L``: the long row alone in one
  micro-batch, the short rows packed in another; the same update (the unit tests check the
  equality), a fraction of the activations.

Both agents first take one step on a short batch (the one-time costs: lazy imports, optimizer
state). Then the budget agent's step on the long batch runs uncapped, its peak resident memory
above the memory before it measured (Linux: ``/proc/self/clear_refs`` resets the peak). Then
the process caps its data segment (``RLIMIT_DATA``: heap and private anonymous mappings, which
is where torch's CPU allocations live; the mapped libraries do not count) at its current size
plus ``CAP_FACTOR`` times that peak: the budget step runs again under the cap, and the padded
step must fail to allocate. Finally the cap is lifted and the padded step's own peak measured.
"""

from __future__ import annotations

import json
import resource
from typing import Any

import torch
from peft import LoraConfig
from rl_algos import GRPO
from rl_testing.models import tiny_qwen2

B, G, PROMPT, LONG, SHORT, VOCAB = 2, 4, 8, 1024, 24, 512
N, L = B * G, PROMPT + LONG
CAP_FACTOR = 3


def _agent(**options: Any) -> GRPO:
    model = tiny_qwen2(
        VOCAB, seed=0, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, attn_implementation="sdpa",
    )  # fmt: skip
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
    return GRPO(
        pad_token_id=0, pad_token="<pad>", actor_network=model, lora_config=lora, group_size=G,
        beta=0.04, batch_size=N, lr=1e-3, seed=0, **options,
    )  # fmt: skip


def _batch(long: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [N, PROMPT + long], action mask, rewards: row 0 ``long`` tokens of completion."""
    gen = torch.Generator().manual_seed(0)
    width = PROMPT + long
    ids = torch.randint(3, VOCAB, (N, width), generator=gen)
    lengths = torch.full((N,), PROMPT + min(SHORT, long))
    lengths[0] = width
    pos = torch.arange(width)
    real = pos[None] < lengths[:, None]
    ids = ids.masked_fill(~real, 0)
    action = real[:, 1:] & (pos[None, 1:] >= PROMPT)
    return ids, action, torch.rand(N, generator=gen)


def _kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _peak_extra_mib(agent: GRPO, batch: Any) -> float:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak resident set size
    before = _kib("VmRSS")
    agent.learn(batch)
    return (_kib("VmHWM") - before) / 1024


def main() -> None:
    torch.set_num_threads(1)
    padded = _agent(use_sequence_packing=False, micro_batch_size_per_gpu=N)  # the opt-out
    budget = _agent(use_sequence_packing=True, micro_batch_tokens=L)
    for agent in (padded, budget):
        agent.learn(_batch(SHORT))
    batch = _batch(LONG)
    out: dict[str, Any] = {"rows": N, "width": L, "real_tokens": int((batch[0] != 0).sum())}
    out["budget_peak_extra_MiB"] = round(_peak_extra_mib(budget, batch), 1)
    cap_mib = CAP_FACTOR * max(out["budget_peak_extra_MiB"], 16.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    data = _kib("VmData") * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (data + int(cap_mib * 2**20), hard))
    out["cap_MiB_above_data"] = round(cap_mib, 1)
    try:
        out["budget_loss_capped"] = budget.learn(batch)["loss"]
        try:
            padded.learn(batch)
            out["padded_capped"] = "trained"
        except (MemoryError, RuntimeError) as error:
            out["padded_capped"] = f"{type(error).__name__}: {str(error)[:160]}"
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    out["padded_peak_extra_MiB"] = round(_peak_extra_mib(padded, batch), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
