"""Tests of the locally built tokenizers (real tokenizers, no mocks)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_testing.models import tiny_qwen2
from rl_testing.tokenizer import (
    CHAT_TEMPLATE,
    DEFAULT_ALPHABET,
    ROLE_TOKENS,
    bpe_tokenizer,
    char_tokenizer,
    load_tokenizer,
    save_tokenizer,
)
from transformers import BatchEncoding, PreTrainedTokenizerFast

SETTINGS = settings(max_examples=50, deadline=None)
CHAT = [
    {"role": "system", "content": "be brief."},
    {"role": "user", "content": "what is 1+1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "and 2+2?"},
]
ALPHABET_TEXT = st.text(alphabet=DEFAULT_ALPHABET, max_size=40)

CHAR = char_tokenizer()
BPE = bpe_tokenizer()


def _fingerprint(tok: PreTrainedTokenizerFast) -> str:
    return hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()


def test_default_alphabet_covers_the_promised_characters() -> None:
    for ch in "0123456789abcdefghijklmnopqrstuvwxyz +-*/=?.,:()":
        assert ch in DEFAULT_ALPHABET
    assert len(set(DEFAULT_ALPHABET)) == len(DEFAULT_ALPHABET)


@pytest.mark.parametrize("tok", [CHAR, BPE], ids=["char", "bpe"])
def test_special_tokens(tok: PreTrainedTokenizerFast) -> None:
    assert isinstance(tok, PreTrainedTokenizerFast)
    ids = [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id]
    assert ids == [0, 1, 2, 3]
    role_ids = tok.convert_tokens_to_ids(list(ROLE_TOKENS.values()))
    assert role_ids == [4, 5, 6, 7]
    assert len(set(ids + role_ids)) == 8
    assert tok.padding_side == "right"
    # Nothing is added implicitly: no bos, no eos.
    assert tok.encode("12") == tok.convert_tokens_to_ids(["1", "2"])


def test_char_vocab_layout() -> None:
    assert len(CHAR) == 8 + len(DEFAULT_ALPHABET)
    assert CHAR.convert_tokens_to_ids(list(DEFAULT_ALPHABET)) == list(
        range(8, 8 + len(DEFAULT_ALPHABET))
    )


@SETTINGS
@given(ALPHABET_TEXT)
def test_char_round_trip(text: str) -> None:
    ids = CHAR.encode(text)
    assert len(ids) == len(text)
    assert CHAR.decode(ids) == text
    assert CHAR.unk_token_id not in ids


def test_char_unknown_characters_map_to_unk() -> None:
    assert CHAR.encode("A\t") == [CHAR.unk_token_id] * 2


def test_char_custom_alphabet() -> None:
    tok = char_tokenizer("0123456789+=0")  # duplicate '0' dropped
    assert len(tok) == 8 + 12
    assert tok.decode(tok.encode("12+3=15")) == "12+3=15"
    with pytest.raises(ValueError, match="empty"):
        char_tokenizer("")


def test_batch_padding_is_right_side() -> None:
    batch = CHAR(["12", "3"], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [CHAR.encode("12"), [*CHAR.encode("3"), 0]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]


@pytest.mark.parametrize("tok", [CHAR, BPE], ids=["char", "bpe"])
def test_chat_template_renders_generation_prompt(tok: PreTrainedTokenizerFast) -> None:
    assert tok.chat_template == CHAT_TEMPLATE
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    assert text == (
        "<|system|>be brief.<eos><|user|>what is 1+1?<eos><|assistant|>2<eos>"
        "<|user|>and 2+2?<eos><|assistant|>"
    )
    assert text.endswith(ROLE_TOKENS["assistant"])
    no_prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)
    assert isinstance(no_prompt, str)
    assert no_prompt.endswith("<eos>")
    # Tokenizing returns a BatchEncoding in transformers 5; ids end with the assistant marker.
    enc = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    assert isinstance(enc, BatchEncoding)
    ids = enc["input_ids"]
    assert ids == tok.encode(text)
    assert ids[-1] == tok.convert_tokens_to_ids(ROLE_TOKENS["assistant"])
    assert tok.decode(ids, skip_special_tokens=True) == "be brief.what is 1+1?2and 2+2?"


def test_chat_template_assistant_mask() -> None:
    enc = CHAR.apply_chat_template(CHAT[:3], return_dict=True, return_assistant_tokens_mask=True)
    assert isinstance(enc, BatchEncoding)
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assert CHAR.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "2<eos>"


def test_chat_template_rejects_unknown_role() -> None:
    with pytest.raises(Exception, match="unknown chat role"):
        CHAR.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_bpe_is_deterministic_and_sized() -> None:
    again = bpe_tokenizer()
    assert again.get_vocab() == BPE.get_vocab()
    assert _fingerprint(again) == _fingerprint(BPE)
    assert len(BPE) == 300
    assert len(bpe_tokenizer(vocab_size=120)) == 120
    other = bpe_tokenizer(["zebra zebra zebra quagga quagga"], vocab_size=100)
    assert other.get_vocab() != BPE.get_vocab()
    assert other.decode(other.encode("zebra 12")) == "zebra 12"


def test_fresh_process_imports_and_bpe_determinism() -> None:
    # One fresh interpreter (imports cost seconds) checks two things: importing rl_testing pulls in
    # neither transformers nor tokenizers, and BPE training gives the same vocabulary in another
    # process (Rust hash maps are seeded per process; the vocabulary must not depend on that).
    code = (
        "import sys, hashlib, rl_testing, rl_testing.strategies\n"
        "assert 'transformers' not in sys.modules and 'tokenizers' not in sys.modules\n"
        "from rl_testing.tokenizer import bpe_tokenizer\n"
        "print(hashlib.sha256(bpe_tokenizer().backend_tokenizer.to_str().encode()).hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == _fingerprint(BPE)


def test_bpe_compresses_english() -> None:
    text = "the answer is five. what is the sum of two and three?"
    assert len(BPE.encode(text)) < len(text) // 2


@SETTINGS
@given(ALPHABET_TEXT)
def test_bpe_round_trip(text: str) -> None:
    ids = BPE.encode(text)
    assert BPE.decode(ids) == text
    assert BPE.unk_token_id not in ids


@pytest.mark.parametrize("tok", [CHAR, BPE], ids=["char", "bpe"])
def test_save_load_round_trip(tok: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    assert save_tokenizer(tok, tmp_path / "tok") == tmp_path / "tok"
    loaded = load_tokenizer(tmp_path / "tok")
    _assert_same_tokenizer(tok, loaded)


def test_load_tokenizer_next_to_a_qwen2_config(tmp_path: Path) -> None:
    # The transformers 5 trap: AutoTokenizer would swap in Qwen2's pre-tokenizer here.
    tiny_qwen2(len(CHAR)).save_pretrained(tmp_path)
    CHAR.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file()
    _assert_same_tokenizer(CHAR, load_tokenizer(tmp_path))


def test_load_tokenizer_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path)


def _assert_same_tokenizer(a: PreTrainedTokenizerFast, b: PreTrainedTokenizerFast) -> None:
    assert b.get_vocab() == a.get_vocab()
    texts = ["what is 12 + 345?  (a,b): x/y=z. \n end ", "1+1=2", "", "  ", "Caps\tunk"]
    for text in texts:
        assert b.encode(text) == a.encode(text)
        assert b.decode(b.encode(text)) == a.decode(a.encode(text))
    enc_a = a.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    enc_b = b.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    assert isinstance(enc_a, BatchEncoding)
    assert isinstance(enc_b, BatchEncoding)
    assert enc_b["input_ids"] == enc_a["input_ids"]
    assert (b.pad_token_id, b.bos_token_id, b.eos_token_id, b.unk_token_id) == (
        a.pad_token_id,
        a.bos_token_id,
        a.eos_token_id,
        a.unk_token_id,
    )
    assert b.padding_side == a.padding_side == "right"
    assert b.chat_template == a.chat_template
    assert b(["12", "3"], padding=True)["input_ids"] == a(["12", "3"], padding=True)["input_ids"]
