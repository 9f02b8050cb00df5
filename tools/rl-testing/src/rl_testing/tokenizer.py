"""Small tokenizers built locally (nothing is downloaded); needs the ``models`` extra.

Two kinds are provided, both wrapped as :class:`transformers.PreTrainedTokenizerFast` with the same
special tokens and chat template:

* :func:`char_tokenizer`: one token per character of a fixed alphabet (WordLevel over single
  characters), so ``decode(encode(text)) == text`` for every text over the alphabet.
* :func:`bpe_tokenizer`: a small BPE trained in-process on a built-in English + arithmetic corpus
  (deterministic: the same corpus and vocabulary size always give the same vocabulary).

Special tokens (ids fixed for both kinds): ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2,
``<unk>`` = 3, then the role markers ``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|tool|>``
(4-7). No token is added automatically when encoding: ``encode("12")`` is exactly the two digit
tokens. Padding is on the right by default.

The chat template renders each message as ``<|role|>content<eos>`` and, with
``add_generation_prompt=True``, ends with ``<|assistant|>``. Assistant content is wrapped in
``{% generation %}`` so ``return_assistant_tokens_mask=True`` works.

Transformers 5 trap: ``AutoTokenizer.from_pretrained(d)`` on a directory whose ``config.json`` says
``qwen2`` returns a ``Qwen2Tokenizer`` that swaps in Qwen2's pre-tokenizer (spaces are dropped and
ids change). :func:`load_tokenizer` always loads with ``PreTrainedTokenizerFast.from_pretrained``,
which keeps ``tokenizer.json`` exactly as saved.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "DEFAULT_ALPHABET",
    "DEFAULT_CORPUS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "ROLE_TOKENS",
    "SPECIAL_TOKENS",
    "UNK_TOKEN",
    "bpe_tokenizer",
    "char_tokenizer",
    "load_tokenizer",
    "save_tokenizer",
]

DEFAULT_ALPHABET: str = string.digits + string.ascii_lowercase + " \n" + "+-*/=?.,:()!'"
"""Digits, lowercase ASCII letters, space, newline and common punctuation."""

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""Named special tokens, in id order (ids 0-3)."""

ROLE_TOKENS: dict[str, str] = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
}
"""Chat role -> role marker token (ids 4-7, in this order)."""

CHAT_TEMPLATE: str = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|assistant|>' }}"
    "{%- generation -%}{{ message['content'] + '<eos>' }}{%- endgeneration -%}"
    "{%- else -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)
"""Jinja chat template: ``<|role|>content<eos>`` per message, then ``<|assistant|>``."""

_ALL_SPECIALS: tuple[str, ...] = SPECIAL_TOKENS + tuple(ROLE_TOKENS.values())

# Any character, newlines included (Oniguruma has no `(?s)` flag).
_ONE_CHAR = Regex(r"[\s\S]")
# BPE pre-tokenization: words keep one leading space, digits stay single (easy arithmetic),
# every other character is its own piece. The alternatives cover every character, so the pieces
# concatenate back to the input and a `Fuse` decoder restores the text exactly.
_BPE_SPLIT = Regex(r" ?[a-z]+| ?[0-9]| ?[^\sa-z0-9]|\s")

_WORDS = (
    "the quick brown fox jumps over the lazy dog.",
    "a small model learns to add two numbers.",
    "what is the answer? the answer is a number.",
    "please think step by step, then give the final answer.",
    "the sum of two and three is five.",
    "the product of four and six is twenty four.",
    "if you have seven apples and eat two, you have five apples left.",
    "reward goes up when the policy improves.",
    "each prompt gets a group of samples; the advantage is the reward minus the group mean.",
    "count the letters in the word: banana.",
    "is this sentence true or false? answer yes or no.",
    "repeat after me: hello world.",
    "she said: it's a good day to learn (and to test).",
    "one, two, three, four, five, six, seven, eight, nine, ten.",
    "solve for x: x + 3 = 10.",
    "the tool returned an observation; read it and answer.",
)


def _arithmetic_lines() -> list[str]:
    lines = []
    for a in range(0, 20, 3):
        for b in range(1, 15, 4):
            lines.append(f"{a}+{b}={a + b}")
            lines.append(f"what is {a} * {b}? {a * b}")
            lines.append(f"{a + b} - {b} = {a}")
            lines.append(f"({a}+{b})/{b}={(a + b) / b:.2f}")
    return lines


