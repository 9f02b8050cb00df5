"""TRL: ``GRPOTrainer.train()`` on the workload, timed from inside its own loop.

Run with the TRL venv's Python (never imported in our workspace); prints ``RESULT {json}`` last.

What is timed (per optimizer step; ``gradient_accumulation_steps=1``, one generation per step):

* ``step``: ``on_step_begin`` -> ``on_step_end`` callbacks (generation, reward, reference
  forward, loss, backward, clipping, optimizer and scheduler step, ``zero_grad``).
* ``generate``: the trainer's ``_generate_single_turn`` (padding of the prompt ids,
  ``unwrap_model_for_generation`` + ``model.generate`` through the LoRA layers, EOS masking).
  ``generate_with_text`` is ``_generate`` around it (prompt tokenization, completion decoding,
  length metrics).
* ``reference``: the calls of ``_get_per_token_logps_and_entropies`` under ``no_grad`` (adapter
  disabled: TRL's reference for a PEFT model; with one iteration per generation TRL computes no
  separate old log-probs).
* ``reward``: ``_calculate_rewards``.
* ``train_part``: from the end of ``_prepare_inputs`` (generation + scoring) to ``on_step_end``:
  ``compute_loss``, backward, gradient clipping, ``optimizer.step``, scheduler, ``zero_grad``.
* ``learn`` = ``train_part`` + ``reference`` (the issue's "training part + reference forward").
"""

from __future__ import annotations

import os
import sys
import tempfile
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
    SEED,
    TEMPERATURE,
    Timer,
    emit,
    load_model,
    load_tokenizer,
    prompt_texts,
    resolve,
    reward_of_ids,
    runner_args,
    setup_threads,
    versions,
)


def dummy_reward(
    completions: list[Any], completion_ids: list[list[int]], **kwargs: Any
) -> list[float]:
    """The workload's reward (share of even ids) from TRL's ``completion_ids`` keyword."""
    del completions, kwargs
    return [reward_of_ids(torch.tensor(ids, dtype=torch.long)) for ids in completion_ids]


def main() -> int:
    args = runner_args()
    shape, warmup, steps = resolve(args)
    setup_threads()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(SEED)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = load_model(args.workdir)
    tokenizer = load_tokenizer(args.workdir)
    texts = prompt_texts(shape)
    lengths = {len(tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts}
    assert lengths == {shape.prompt_len}, f"prompt lengths {lengths}"
    total = warmup + steps
    dataset = Dataset.from_dict({"prompt": texts * total})
    out_dir = tempfile.mkdtemp(prefix="trl-bench-")
    config = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=shape.rows,
        gradient_accumulation_steps=1,
        num_generations=shape.group,
        max_completion_length=shape.new_tokens,
        generation_kwargs={"min_new_tokens": shape.new_tokens},
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        beta=BETA,
        epsilon=CLIP,
        loss_type="grpo",
        scale_rewards="group",
        num_iterations=1,
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_grad_norm=MAX_GRAD_NORM,
        gradient_checkpointing=args.gc == "on",
        max_steps=total,
        logging_steps=total + 1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=SEED,
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=False,
    )
    lora = LoraConfig(
        r=LORA_R,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    timer = Timer()
    current: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            current.clear()
            current["begin"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            end = time.perf_counter()
            if state.global_step <= warmup:
                return
            timer.add("step", end - current["begin"])
            train = end - current["prepared"]
            timer.add("train_part", train)
            timer.add("reference", current.get("reference", 0.0))
            timer.add("learn", train + current.get("reference", 0.0))
            timer.add("generate", current["generate"])
            timer.add("generate_with_text", current["generate_with_text"])
            timer.add("reward", current["reward"])

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=dummy_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[StepTimer()],
    )

    def timed(name: str, fn: Any, *, only_no_grad: bool = False, accumulate: bool = False) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            if only_no_grad and torch.is_grad_enabled():
                return fn(*a, **k)
            start = time.perf_counter()
            out = fn(*a, **k)
            seconds = time.perf_counter() - start
            current[name] = current.get(name, 0.0) + seconds if accumulate else seconds
            return out

        return wrapper

    trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
    trainer._generate = timed("generate_with_text", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed(
        "reference", trainer._get_per_token_logps_and_entropies, only_no_grad=True, accumulate=True
    )
    prepare = trainer._prepare_inputs

    def prepare_inputs(*a: Any, **k: Any) -> Any:
        out = prepare(*a, **k)
        current["prepared"] = time.perf_counter()
        return out

    trainer._prepare_inputs = prepare_inputs
    trainer.train()
    lens = trainer._metrics["train"]["completions/mean_length"]
    assert all(abs(v - shape.new_tokens) < 1e-6 for v in lens), f"completion lengths {lens}"
    assert len(timer.samples.get("step", [])) == steps, timer.samples
    emit(
        {
            "impl": "trl",
            "samples": timer.samples,
            "versions": versions("trl", "accelerate", "datasets"),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
