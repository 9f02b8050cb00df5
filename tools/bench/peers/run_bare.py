"""Floor: bare batched ``model.generate`` on a copy of the base model (no LoRA), all rows at once.

Run with any Python that has torch and transformers; prints ``RESULT {json}`` last.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import (
    PAD_ID,
    SEED,
    Timer,
    emit,
    load_model,
    prompt_ids,
    resolve,
    runner_args,
    sampling_kwargs,
    setup_threads,
    versions,
)


def main() -> int:
    args = runner_args()
    shape, warmup, steps = resolve(args)
    setup_threads()
    torch.manual_seed(SEED)
    model = load_model(args.workdir)
    ids = prompt_ids(shape).repeat_interleave(shape.group, dim=0)  # [rows, P]
    attn = torch.ones_like(ids)
    kwargs = sampling_kwargs(shape)
    timer = Timer()
    for step in range(warmup + steps):
        out = timer.time(
            "generate",
            lambda: model.generate(
                input_ids=ids, attention_mask=attn, pad_token_id=PAD_ID, **kwargs
            ),
        )
        assert out.shape == (shape.rows, shape.prompt_len + shape.new_tokens), out.shape
        if step < warmup:
            timer.samples["generate"].pop()
    emit({"impl": "bare", "samples": timer.samples, "versions": versions()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
