"""Tiny random-weight causal LMs built from a config (nothing is downloaded); needs ``models``.

Defaults: ``hidden_size=64``, ``intermediate_size=128``, ``num_hidden_layers=2``,
``num_attention_heads=4``, ``num_key_value_heads=2``, ``max_position_embeddings=512``,
``tie_word_embeddings=True`` (about 80k parameters with the char tokenizer). Weights are a pure
function of ``seed``: building a model neither reads nor advances the caller's global torch RNG.
Models are returned in ``eval()`` mode, in float32, on the CPU.

:func:`save_tiny` writes the model to ``directory`` and the tokenizer to ``directory/tokenizer``:
in transformers 5, ``AutoTokenizer.from_pretrained`` on a directory whose ``config.json`` says
``qwen2`` silently swaps the pre-tokenizer (ids change), so the tokenizer is kept out of the model
directory and loaded with :func:`rl_testing.tokenizer.load_tokenizer`.
"""

from __future__ import annotations

from collections.abc import Callable
from os import PathLike
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from rl_testing.tokenizer import char_tokenizer, load_tokenizer, save_tokenizer

__all__ = [
    "TINY_DEFAULTS",
    "TINY_MOE_DEFAULTS",
    "TOKENIZER_SUBDIR",
    "load_tiny",
    "save_tiny",
    "tiny_causal_lm",
    "tiny_llama",
    "tiny_qwen2",
    "tiny_qwen3_moe",
]

TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
"""Config defaults shared by :func:`tiny_qwen2` and :func:`tiny_llama` (override per call)."""

TINY_MOE_DEFAULTS: dict[str, Any] = {
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
}
""":func:`tiny_qwen3_moe`'s settings beside :data:`TINY_DEFAULTS`: every layer sparse, 4 experts
of MLP width 32, 2 routed per token (Qwen3-30B-A3B's 128 / 8 scaled down)."""

TOKENIZER_SUBDIR = "tokenizer"
"""Subdirectory of a :func:`save_tiny` directory that holds the tokenizer."""

_M = TypeVar("_M", bound=PreTrainedModel)


def _build(
    model_cls: type[_M],
    config_cls: Callable[..., PretrainedConfig],
    vocab_size: int,
    seed: int,
    **kw: Any,
) -> _M:
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    config = config_cls(vocab_size=vocab_size, **{**TINY_DEFAULTS, **kw})
    # Initialise under a forked RNG: the weights depend only on `seed`, and the caller's global
    # CPU RNG state is restored afterwards (models are built on the CPU, so no CUDA RNG is used).
    ctor: Callable[[PretrainedConfig], _M] = model_cls  # `@auto_docstring` hides the signature
    with torch.random.fork_rng(devices=[]):  # restores the CPU generator: seed only that one
        torch.default_generator.manual_seed(seed)
        model = ctor(config)
    torch.nn.Module.float(model)  # even if the default dtype was changed; typed, unlike `.float`
    model.train(False)  # = eval(); transformers' `eval` override is unannotated
    return model


def tiny_qwen2(vocab_size: int, *, seed: int = 0, **config_overrides: Any) -> Qwen2ForCausalLM:
    """Builds a tiny random-weight Qwen2 causal LM.

    Args:
        vocab_size: Vocabulary size (``len(tokenizer)``).
        seed: Weight-init seed; the same seed gives identical weights whatever the global RNG
            state, and the global RNG state is left untouched.
        **config_overrides: ``Qwen2Config`` fields overriding :data:`TINY_DEFAULTS`
            (e.g. ``num_hidden_layers=1``, ``pad_token_id=0``).

    Returns:
        The model, in ``eval()`` mode and float32.
    """
    return _build(Qwen2ForCausalLM, Qwen2Config, vocab_size, seed, **config_overrides)


def tiny_llama(vocab_size: int, *, seed: int = 0, **config_overrides: Any) -> LlamaForCausalLM:
    """Builds a tiny random-weight Llama causal LM.

    Args:
        vocab_size: Vocabulary size (``len(tokenizer)``).
        seed: Weight-init seed; the same seed gives identical weights whatever the global RNG
            state, and the global RNG state is left untouched.
        **config_overrides: ``LlamaConfig`` fields overriding :data:`TINY_DEFAULTS`.

    Returns:
        The model, in ``eval()`` mode and float32.
    """
    return _build(LlamaForCausalLM, LlamaConfig, vocab_size, seed, **config_overrides)


