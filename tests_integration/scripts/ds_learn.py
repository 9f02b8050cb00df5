"""Run by ``torch.distributed.run`` (2 CPU processes, gloo): GRPO ``learn()`` under DeepSpeed.

Usage: ``ds_learn.py OUT STAGE MODE[,MODE...]``, each mode one of ``lora`` (the default agent:
LoRA), ``nan``, ``full``, ``packed``, ``checkpointed``, ``moe``. The modes run one after the
other in the same two processes (one launch: each process start imports DeepSpeed, peft and
transformers, most of a launch's time on a small CPU), each with an ``Accelerator`` of its own
with a DeepSpeed ZeRO-``STAGE`` plugin (the way users configure it) and its results in
``OUT/MODE``. Each rank takes its share of the prompts of fixed global batches; after every step
it writes its trainable weights (gathered under ZeRO-3) and its loss to
``OUT/MODE/rank<r>_step<k>.safetensors``; at the end the agent saves a checkpoint to
``OUT/MODE/ckpt`` and rank 0 writes the checkpointed model's logits on a probe batch. With
``nan``, rank 1's hidden states turn NaN at step 1: the step must be refused on both ranks. With
``full``, full fine-tuning (ZeRO-3 then partitions the trainable lm_head too). With ``packed``,
padding-free training in token-budget micro-batches (:data:`ddp_common.PACKED_AGENT`). With
``checkpointed``, gradient checkpointing. With ``moe``, the tiny Qwen3-MoE with its
load-balancing loss, checkpointed, replaying its routes in a second epoch
(:data:`ddp_common.MOE_AGENT`; each step's ``route_flips`` is written too); where the installed
DeepSpeed cannot run it, the agent's refusal goes to ``OUT/moe/refused.txt`` instead.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_common import (
    DS_AGENT,
    MOE_AGENT,
    PACKED_AGENT,
    STEPS,
    global_batches,
    make_agent,
    one_after_another,
)
from ds_cpu import skip_shm_comm_op
from rl_algos.distributed import gathered

#: What each mode changes in the agent (:func:`ddp_common.make_agent`'s keywords).
MODES: dict[str, dict[str, Any]] = {
    "lora": {},
    "nan": {"skip_nonfinite": True},
    "full": {"full_finetune": True, "lora_config": None},
    "packed": dict(PACKED_AGENT),  # padding-free, token-budget micro-batches (issue 20)
    "checkpointed": {"gradient_checkpointing": True},  # issue 37
    "moe": dict(MOE_AGENT),  # a mixture of experts with its load-balancing loss, checkpointed
}


def main() -> None:
    skip_shm_comm_op()  # an inference-only op DeepSpeed would JIT-build (ds_cpu.py)
    out, stage, modes = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"ds_learn.py: unknown modes {unknown}; known: {list(MODES)}")
    one_after_another(modes, lambda mode: learn(out / mode, stage, mode))


def learn(out: Path, stage: int, mode: str) -> Accelerator:
    """One mode: 3 steps, the checkpoint, the probe logits, a generation; returns the
    mode's ``Accelerator``."""
    inject_nan = mode == "nan"
    config = {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    accelerator = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config),
        # without an explicit backend accelerate sees one CPU process (platform-notes.md)
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
    )
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2, f"expected 2 processes, got {world} (not really distributed)"
    try:
        agent = make_agent(accelerator=accelerator, **DS_AGENT, **MODES[mode])
    except ValueError as exc:  # refused with this DeepSpeed (rl_algos.refusals): say so
        if mode != "moe" or "needs deepspeed>=" not in str(exc):
            raise
        if accelerator.is_main_process:
            (out / "refused.txt").write_text(str(exc))
        accelerator.wait_for_everyone()
        return accelerator
    assert agent.learner.zero_stage == stage, "DeepSpeed was not enabled"
    for step, (ids, masks, rewards, prompts_per_rank) in enumerate(global_batches()):
        rows = slice(rank * prompts_per_rank, (rank + 1) * prompts_per_rank)
        hook = None
        if inject_nan and step == 1 and rank == 1:
            # NaN from the forward after the scoring passes and the first micro-batch: the
            # reference (and, unless the update is on-policy, old) log-probs and the first
            # micro-batch are finite (its gradient is accumulated), the second is NaN
            batch = agent.parse((ids[rows], masks[rows], rewards[rows]))
            scores_old = agent.parts(batch).needs_old_logprobs or not agent.on_policy(batch)
            hook = (
                agent.policy.causal_lm.get_decoder()
                .layers[0]
                .register_forward_hook(poison_after(3 if scores_old else 2))
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metrics = agent.learn((ids[rows], masks[rows], rewards[rows]))
        if hook is not None:
            hook.remove()
        skipped = any("step skipped" in str(w.message) for w in caught)
        params = [p for p in agent.policy.parameters() if p.requires_grad]
        with gathered(params, enabled=stage == 3):
            weights = {n: p.detach().clone().contiguous() for n, p in agent.policy.named_parameters() if p.requires_grad}  # fmt: skip
        weights["loss"] = torch.tensor([metrics.get("loss", float("nan"))])
        weights["skipped"] = torch.tensor([float(skipped)])
        weights["grad_norm"] = torch.tensor([metrics.get("grad_norm", float("nan"))])
        if "route_flips" in metrics:
            weights["route_flips"] = torch.tensor([metrics["route_flips"]])
        save_file(weights, str(out / f"rank{rank}_step{step}.safetensors"))
    assert step == STEPS - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optimizer state is not saved under DeepSpeed
        agent.save_checkpoint(out / "ckpt")
    ids, _, _, _ = global_batches()[0]
    with torch.no_grad():  # every rank runs the forward (ZeRO-3 gathers layer by layer)
        logits = agent.policy.causal_lm(input_ids=ids[:4]).logits
    if rank == 0:
        save_file({"logits": logits.contiguous()}, str(out / "logits.safetensors"))
    # generation works under ZeRO (synced across ranks under ZeRO-3)
    result = agent.get_action([{"input_ids": ids[rank : rank + 1, :5]}], training=False)
    assert result.completion_ids[0].shape[0] == 1
    accelerator.wait_for_everyone()
    return accelerator


def poison_after(calls: int):
    """A forward hook that passes ``calls`` forwards through, then turns outputs NaN."""
    seen = [0]

    def hook(module, args, output):
        seen[0] += 1
        if seen[0] <= calls:
            return output
        if isinstance(output, tuple):
            return (output[0] * float("nan"), *output[1:])
        return output * float("nan")

    return hook


if __name__ == "__main__":
    main()
