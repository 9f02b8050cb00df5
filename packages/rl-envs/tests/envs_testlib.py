"""Shared helpers for the rl-envs tests: the locally built char tokenizer and small datasets."""

from __future__ import annotations

from functools import cache

from datasets import Dataset
from rl_testing.tokenizer import char_tokenizer
from transformers import PreTrainedTokenizerFast

TEMPLATE = [{"role": "user", "content": "Q: {question}\nA:"}]


@cache
def _tok() -> PreTrainedTokenizerFast:
    return char_tokenizer()


def tok() -> PreTrainedTokenizerFast:
    """The char tokenizer (pad 0, bos 1, eos 2, role markers 4-7), shared read-only."""
    return _tok()


def qa_dataset(n: int, offset: int = 0) -> Dataset:
    """``n`` rows whose answer is derived from the question, so a mismatch is detectable."""
    questions = [f"q{offset + i}" for i in range(n)]
    return Dataset.from_dict(
        {"question": questions, "answer": [f"a{offset + i}" for i in range(n)]}
    )


def encode(text: str) -> list[int]:
    return list(tok()(text, add_special_tokens=False)["input_ids"])