DEFAULT_CORPUS: tuple[str, ...] = _WORDS + tuple(_arithmetic_lines())
"""Built-in corpus for :func:`bpe_tokenizer`: short English sentences and arithmetic lines."""


def _dedupe(alphabet: str) -> list[str]:
    chars = list(dict.fromkeys(alphabet))
    if not chars:
        raise ValueError("alphabet must not be empty")
    return chars


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False, single_word=False) for t in _ALL_SPECIALS]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        padding_side="right",
        truncation_side="right",
        clean_up_tokenization_spaces=False,
    )
    expected = {t: i for i, t in enumerate(_ALL_SPECIALS)}
    actual = {t: wrapped.convert_tokens_to_ids(t) for t in _ALL_SPECIALS}
    if actual != expected:  # pragma: no cover - guards the fixed-id contract
        raise RuntimeError(f"special token ids {actual} != {expected}")
    return wrapped


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """Builds a character-level tokenizer: one token per character of ``alphabet``.

    Ids 0-7 are the special and role tokens (see the module docstring); the characters follow in
    the order they appear in ``alphabet`` (duplicates dropped). Characters outside the alphabet
    encode to ``<unk>``. For any text over the alphabet, ``decode(encode(text)) == text`` and
    ``len(encode(text)) == len(text)``.

    Args:
        alphabet: Characters of the vocabulary. Defaults to :data:`DEFAULT_ALPHABET`.

    Returns:
        A fast tokenizer with pad/bos/eos/unk set, right padding and the chat template.

    Raises:
        ValueError: If ``alphabet`` is empty.
    """
    chars = _dedupe(alphabet)
    vocab = {t: i for i, t in enumerate(_ALL_SPECIALS)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(_ONE_CHAR, behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _wrap(tok)


def bpe_tokenizer(
    corpus: Iterable[str] | None = None,
    vocab_size: int = 300,
    *,
    alphabet: str = DEFAULT_ALPHABET,
) -> PreTrainedTokenizerFast:
    """Trains a small BPE tokenizer in-process (about 20 ms).

    Every character of ``alphabet`` (and of the corpus) is in the vocabulary, so texts over the
    alphabet round-trip exactly through ``encode``/``decode``. Pre-tokenization keeps one leading
    space with each word and splits digits singly. Training is deterministic: the same corpus and
    ``vocab_size`` give the same vocabulary and merges.

    Args:
        corpus: Training texts. Defaults to :data:`DEFAULT_CORPUS`.
        vocab_size: Target vocabulary size, special tokens included (the result can be smaller
            when the corpus has too few distinct pairs).
        alphabet: Characters guaranteed to be single tokens. Defaults to :data:`DEFAULT_ALPHABET`.

    Returns:
        A fast tokenizer with the same special tokens (same ids), padding side and chat template as
        :func:`char_tokenizer`.
    """
    texts: Sequence[str] = tuple(DEFAULT_CORPUS if corpus is None else corpus)
    tok = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(_BPE_SPLIT, behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(_ALL_SPECIALS),
        initial_alphabet=_dedupe(alphabet),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return _wrap(tok)


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | PathLike[str]) -> Path:
    """Saves a tokenizer so that :func:`load_tokenizer` restores it exactly.

    Prefer a directory without a model ``config.json`` (see the transformers 5 trap in the module
    docstring); :func:`rl_testing.models.save_tiny` uses a ``tokenizer/`` subdirectory for that.

    Args:
        tok: The tokenizer to save.
        directory: Target directory (created if missing).

    Returns:
        The directory, as a :class:`~pathlib.Path`.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(path))
    return path


def load_tokenizer(directory: str | PathLike[str]) -> PreTrainedTokenizerFast:
    """Loads a tokenizer written by :func:`save_tokenizer` (or ``save_pretrained``).

    Uses ``PreTrainedTokenizerFast.from_pretrained`` (never ``AutoTokenizer``), local files only,
    so ``tokenizer.json`` is used as saved even when the directory also holds a qwen2 model config.

    Args:
        directory: Directory holding ``tokenizer.json`` and ``tokenizer_config.json``.

    Returns:
        The tokenizer; ids, special tokens, padding side and chat template equal the saved one's.

    Raises:
        FileNotFoundError: If ``directory`` has no ``tokenizer.json``.
    """
    path = Path(directory)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    tok: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(
        str(path), local_files_only=True
    )
    return tok
