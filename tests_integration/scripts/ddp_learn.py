"""Run by ``torch.distributed.run`` (2 CPU processes, gloo): a few GRPO ``learn()`` steps.

Each rank takes its share of the prompts of a fixed global batch; after every step it writes
its actor weights to ``OUT/rank<r>_step<k>.safetensors``. Usage: ``ddp_learn.py OUT [FAIL_RANK]``
(with FAIL_RANK, that rank raises at step 1, while the other waits in a collective). The
environment variable ``DDP_RUNS`` (JSON, ``{name: agent arguments}``) runs one agent per entry,
one after the other in the same two processes (a process start, importing torch, transformers
and peft, is most of a launch's time on a small CPU), each writing to ``OUT/name``; without it,
one run of the default agent writes to ``OUT``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_common import STEPS, global_batches, make_agent, one_after_another


def main() -> None:
    out = Path(sys.argv[1])
    fail_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    runs = json.loads(os.environ.get("DDP_RUNS", '{"": {}}'))
    one_after_another(runs.items(), lambda run: learn(out / run[0], run[1], fail_rank))


def learn(out: Path, options: dict[str, Any], fail_rank: int) -> Accelerator:
    """``STEPS`` steps of the agent with ``options``; returns the run's ``Accelerator``."""
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2, f"expected 2 processes, got {world} (not really distributed)"
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    agent = make_agent(accelerator=accelerator, **options)
    for step, (ids, masks, rewards, prompts_per_rank) in enumerate(global_batches()):
        rows = slice(rank * prompts_per_rank, (rank + 1) * prompts_per_rank)
        if rank == fail_rank and step == 1:
            raise RuntimeError(f"injected failure on rank {rank}")
        metrics = agent.learn((ids[rows], masks[rows], rewards[rows]))
        weights = {n: p.detach().contiguous() for n, p in agent.policy.named_parameters() if p.requires_grad}  # fmt: skip
        weights["loss"] = torch.tensor([metrics["loss"]])
        save_file(weights, str(out / f"rank{rank}_step{step}.safetensors"))
    assert step == STEPS - 1
    accelerator.wait_for_everyone()
    return accelerator


if __name__ == "__main__":
    main()
