"""Prompts as token ids: encoding, validation and the length limit, for every engine.

What an engine accepts as ``prompts`` (strings, lists of ids, tensors of ids) and the checks
that turn a wrong shape, a non-integer id, an id outside the model's vocabulary, an empty
prompt or one over ``max_model_len - max_new_tokens`` into a ``ValueError`` naming the prompt,
before anything is sampled: :func:`encode_prompts`, shared by :class:`~rl_rollout.HFEngine`
and :class:`~rl_rollout.VLLMEngine`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

import torch

__all__ = ["Prompts", "encode_prompts"]

Prompts = Sequence[str] | Sequence[Sequence[int]]


def encode_prompts(
    prompts: Prompts,
    tokenizer: Any,
    max_model_len: int,
    max_new_tokens: int,
    truncation: Literal["error", "left"] = "error",
    vocab_size: int | None = None,
) -> list[list[int]]:
    """Token ids of each prompt, checked against ``max_model_len - max_new_tokens``.

    Args:
        prompts: A list of prompts, each a string or a list of token ids.
        tokenizer: Encodes the string prompts (no special tokens added).
        max_model_len: Longest prompt + completion.
        max_new_tokens: Tokens to leave for the completion.
        truncation: ``"error"`` for prompts over the limit, or ``"left"`` to keep their tails.
        vocab_size: The model's vocabulary size: every id must be in ``[0, vocab_size)``
            (None skips the check).

    Returns:
        The token ids of each prompt.

    Raises:
        ValueError: a single string or a flat list of ids instead of a list of prompts, an
            empty prompt list or prompt, an id that is not an int or is outside the vocabulary
            (naming the prompt and the token), no room for a prompt, or (with
            ``truncation="error"``) a prompt over the limit; the message names both lengths.
    """
    if isinstance(prompts, str):
        shown = prompts if len(prompts) <= 40 else prompts[:40] + "..."
        raise ValueError(f"`prompts` must be a list of prompts; wrap a single prompt: [{shown!r}]")
    if len(prompts) == 0:
        raise ValueError("`prompts` is empty: pass at least one prompt")
    limit = max_model_len - max_new_tokens
    if limit < 1:
        raise ValueError(
            f"`max_new_tokens` = {max_new_tokens} leaves no room for a prompt within "
            f"max_model_len = {max_model_len}"
        )
    encoded: list[list[int]] = []
    for i in range(len(prompts)):
        ids = _prompt_ids(i, prompts, tokenizer, vocab_size)
        if len(ids) > limit:
            if truncation == "error":
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens, more than max_model_len - "
                    f"max_new_tokens = {max_model_len} - {max_new_tokens} = "
                    f"{limit}; shorten it or use truncation='left'"
                )
            ids = ids[-limit:]
        encoded.append(ids)
    return encoded


def _is_token_id(value: object) -> bool:
    """An int (not a bool) or a 0-d integer tensor."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not value.is_floating_point() and value.dtype != torch.bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _prompt_ids(i: int, prompts: Prompts, tokenizer: Any, vocab_size: int | None) -> list[int]:
    """The ids of ``prompts[i]``, checked (see :func:`encode_prompts`)."""
    prompt: Any = prompts[i]
    if _is_token_id(prompt):
        head = list(prompts)[:3]
        shown = "1, 2, 3"
        if all(map(_is_token_id, head)):
            shown = ", ".join(str(int(cast(Any, t))) for t in head)
            shown += ", ..." if len(prompts) > 3 else ""
        raise ValueError(
            f"`prompts` must be a list of prompts, but prompt {i} is the token id "
            f"{int(prompt)}; a single prompt's ids must be wrapped: [[{shown}]]"
        )
    if isinstance(prompt, str):
        ids = [int(t) for t in tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    else:
        tolist = getattr(prompt, "tolist", None)  # a tensor or array of ids
        raw = tolist() if callable(tolist) else prompt
        if not isinstance(raw, Iterable):
            raise ValueError(f"prompt {i} must be a string or a list of token ids, got {prompt!r}")
        raw = list(raw)
        bad = next((t for t in raw if not _is_token_id(t)), None)
        if bad is not None:
            raise ValueError(f"prompt {i} has {bad!r}, which is not a token id (an int)")
        ids = [int(t) for t in raw]
    if not ids:
        raise ValueError(f"prompt {i} is empty")
    if vocab_size is not None:
        for pos, token in enumerate(ids):
            if not 0 <= token < vocab_size:
                raise ValueError(
                    f"prompt {i} has token id {token} (position {pos}), outside the model's "
                    f"vocabulary [0, {vocab_size}); pass ids the model's tokenizer made"
                )
    return ids
