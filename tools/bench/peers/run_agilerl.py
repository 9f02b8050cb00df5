"""AgileRL: its ``GRPO`` agent's ``get_action`` -> reward -> ``learn``, as its LLM loop calls them.

Run with the AgileRL venv's Python (never imported in our workspace); prints ``RESULT {json}``
last. On CPU, ``agilerl.algorithms.core.base.HAS_LIGER_KERNEL`` is set to False before the agent
is built (the Liger kernels need Triton/CUDA). ``gc.collect`` (called at the start of every
``learn``) is stubbed to a no-op unless ``--keep-gc-collect``: the issue compares against
AgileRL "with gc.collect stubbed".

Settings beyond the workload's that differ from AgileRL's defaults: ``adv_norm="mean_std"``
(GRPO's; AgileRL defaults to Dr. GRPO's ``mean_only``), ``use_liger_loss=False`` (CPU),
``max_grad_norm=1.0``, ``top_k=0``/``top_p=1.0`` (plain sampling, as every implementation here).
Everything else (its off-policy masks, KL clamp, per-prompt ``generate`` calls) is as shipped.
"""

from __future__ import annotations

import copy
import sys
import time
import warnings
from pathlib import Path

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
    Timer,
    emit,
    load_model,
    prompt_dicts,
    resolve,
    rewards_for,
    runner_args,
    setup_threads,
    stub_gc_collect,
    versions,
)


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--keep-gc-collect"]
    keep_gc = "--keep-gc-collect" in sys.argv[1:]
    args = runner_args(argv)
    shape, warmup, steps = resolve(args)
    setup_threads()
    torch.manual_seed(SEED)
    warnings.filterwarnings("ignore")
    import agilerl.algorithms.core.base as agilerl_base
    from peft import LoraConfig

    agilerl_base.HAS_LIGER_KERNEL = False
    from agilerl.algorithms import GRPO

    if not keep_gc:
        stub_gc_collect()
    model = load_model(args.workdir)
    lora = LoraConfig(
        r=LORA_R,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    agent = GRPO(
        pad_token_id=PAD_ID,
        pad_token=PAD,
        actor_network=model,
        lora_config=lora,
        group_size=shape.group,
        batch_size=shape.rows,
        beta=BETA,
        clip_coef=CLIP,
        lr=LR,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_output_tokens=shape.new_tokens,
        min_output_tokens=shape.new_tokens,
        max_grad_norm=MAX_GRAD_NORM,
        update_epochs=1,
        gradient_checkpointing=args.gc == "on",
        use_liger_loss=False,
        adv_norm="mean_std",
        seed=SEED,
        device="cpu",
    )
    prompts = prompt_dicts(shape)
    timer = Timer()
    for step in range(warmup + steps):
        obs = copy.deepcopy(prompts)  # get_action may mutate its prompt dicts
        t0 = time.perf_counter()
        completion_ids, action_masks = agent.get_action(obs)[:2]
        t1 = time.perf_counter()
        rewards = rewards_for(completion_ids, shape.prompt_len, shape)
        t2 = time.perf_counter()
        agent.learn((completion_ids, action_masks, rewards))
        t3 = time.perf_counter()
        lengths = {int(m.sum(dim=1).max()) for m in action_masks}
        assert lengths == {shape.new_tokens}, f"completion lengths {lengths}"
        if step >= warmup:
            timer.add("generate", t1 - t0)
            timer.add("reward", t2 - t1)
            timer.add("learn", t3 - t2)
            timer.add("step", t3 - t0)
    emit(
        {
            "impl": "agilerl",
            "gc_collect_stubbed": not keep_gc,
            "samples": timer.samples,
            "versions": versions("agilerl", "accelerate", "liger-kernel"),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
