"""The peer benchmark's workload, shared by every runner (ours, TRL, AgileRL, bare generate).

This file is imported by runner scripts executed with *different* Python interpreters (our
workspace environment and the throwaway peer venvs), so it depends on torch, transformers and
tokenizers only, never on peft, trl, agilerl or our packages.

``python common.py build --shape small --out DIR`` writes the random-init Qwen2 (``DIR/model``)
and the word-level tokenizer (``DIR/tokenizer``, a directory without a model config: with one,
transformers 5's ``AutoTokenizer`` maps the directory to Qwen2's BPE tokenizer class) that every
runner then loads, so that all of them start from the same weights.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

SEED = 0
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_R, LORA_ALPHA = 8, 16
BETA, CLIP, LR, TEMPERATURE, MAX_GRAD_NORM = 0.04, 0.2, 1e-5, 1.0, 1.0


@dataclass(frozen=True)
class Shape:
    """One workload size: the model and the rollout batch."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    warmup: int
    steps: int

    @property
    def rows(self) -> int:
        """Completions per step (prompts x group)."""
        return self.prompts * self.group


SHAPES = {
    "small": Shape("small", 64, 2, 2, 2, 128, 1000, 4, 4, 16, 32, warmup=2, steps=8),
    "large": Shape("large", 512, 6, 8, 2, 1280, 8192, 8, 8, 16, 128, warmup=2, steps=4),
}


def setup_threads() -> None:
    """One intra-op thread (the workload is defined on one thread)."""
    torch.set_num_threads(1)


def word(i: int) -> str:
    """The vocabulary's ``i``-th token (ids 0-3 are the special tokens)."""
    return f"w{i}"


def build(shape: Shape, out: Path) -> dict[str, Any]:
    """Write ``out/model`` (random Qwen2, seed 0) and ``out/tokenizer`` (word level)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {PAD: PAD_ID, BOS: BOS_ID, EOS: EOS_ID, UNK: 3}
    vocab.update({word(i): i for i in range(4, shape.vocab)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    fast.save_pretrained(out / "tokenizer")
    config = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        use_cache=True,
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config).float().eval()
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.save_pretrained(out / "model")
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "dir": str(out)}


def load_model(workdir: Path) -> Any:
    """The saved model, fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32)
    return model.eval()


def load_tokenizer(workdir: Path) -> Any:
    """The saved word-level tokenizer (``PreTrainedTokenizerFast``, not ``AutoTokenizer``)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(workdir / "tokenizer")


def prompt_ids(shape: Shape) -> torch.Tensor:
    """``[prompts, prompt_len]`` token ids: seeded random words, no special token."""
    gen = torch.Generator().manual_seed(SEED)
    return torch.randint(4, shape.vocab, (shape.prompts, shape.prompt_len), generator=gen)


def prompt_texts(shape: Shape) -> list[str]:
    """The same prompts as whitespace-separated words (TRL tokenizes text itself)."""
    return [" ".join(word(int(i)) for i in row) for row in prompt_ids(shape)]


def prompt_dicts(shape: Shape) -> list[dict[str, torch.Tensor]]:
    """The same prompts as AgileRL-style dicts (``input_ids`` / ``attention_mask`` [1, P])."""
    ids = prompt_ids(shape)
    return [
        {
            "input_ids": row[None].clone(),
            "attention_mask": torch.ones(1, row.numel(), dtype=torch.long),
        }
        for row in ids
    ]


def reward_of_ids(completion: torch.Tensor) -> float:
    """The dummy reward: the share of even token ids among the completion's tokens."""
    if completion.numel() == 0:
        return 0.0
    return float((completion % 2 == 0).float().mean())


def rewards_for(completion_ids: list[torch.Tensor], prompt_len: int, shape: Shape) -> torch.Tensor:
    """``[prompts, group]`` rewards of per-prompt ``[G, P + T]`` blocks (pad ids excluded)."""
    out = torch.zeros(shape.prompts, shape.group)
    for b, block in enumerate(completion_ids):
        for g in range(block.shape[0]):
            comp = block[g, prompt_len:]
            out[b, g] = reward_of_ids(comp[comp != PAD_ID])
    return out


def sampling_kwargs(shape: Shape) -> dict[str, Any]:
    """Plain sampling at temperature 1 (no top-k / top-p), exactly ``new_tokens`` tokens."""
    return {
        "do_sample": True,
        "temperature": TEMPERATURE,
        "top_k": 0,
        "top_p": 1.0,
        "min_new_tokens": shape.new_tokens,
        "max_new_tokens": shape.new_tokens,
    }


class Timer:
    """Named wall-clock samples, in seconds."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        """Append one sample of ``name``."""
        self.samples.setdefault(name, []).append(seconds)

    def time(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``, record its wall time under ``name``, return its result."""
        start = time.perf_counter()
        out = fn()
        self.add(name, time.perf_counter() - start)
        return out


def stub_gc_collect() -> None:
    """Replace ``gc.collect`` by a no-op (AgileRL calls it at the start of every ``learn``)."""
    gc.collect = lambda generation=2: 0  # type: ignore[assignment]


def versions(*names: str) -> dict[str, str]:
    """Installed versions of ``names`` (and torch, transformers, Python)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "tokenizers", *names):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def emit(payload: dict[str, Any]) -> None:
    """Print the runner's result as the last line of stdout (the orchestrator parses it)."""
    payload.setdefault("threads", torch.get_num_threads())
    sys.stdout.flush()
    print("RESULT " + json.dumps(payload), flush=True)


def runner_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments every runner takes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--gc", choices=["on", "off"], default="off", help="gradient checkpointing")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    return parser.parse_args(argv)


def resolve(args: argparse.Namespace) -> tuple[Shape, int, int]:
    """The shape and the warm-up / timed step counts (the shape's unless overridden)."""
    shape = SHAPES[args.shape]
    warmup = shape.warmup if args.warmup is None else args.warmup
    steps = shape.steps if args.steps is None else args.steps
    return shape, warmup, steps


def summary(samples: list[float]) -> dict[str, float]:
    """Median, min and max of ``samples`` (seconds)."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
    }


def shape_dict(shape: Shape) -> dict[str, Any]:
    """JSON form of ``shape``."""
    return asdict(shape)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build the workload's model and tokenizer")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--shape", choices=sorted(SHAPES), required=True)
    b.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = build(SHAPES[args.shape], args.out)
    emit(info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