def tiny_qwen3_moe(
    vocab_size: int, *, seed: int = 0, **config_overrides: Any
) -> Qwen3MoeForCausalLM:
    """Builds a tiny random-weight Qwen3-MoE causal LM (a mixture of experts in every layer).

    Args:
        vocab_size: Vocabulary size (``len(tokenizer)``).
        seed: Weight-init seed; the same seed gives identical weights whatever the global RNG
            state, and the global RNG state is left untouched.
        **config_overrides: ``Qwen3MoeConfig`` fields overriding :data:`TINY_DEFAULTS` and
            :data:`TINY_MOE_DEFAULTS`.

    Returns:
        The model, in ``eval()`` mode and float32.
    """
    kw = {**TINY_MOE_DEFAULTS, **config_overrides}
    return _build(Qwen3MoeForCausalLM, Qwen3MoeConfig, vocab_size, seed, **kw)


def _set_special_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    for name, value in ids.items():
        setattr(model.config, name, value)
        if model.generation_config is not None:
            setattr(model.generation_config, name, value)


@overload
def tiny_causal_lm(
    arch: Literal["qwen3_moe"],
    tokenizer: PreTrainedTokenizerFast | None = ...,
    *,
    seed: int = ...,
    **config_overrides: Any,
) -> tuple[Qwen3MoeForCausalLM, PreTrainedTokenizerFast]: ...


@overload
def tiny_causal_lm(
    arch: Literal["qwen2"] = ...,
    tokenizer: PreTrainedTokenizerFast | None = ...,
    *,
    seed: int = ...,
    **config_overrides: Any,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]: ...


@overload
def tiny_causal_lm(
    arch: Literal["llama"],
    tokenizer: PreTrainedTokenizerFast | None = ...,
    *,
    seed: int = ...,
    **config_overrides: Any,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]: ...


def tiny_causal_lm(
    arch: Literal["qwen2", "llama", "qwen3_moe"] = "qwen2",
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    seed: int = 0,
    **config_overrides: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Builds a tiny model and a matching tokenizer, ready for ``generate``.

    The config's and generation config's ``pad_token_id``/``eos_token_id``/``bos_token_id`` are set
    from the tokenizer, so ``model.generate(**batch, do_sample=True, max_new_tokens=n)`` runs
    without warnings. Pad prompts on the left for generation
    (``tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")``).

    Args:
        arch: ``"qwen2"``, ``"llama"`` or ``"qwen3_moe"`` (:func:`tiny_qwen3_moe`).
        tokenizer: Tokenizer to size the vocabulary from; a :func:`char_tokenizer` when ``None``.
        seed: Weight-init seed (see :func:`tiny_qwen2`).
        **config_overrides: Config fields overriding :data:`TINY_DEFAULTS`.

    Returns:
        ``(model, tokenizer)``; the model is in ``eval()`` mode and float32.

    Raises:
        ValueError: If ``arch`` is unknown.
    """
    tok = char_tokenizer() if tokenizer is None else tokenizer
    model: PreTrainedModel
    if arch == "qwen2":
        model = tiny_qwen2(len(tok), seed=seed, **config_overrides)
    elif arch == "llama":
        model = tiny_llama(len(tok), seed=seed, **config_overrides)
    elif arch == "qwen3_moe":
        model = tiny_qwen3_moe(len(tok), seed=seed, **config_overrides)
    else:
        raise ValueError(f"unknown arch {arch!r}; expected 'qwen2', 'llama' or 'qwen3_moe'")
    _set_special_ids(model, tok)
    return model, tok


def save_tiny(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, directory: str | PathLike[str]
) -> Path:
    """Saves a tiny model (safetensors) and its tokenizer for :func:`load_tiny`.

    The model (``config.json``, ``generation_config.json``, ``model.safetensors``) goes to
    ``directory``; the tokenizer goes to ``directory/tokenizer`` (:data:`TOKENIZER_SUBDIR`), away
    from the model config, so no loader can swap its pre-tokenizer.

    Args:
        model: The model to save.
        tokenizer: Its tokenizer.
        directory: Target directory (created if missing).

    Returns:
        The tokenizer directory.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    return save_tokenizer(tokenizer, path / TOKENIZER_SUBDIR)


def load_tiny(
    directory: str | PathLike[str],
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Loads a model and tokenizer written by :func:`save_tiny`.

    Args:
        directory: A directory written by :func:`save_tiny`. A plain ``save_pretrained`` directory
            holding both model and tokenizer files also works (the tokenizer is still loaded with
            :func:`~rl_testing.tokenizer.load_tokenizer`, never ``AutoTokenizer``).

    Returns:
        ``(model, tokenizer)`` with identical weights (so identical logits) and token ids; the
        model is in ``eval()`` mode and float32.
    """
    path = Path(directory)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True
    )
    model.train(False)  # = eval()
    tok_dir = path / TOKENIZER_SUBDIR
    tokenizer = load_tokenizer(tok_dir if tok_dir.is_dir() else path)
    return model, tokenizer
