"""The lean decode loop against Hugging Face ``generate``: the same tokens and log-probs, bit for
bit, under greedy decoding and under sampling with the same seed, for every sampling option
the loop serves; and ``generate`` for what it does not serve."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rl_rollout import HFEngine, SamplingParams, supports_lean_decode
from rollout_testlib import ARCHS, EOS, EosBoost, tiny

PROMPTS = ["hello", "ab", "what is 2+3?"]  # different lengths: left padding

OPTIONS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "plain": {},
    "temperature": {"temperature": 0.7},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.8},
    "min_p": {"min_p": 0.2},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "min_new_tokens": {"min_new_tokens": 6},
    "stop_token_ids": {"stop_token_ids": (40, 41, 42)},
    "all": {"temperature": 1.3, "top_k": 20, "top_p": 0.9, "min_p": 0.05,
            "repetition_penalty": 1.2, "min_new_tokens": 2},
}  # fmt: skip


def both(model: Any, tok: Any, params: SamplingParams) -> tuple[Any, Any]:
    lean = HFEngine(model, tok)
    slow = HFEngine(model, tok, decode="generate")
    assert lean.uses_lean_decode(params) and not slow.uses_lean_decode(params)
    return lean.generate(PROMPTS, params), slow.generate(PROMPTS, params)


def assert_identical(a: Any, b: Any) -> None:
    # The lean loop calls the model with generate's exact arguments and draws the same random
    # numbers: the same kernels on the same inputs (rl_rollout.decode).
    # bit-exact: integer token ids of the same kernels
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)  # bit-exact: bool mask
    assert torch.equal(a.completion_lengths, b.completion_lengths)  # bit-exact: integers
    assert a.finish_reasons == b.finish_reasons
    if a.logprobs is not None or b.logprobs is not None:
        assert torch.equal(a.logprobs, b.logprobs)  # bit-exact: the same kernels (see above)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_lean_equals_generate(arch: str, option: str) -> None:
    model, tok = tiny(arch, seed=1)
    params = SamplingParams(
        max_new_tokens=12, n=1 if option == "greedy" else 3, seed=7, return_logprobs=True,
        logits_processor=EosBoost(4.0), **OPTIONS[option],
    )  # fmt: skip
    lean, slow = both(model, tok, params)
    assert_identical(lean, slow)
    # EOS is boosted so some rows end early and are padded: the stop path is exercised
    stopped = {r for r in lean.finish_reasons if r == "stop"}
    assert stopped or option in ("min_new_tokens", "all", "greedy")


def test_all_rows_ending_stops_the_loop_early() -> None:
    model, tok = tiny("qwen2", seed=1)
    params = SamplingParams(max_new_tokens=20, n=2, seed=0, logits_processor=EosBoost(50.0))
    lean, slow = both(model, tok, params)
    assert_identical(lean, slow)
    assert lean.completion_ids.shape[1] < 20  # every row sampled EOS at once
    assert (lean.completion_ids[:, 0] == EOS).all()


def test_lean_keeps_the_callers_rng_untouched() -> None:
    model, tok = tiny("qwen2", seed=1)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    HFEngine(model, tok).generate(PROMPTS, SamplingParams(max_new_tokens=4, n=2, seed=5))
    assert torch.equal(torch.get_rng_state(), before)  # bit-exact: RNG state bytes


def test_generate_serves_what_the_lean_loop_does_not() -> None:
    model, tok = tiny("qwen2", seed=1)
    engine = HFEngine(model, tok)
    assert supports_lean_decode(model)
    assert not engine.uses_lean_decode(SamplingParams(stop=("x",)))
    assert not HFEngine(model, tok, generate_kwargs={"output_scores": False}).uses_lean_decode(
        SamplingParams()
    )
    model.generation_config.suppress_tokens = [9]
    assert not supports_lean_decode(model)
    model.generation_config.suppress_tokens = None
    model.generation_config.no_repeat_ngram_size = 2
    assert not supports_lean_decode(model)
    assert not supports_lean_decode(torch.nn.Linear(2, 2))


def test_unknown_decode_mode_raises() -> None:
    model, tok = tiny("qwen2")
    with pytest.raises(ValueError, match="`decode` must be 'lean' or 'generate'"):
        HFEngine(model, tok, decode="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_equals_generate_without_padding(temperature: float) -> None:
    """Equal-length prompts: generate drops the all-ones mask, and so does the lean loop."""
    model, tok = tiny("llama", seed=3)
    prompts = [[10, 11, 12, 13], [20, 21, 22, 23]]
    params = SamplingParams(
        max_new_tokens=9,
        n=1 if temperature == 0 else 4,
        seed=11,
        temperature=temperature,
        return_logprobs=True,
    )  # generate refuses n > 1 when greedy
    lean = HFEngine(model, tok).generate(prompts, params)
    slow = HFEngine(model, tok, decode="generate").generate(prompts, params)
    assert_identical(lean, slow)


def test_nan_scores_raise_like_multinomial() -> None:
    model, tok = tiny("qwen2", seed=1)

    def nan_hook(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.full_like(scores, float("nan"))

    params = SamplingParams(max_new_tokens=3, n=2, seed=0, logits_processor=nan_hook)
    for decode in ("lean", "generate"):
        with pytest.raises(RuntimeError, match="probability tensor contains"):
            HFEngine(model, tok, decode=decode).generate(PROMPTS, params)  # type: ignore[arg-type]
