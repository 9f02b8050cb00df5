"""Ours: ``rl_algos.GRPO`` through its public API, as ``rl_train``'s reasoning loop calls it.

Each step: ``agent.get_action(prompts)`` -> reward -> ``agent.learn((completion_ids,
action_masks, rewards), sampling_logps=...)``. Run with the workspace's Python; prints
``RESULT {json}`` last. With ``--mfu`` it also measures the 1-thread ``torch.mm`` peak (after the
timed steps, in this process) for the MFU figure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import (
    BETA,
    CLIP,
    LORA_ALPHA,
    LORA_R,
    LORA_TARGETS,
    LR,
    MAX_GRAD_NORM,
    PAD,
    PAD_ID,
    SEED,
    TEMPERATURE,
    Shape,
    Timer,
    emit,
    load_model,
    prompt_dicts,
    resolve,
    rewards_for,
    runner_args,
    setup_threads,
    versions,
)


def matmul_peak(m: int, k: int, n: int, repeats: int = 10) -> float:
    """Best FLOP/s of ``torch.mm(a [m, k], b [k, n], out=c)`` into a preallocated ``c``."""
    gen = torch.Generator().manual_seed(SEED)
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(k, n, generator=gen)
    c = torch.empty(m, n)
    torch.mm(a, b, out=c)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - start)
    return 2.0 * m * k * n / best


def make_agent(model: Any, shape: Shape, gradient_checkpointing: bool = False) -> Any:
    """Ours on the benchmark's workload: ``rl_algos.GRPO`` with LoRA over ``model``."""
    from peft import LoraConfig
    from rl_algos import GRPO

    lora = LoraConfig(
        r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=LORA_TARGETS
    )
    return GRPO(
        pad_token_id=PAD_ID, pad_token=PAD, actor_network=model, lora_config=lora,
        group_size=shape.group, batch_size=shape.rows, beta=BETA, clip_coef=CLIP, lr=LR,
        temperature=TEMPERATURE, top_k=0, top_p=1.0, max_output_tokens=shape.new_tokens,
        min_output_tokens=shape.new_tokens, max_grad_norm=MAX_GRAD_NORM, update_epochs=1,
        gradient_checkpointing=gradient_checkpointing, seed=SEED, device="cpu",
    )  # fmt: skip


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--mfu"]
    mfu = "--mfu" in sys.argv[1:]
    args = runner_args(argv)
    shape, warmup, steps = resolve(args)
    setup_threads()
    torch.manual_seed(SEED)
    model = load_model(args.workdir)
    agent = make_agent(model, shape, gradient_checkpointing=args.gc == "on")
    prompts = prompt_dicts(shape)
    timer = Timer()
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        result = agent.get_action(prompts)
        t1 = time.perf_counter()
        rewards = rewards_for(result.completion_ids, shape.prompt_len, shape)
        t2 = time.perf_counter()
        agent.learn(
            (result.completion_ids, result.action_masks, rewards),
            sampling_logps=result.sampling_logprobs,
        )
        t3 = time.perf_counter()
        lengths = {int(m.sum(dim=1).max()) for m in result.action_masks}
        assert lengths == {shape.new_tokens}, f"completion lengths {lengths}"
        if step >= warmup:
            timer.add("generate", t1 - t0)
            timer.add("reward", t2 - t1)
            timer.add("learn", t3 - t2)
            timer.add("step", t3 - t0)
    payload = {"impl": "ours", "samples": timer.samples, "versions": versions("rl-algos")}
    if mfu:
        payload["trainable_params"] = sum(p.numel() for p in agent.actor_parameters())
        tokens = shape.rows * (shape.prompt_len + shape.new_tokens)
        h, i = shape.hidden, shape.intermediate
        payload["matmul_peak_flops"] = {
            f"{tokens}x{h}x{h}": matmul_peak(tokens, h, h),
            f"{tokens}x{h}x{i}": matmul_peak(tokens, h, i),
            f"{tokens}x{i}x{h}": matmul_peak(tokens, i, h),
        }
    emit(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
