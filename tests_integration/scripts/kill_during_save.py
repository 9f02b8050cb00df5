"""Killed by the test with SIGKILL while a checkpoint is half written.

Usage: ``kill_during_save.py OUT agent|loop``. Trains the demo's tiny model a step, saves a
complete checkpoint (``agent``: ``agent.save_checkpoint(OUT/ckpt)``; ``loop``: the training
loop's ``checkpoints/step_1`` + ``latest.json``) and records its weights in
``OUT/first.safetensors``; trains another step and saves again into the same place, but the
model file of that save is left half written and the process prints ``WRITING`` and waits to be
killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import rl_adapters.checkpoint as ckpt
import torch
from rl_algos import GRPO
from rl_train.checkpoint import save_checkpoint as _save
from rl_train.tiny import TINY_AGENT, tiny_model, tiny_tokenizer
from safetensors.torch import save_file


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 20, (8, 10), generator=g)
    masks = torch.zeros(8, 9, dtype=torch.bool)
    masks[:, 4:] = True
    return ids, masks, torch.randn(8, generator=g)


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    tok = tiny_tokenizer()
    agent = GRPO(
        actor_network=tiny_model(len(tok), seed=0), pad_token_id=tok.pad_token_id,
        pad_token=tok.pad_token, tokenizer=tok, **{**TINY_AGENT, "group_size": 4, "full_finetune": True},
    )  # fmt: skip

    def save(step: int) -> None:
        if mode == "agent":
            agent.save_checkpoint(out / "ckpt")
        else:
            _save(out, step, [agent], None)

    agent.learn(batch(0))
    save(1)
    save_file({n: p.detach().clone() for n, p in agent.policy.named_parameters()}, str(out / "first.safetensors"))  # fmt: skip
    agent.learn(batch(1))

    real = ckpt.save_file

    def half_written(tensors, filename, metadata=None):
        real(tensors, filename, metadata)
        size = Path(filename).stat().st_size
        with open(filename, "r+b") as f:
            f.truncate(size // 2)
        print("WRITING", flush=True)
        time.sleep(120)

    ckpt.save_file = half_written
    save(2)
    raise SystemExit("not killed")


if __name__ == "__main__":
    main()
