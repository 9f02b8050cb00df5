"""The embedded tiny model, its character tokenizer and the demo reward (nothing downloaded).

The tokenizer is a character-level vocabulary built here, the model a random-weight Qwen2 of
about 80k parameters. ``model.name: tiny`` configs, ``rl-train demo`` and the tests use them;
:data:`TINY_AGENT` holds the agent settings that make this model learn (full fine-tuning), and
:data:`TINY_LORA_NORM_WEIGHT` with :data:`TINY_LORA_AGENT` those of a LoRA adapter on it.
"""

from __future__ import annotations

import string
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

__all__ = [
    "ALPHABET",
    "TINY_AGENT",
    "TINY_LORA_AGENT",
    "TINY_LORA_NORM_WEIGHT",
    "demo_reward",
    "tiny_model",
    "tiny_tokenizer",
]

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

#: The final norm's weight of the LoRA demo's base (``tiny_model(..., norm_weight=)``).
#:
#: The random model's logits are ``E (w * h / rms(h))``: tied embedding rows ``E_v`` of norm
#: about ``0.02 sqrt(H)``, a normed hidden state of norm ``sqrt(H)`` times ``w``, so no logit
#: exceeds about ``0.02 H w`` (1.3 at ``H = 64``, ``w = 1``): whatever the hidden state, no
#: token gets more than about 7% probability. Full fine-tuning moves ``E`` and ``w``; a LoRA
#: adapter on the linear layers cannot, so its policy stays near uniform and GRPO sees almost no
#: reward. With ``w = 5`` the head can be confident, as a trained model's is, and the adapter
#: learns the demo task.
TINY_LORA_NORM_WEIGHT = 5.0

#: Agent settings of a LoRA adapter on the tiny model (rank 16, alpha 32, all linear layers:
#: ``ModelConfig``'s defaults) over the base ``tiny_model(..., norm_weight=TINY_LORA_NORM_WEIGHT)``.
TINY_LORA_AGENT: dict[str, Any] = {**TINY_AGENT, "lr": 2e-3}


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


def tiny_model(vocab_size: int, seed: int = 0, norm_weight: float = 1.0) -> Qwen2ForCausalLM:
    """A random-weight Qwen2 (hidden 64, 2 layers, ~80k parameters), seeded, float32.

    Args:
        vocab_size: Rows of the embedding (``len(tiny_tokenizer())``).
        seed: Seed of the initialisation (the global RNG is left untouched).
        norm_weight: Every entry of the final RMSNorm's weight (1: the initialisation's;
            :data:`TINY_LORA_NORM_WEIGHT` for LoRA training, which cannot move it). The other
            weights do not depend on it.

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
    if norm_weight != 1.0:
        with torch.no_grad():
            model.model.norm.weight.fill_(norm_weight)
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
