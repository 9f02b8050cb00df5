"""Run by ``torch.distributed.run`` (2 CPU processes, gloo): ``finetune_llm_reasoning`` under DDP.

Usage: ``ddp_finetune.py OUT [STEPS [resume]]``. The demo's tiny model and task; the environment shards the
prompts by process; the loop checkpoints at steps 3 and 6 into ``OUT``. Each rank then writes
its final weights to ``OUT/rank<r>.safetensors``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from accelerate import Accelerator
from rl_envs import ReasoningGym
from rl_envs.tasks import train_test_split_task
from rl_train import finetune_llm_reasoning
from rl_train.tiny import TINY_AGENT, demo_reward, tiny_model, tiny_tokenizer
from safetensors.torch import save_file

STEPS = 6


def main() -> None:
    out = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else STEPS
    resume = len(sys.argv) > 3 and sys.argv[3] == "resume"
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, "not really distributed"
    tokenizer = tiny_tokenizer()
    train, test = train_test_split_task("successor_digit", 64, 8, seed=0)
    env = ReasoningGym(
        train, test, tokenizer, demo_reward, [{"role": "user", "content": "{question}"}],
        data_batch_size_per_gpu=2, seed=0, accelerator=accelerator,
    )  # fmt: skip
    from rl_algos import GRPO

    agent = GRPO(
        actor_network=tiny_model(len(tokenizer), seed=0), pad_token_id=tokenizer.pad_token_id,
        pad_token=tokenizer.pad_token, tokenizer=tokenizer, accelerator=accelerator,
        **{**TINY_AGENT, "group_size": 4, "batch_size": 8, "full_finetune": True},
    )  # fmt: skip
    finetune_llm_reasoning(
        [agent], env, max_steps=steps, evaluation_interval=3, checkpoint_steps=3,
        run_dir=out, verbose=False, tensorboard=False, resume=resume,
    )  # fmt: skip
    weights = {n: p.detach().contiguous() for n, p in agent.policy.named_parameters()}
    save_file(weights, str(out / f"rank{accelerator.process_index}.safetensors"))
    accelerator.end_training()  # the process group goes before exit (ds_learn.py says why)


if __name__ == "__main__":
    main()
