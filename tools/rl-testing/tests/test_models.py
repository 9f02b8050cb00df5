"""Tests of the tiny causal LMs (real transformers models, no mocks)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from rl_testing.models import (
    TINY_DEFAULTS,
    TINY_MOE_DEFAULTS,
    TOKENIZER_SUBDIR,
    load_tiny,
    save_tiny,
    tiny_causal_lm,
    tiny_llama,
    tiny_qwen2,
    tiny_qwen3_moe,
)
from rl_testing.tokenizer import bpe_tokenizer, char_tokenizer
from transformers import (
    BatchEncoding,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2ForCausalLM,
    Qwen3MoeForCausalLM,
)
from transformers.utils import logging as hf_logging

Arch = Literal["qwen2", "llama", "qwen3_moe"]
ARCHS: list[Arch] = ["qwen2", "llama", "qwen3_moe"]
BUILDERS = {"qwen2": tiny_qwen2, "llama": tiny_llama, "qwen3_moe": tiny_qwen3_moe}
CLASSES = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM}
PROMPTS = ["1+1=", "what is 12+30?", "7"]


def _same_weights(a: PreTrainedModel, b: PreTrainedModel) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    # bit-exact: the same seeded initialisation, or a save/load round trip
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _generate(model: Any, batch: BatchEncoding) -> torch.Tensor:
    # `Any`: transformers 5 annotates `generate(self: GenerativePreTrainedModel, ...)`, which mypy
    # rejects for concrete models, and returns a union of output types.
    out = model.generate(**batch, do_sample=True, max_new_tokens=6)
    assert isinstance(out, torch.Tensor)
    return out


@pytest.fixture
def hf_records(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Captures transformers' own log records (its logger does not propagate by default)."""
    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            yield caplog
    finally:
        hf_logging.disable_propagation()


@pytest.mark.parametrize("arch", ARCHS)
def test_seed_determinism_and_global_rng(arch: str) -> None:
    build = BUILDERS[arch]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build(50, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # bit-exact: caller's RNG bytes untouched
    torch.manual_seed(999)  # a different global state must not matter
    b = build(50, seed=7)
    c = build(50, seed=8)
    assert _same_weights(a, b)
    assert not _same_weights(a, c)


@pytest.mark.parametrize("arch", ARCHS)
def test_seeding_leaves_the_cuda_generators_alone(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the CPU generator, which is restored, is seeded: ``torch.manual_seed`` would also
    reseed every CUDA generator (queued until CUDA starts), which nothing restores."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    BUILDERS[arch](50, seed=7)
    assert calls == []


@pytest.mark.parametrize("arch", ARCHS)
def test_defaults(arch: str) -> None:
    model = BUILDERS[arch](40)
    assert isinstance(model, CLASSES[arch])
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    moe = TINY_MOE_DEFAULTS if arch == "qwen3_moe" else {}
    for key, value in {**TINY_DEFAULTS, **moe}.items():
        assert getattr(model.config, key) == value
    assert model.config.vocab_size == 40
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied
    assert sum(p.numel() for p in model.parameters()) < 200_000


def test_config_overrides() -> None:
    model = tiny_qwen2(30, num_hidden_layers=1, hidden_size=32, tie_word_embeddings=False)
    assert model.config.num_hidden_layers == 1
    assert model.config.hidden_size == 32
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_qwen2(0)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_causal_lm_sets_special_ids(arch: Arch) -> None:
    model, tok = tiny_causal_lm(arch)
    assert model.config.vocab_size == len(tok)
    for cfg in (model.config, model.generation_config):
        assert cfg.pad_token_id == tok.pad_token_id
        assert cfg.eos_token_id == tok.eos_token_id
        assert cfg.bos_token_id == tok.bos_token_id


def test_tiny_causal_lm_with_bpe_and_bad_arch() -> None:
    bpe = bpe_tokenizer()
    model, tok = tiny_causal_lm("llama", bpe, seed=3)
    assert tok is bpe
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, torch.nn.Embedding)
    assert embedding.num_embeddings == len(bpe)
    with pytest.raises(ValueError, match="unknown arch"):
        tiny_causal_lm("gpt2")  # type: ignore[call-overload]


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_padding(arch: Arch, hf_records: pytest.LogCaptureFixture) -> None:
    model, tok = tiny_causal_lm(arch)
    batch = tok(PROMPTS, padding=True, padding_side="left", return_tensors="pt")
    P = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _generate(model, batch)
    assert not [r for r in hf_records.records if r.levelno >= logging.WARNING]
    assert out.shape[0] == len(PROMPTS)
    assert P < out.shape[1] <= P + 6
    assert torch.equal(out[:, :P], batch["input_ids"])  # bit-exact: integer token ids
    assert bool((out < len(tok)).all())
    # Sampling is reproducible under the global seed.
    torch.manual_seed(0)
    # bit-exact: the same kernels and random draws on the same inputs, in one process
    assert torch.equal(_generate(model, batch), out)


@pytest.mark.parametrize("arch", ARCHS)
def test_right_padding_does_not_change_valid_logits(arch: Arch) -> None:
    model, tok = tiny_causal_lm(arch)
    batch = tok(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        padded = model(**batch).logits
        for i, prompt in enumerate(PROMPTS):
            alone = model(**tok([prompt], return_tensors="pt")).logits[0]
            torch.testing.assert_close(padded[i, : alone.shape[0]], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("use_bpe", [False, True], ids=["char", "bpe"])
def test_save_load_round_trip(arch: Arch, use_bpe: bool, tmp_path: Path) -> None:
    tok_in = bpe_tokenizer() if use_bpe else char_tokenizer()
    model, tok = tiny_causal_lm(arch, tok_in, seed=5)
    tok_dir = save_tiny(model, tok, tmp_path)
    assert tok_dir == tmp_path / TOKENIZER_SUBDIR
    assert (tmp_path / "model.safetensors").is_file()
    assert (tmp_path / "config.json").is_file()
    assert not (tmp_path / "tokenizer.json").exists()  # kept away from the model config
    loaded, loaded_tok = load_tiny(tmp_path)
    _assert_same_pair(model, tok, loaded, loaded_tok)


def test_load_tiny_plain_qwen2_dir(tmp_path: Path) -> None:
    # Tokenizer saved next to a qwen2 config.json: the AutoTokenizer trap in transformers 5.
    model, tok = tiny_causal_lm("qwen2")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_tiny(tmp_path)
    _assert_same_pair(model, tok, loaded, loaded_tok)


def _assert_same_pair(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerFast,
    loaded: PreTrainedModel,
    loaded_tok: PreTrainedTokenizerFast,
) -> None:
    assert type(loaded) is type(model)
    assert not loaded.training
    assert loaded.dtype == torch.float32
    assert isinstance(loaded_tok, PreTrainedTokenizerFast)
    text = "what is 12 + 345?  (a,b): x/y=z. \n the answer is five."
    assert loaded_tok.encode(text) == tok.encode(text)
    assert loaded_tok.get_vocab() == tok.get_vocab()
    assert _same_weights(model, loaded)
    batch = tok([*PROMPTS, text], padding=True, return_tensors="pt")
    with torch.no_grad():  # bit-exact: the loaded weights are the saved ones, same kernels
        assert torch.equal(loaded(**batch).logits, model(**batch).logits)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        assert getattr(loaded.config, name) == getattr(model.config, name)
        assert getattr(loaded.generation_config, name) == getattr(model.generation_config, name)
