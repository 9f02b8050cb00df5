"""The embedded tiny model, its character tokenizer and the demo reward (nothing downloaded).

The tokenizer is a character-level vocabulary built here, the model a random-weight Qwen2 of
about 80k parameters. ``model.name: tiny`` configs, ``rl-train demo`` and the tests use them;
:data:`TINY_AGENT` holds the agent settings that make this model learn.
"""

from __future__ import annotations

import string
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

__all__ = ["ALPHABET", "TINY_AGENT", "demo_reward", "tiny_model", "tiny_tokenizer"]

#: The characters of :func:`tiny_tokenizer` (after the four special tokens).
ALPHABET = string.digits + string.ascii_lowercase + " +-*/=?.,:()!'\n"

#: Agent settings that make the embedded tiny model learn (``rl-train demo`` and ``tiny`` configs).
TINY_AGENT: dict[str, Any] = {
    "lr": 1e-3,
    "beta": 0.0,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "max_grad_norm": 1.0,
    "max_output_tokens": 2,
    "max_model_len": 64,
}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer.

    Returns:
        ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then one id per character of
        :data:`ALPHABET`.
    """
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {t: i for i, t in enumerate([*specials, *ALPHABET])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def tiny_model(vocab_size: int, seed: int = 0) -> Qwen2ForCausalLM:
    """A random-weight Qwen2 (hidden 64, 2 layers, ~80k parameters), seeded, float32.

    Args:
        vocab_size: Rows of the embedding (``len(tiny_tokenizer())``).
        seed: Seed of the initialisation (the global RNG is left untouched).

    Returns:
        The model in eval mode, with pad 0 / bos 1 / eos 2.
    """
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):  # restores the CPU generator: seed only that one
        torch.default_generator.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.eval()
    return model


def demo_reward(completion: str, answer: str, question: str) -> float:
    """The demo's reward.

    Args:
        completion: The generated text.
        answer: The reference answer.
        question: Unused.

    Returns:
        1 for the exact answer; 0.5 when the answer is right but followed by more text; else 0.
    """
    del question
    text = completion.strip()
    if text == answer:
        return 1.0
    return 0.5 if text.startswith(answer) else 0.0
