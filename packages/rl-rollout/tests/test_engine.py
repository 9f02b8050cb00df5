"""HFEngine on tiny real models: shapes, groups, masks and lengths (pad != eos and pad == eos),
min/max new tokens, stop strings and stop ids, seeding, chunking, truncation and input errors.

A random model rarely emits EOS by itself, so EOS and stop strings are steered with scripted
``logits_processor`` callables (see rollout_testlib) or excluded with a ``logit_mask``.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
from rl_rollout import HFEngine, RolloutResult, SamplingParams
from rl_testing.tokenizer import bpe_tokenizer
from rollout_testlib import (
    ARCHS,
    EOS,
    PAD,
    EosBoost,
    ForceScript,
    LastTokenEosBoost,
    assert_logprobs_close,
    chars_only_mask,
    check_result,
    ids,
    make_pad_eos,
    prompt_tokens_of,
    text_ok,
    tiny,
)
from transformers import PreTrainedModel, PreTrainedTokenizerFast

PROMPTS = ["hello", "ab", "what is 2+3?"]  # different lengths: left padding


def make(
    arch: str = "qwen2", seed: int = 0, **engine_kw: Any
) -> tuple[HFEngine, PreTrainedModel, PreTrainedTokenizerFast]:
    model, tok = tiny(arch, seed)
    return HFEngine(model, tok, **engine_kw), model, tok


def script_for(tok: PreTrainedTokenizerFast, spec: dict[str, str | list[int]]) -> ForceScript:
    """``{prompt text: completion text or ids}`` -> a ForceScript."""
    return ForceScript(
        {tuple(ids(tok, p)): ids(tok, s) if isinstance(s, str) else s for p, s in spec.items()}
    )


def rows(result: RolloutResult) -> list[list[int]]:
    """Completion tokens of each row, up to the mask end."""
    return [
        result.completion_ids[r, : int(result.completion_lengths[r])].tolist()
        for r in range(result.completion_ids.shape[0])
    ]


def assert_same_result(a: RolloutResult, b: RolloutResult) -> None:
    for name in (
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "sequences",
        "attention_mask",
        "completion_lengths",
        "group_index",
    ):
        assert torch.equal(getattr(a, name), getattr(b, name)), name  # bit-exact: integers
    assert a.finish_reasons == b.finish_reasons
    assert a.texts == b.texts
    if a.logprobs is None or b.logprobs is None:
        assert a.logprobs is None
        assert b.logprobs is None
    else:
        # some callers compare the same route (a repeat), others two (chunked against whole,
        # another padding): float32 rounding covers both
        assert_logprobs_close(a.logprobs, b.logprobs)


# --------------------------------------------------------------------------- shapes and groups


@pytest.mark.parametrize("arch", ARCHS)
def test_shapes_and_prompt_major_groups(arch: str) -> None:
    engine, _, tok = make(arch)
    params = SamplingParams(n=3, max_new_tokens=6, seed=0, return_logprobs=True)
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.prompt_ids.shape == (9, 12)
    assert result.group_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_group_rows_are_distinct_samples() -> None:
    engine, _, tok = make()
    params = SamplingParams(n=4, max_new_tokens=8, seed=3, logit_mask=chars_only_mask(len(tok)))
    result = engine.generate(["hello", "ab"], params)
    check_result(result, params, prompt_tokens_of(tok, ["hello", "ab"]))
    for g in range(2):
        group = {tuple(row) for row in result.completion_ids[4 * g : 4 * g + 4].tolist()}
        assert len(group) == 4, f"group {g} holds repeated samples"


def test_logprobs_only_on_request() -> None:
    engine, _, tok = make()
    params = SamplingParams(n=2, max_new_tokens=4, seed=0)
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.logprobs is None


# --------------------------------------------------------------------------- EOS, masks, lengths


def test_eos_ends_the_completion() -> None:
    engine, _, tok = make()
    scripts = script_for(tok, {"abc": [*ids(tok, "hi"), EOS], "def": [EOS], "ghi": "jklmnopq"})
    params = SamplingParams(
        n=2, max_new_tokens=6, seed=0, logits_processor=scripts, return_logprobs=True
    )
    prompts = ["abc", "def", "ghi"]
    result = engine.generate(prompts, params)
    check_result(result, params, prompt_tokens_of(tok, prompts))
    assert result.completion_ids.shape == (6, 6)
    assert result.completion_lengths.tolist() == [3, 3, 1, 1, 6, 6]
    assert result.finish_reasons == ["stop"] * 4 + ["length"] * 2
    for r in (0, 1):
        assert result.completion_ids[r].tolist() == [*ids(tok, "hi"), EOS, PAD, PAD, PAD]
        assert text_ok(result.texts[r], "hi", eos_at_end=True), result.texts[r]
    for r in (2, 3):
        assert result.completion_ids[r].tolist() == [EOS] + [PAD] * 5
        assert text_ok(result.texts[r], "", eos_at_end=True), result.texts[r]
    for r in (4, 5):
        assert result.completion_ids[r].tolist() == ids(tok, "jklmno")
        assert result.texts[r] == "jklmno"
    # every token was forced: probability 1 under the processed distribution
    assert result.logprobs is not None
    torch.testing.assert_close(
        result.logprobs, torch.zeros_like(result.logprobs), rtol=0.0, atol=1e-6
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masks_and_lengths_exact_when_pad_is_eos(temperature: float) -> None:
    model, tok = tiny()
    tok2 = make_pad_eos(model, tok)
    engine = HFEngine(model, tok2)
    a = [*ids(tok, "ab"), EOS, *ids(tok, "c")]  # EOS inside a prompt (as chat templates do)
    b = ids(tok, "defgh")
    c = ids(tok, "ij")
    scripts = ForceScript(
        {tuple(a): [*ids(tok, "l"), EOS], tuple(b): [EOS], tuple(c): ids(tok, "mnopqrst")},
        pad_id=EOS,
    )
    params = SamplingParams(
        temperature=temperature, max_new_tokens=6, seed=1, logits_processor=scripts
    )
    result = engine.generate([a, b, c], params)
    check_result(result, params, [a, b, c], pad_id=EOS)
    assert result.prompt_mask.sum(1).tolist() == [4, 5, 2]  # the prompt's own EOS is kept
    assert result.prompt_ids[0].tolist() == [EOS, *a]
    assert result.completion_lengths.tolist() == [2, 1, 6]
    assert result.completion_mask.tolist() == [
        [True, True, False, False, False, False],
        [True, False, False, False, False, False],
        [True] * 6,
    ]
    assert result.finish_reasons == ["stop", "stop", "length"]
    assert result.completion_ids.tolist() == [
        [*ids(tok, "l"), EOS, EOS, EOS, EOS, EOS],
        [EOS] * 6,
        ids(tok, "mnopqr"),
    ]
    # bit-exact: integer counts
    assert torch.equal(result.attention_mask.bool().sum(1), torch.tensor([6, 6, 8]))
    assert result.texts[2] == "mnopqr"
    assert text_ok(result.texts[0], "l", eos_at_end=True), result.texts[0]


def test_pad_is_eos_with_free_sampling() -> None:
    """Whatever the random model emits, the mask stops at the first EOS and not elsewhere."""
    model, tok = tiny(seed=5)
    tok2 = make_pad_eos(model, tok)
    engine = HFEngine(model, tok2)
    params = SamplingParams(
        n=4, max_new_tokens=10, seed=2, logits_processor=LastTokenEosBoost(bonus=3.0)
    )
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS), pad_id=EOS)


def test_generated_pad_token_stays_in_the_mask() -> None:
    """pad != eos: a pad id emitted before EOS is a generated token, not padding."""
    engine, _, tok = make()
    scripts = script_for(tok, {"abc": [*ids(tok, "x"), PAD, *ids(tok, "y"), EOS]})
    params = SamplingParams(max_new_tokens=6, seed=0, logits_processor=scripts)
    result = engine.generate(["abc"], params)
    check_result(result, params, prompt_tokens_of(tok, ["abc"]))
    assert rows(result) == [[*ids(tok, "x"), PAD, *ids(tok, "y"), EOS]]
    assert result.completion_mask.tolist() == [[True] * 4]
    assert result.finish_reasons == ["stop"]


@pytest.mark.parametrize(("temperature", "n"), [(0.0, 1), (1.0, 3)])
def test_length_finish_with_full_mask_when_eos_never_comes(temperature: float, n: int) -> None:
    engine, _, tok = make()
    params = SamplingParams(
        temperature=temperature,
        n=n,
        max_new_tokens=7,
        seed=4,
        logit_mask=chars_only_mask(len(tok)),
        return_logprobs=True,
    )
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    N = len(PROMPTS) * n
    assert result.completion_ids.shape == (N, 7)
    assert result.completion_mask.all()
    assert result.completion_lengths.tolist() == [7] * N
    assert result.finish_reasons == ["length"] * N
    assert result.texts == [tok.decode(row) for row in result.completion_ids.tolist()]


@pytest.mark.parametrize("max_new_tokens", [1, 4, 9])
def test_max_new_tokens_honoured(max_new_tokens: int) -> None:
    engine, _, tok = make("llama")
    params = SamplingParams(
        n=2, max_new_tokens=max_new_tokens, seed=0, logit_mask=chars_only_mask(len(tok))
    )
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.completion_ids.shape[1] == max_new_tokens
    assert result.completion_lengths.tolist() == [max_new_tokens] * 6


def test_eos_at_the_last_allowed_step_is_a_stop() -> None:
    engine, _, tok = make()
    params = SamplingParams(max_new_tokens=1, seed=0, logits_processor=EosBoost(50.0))
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.completion_ids.tolist() == [[EOS]] * 3
    assert result.finish_reasons == ["stop"] * 3

    scripts = script_for(tok, {"abc": [*ids(tok, "xy"), EOS]})
    params = SamplingParams(max_new_tokens=3, seed=0, logits_processor=scripts)
    result = engine.generate(["abc"], params)
    check_result(result, params, prompt_tokens_of(tok, ["abc"]))
    assert result.completion_lengths.tolist() == [3]
    assert result.finish_reasons == ["stop"]


@pytest.mark.parametrize(("temperature", "n"), [(0.0, 1), (1.0, 2)])
def test_min_new_tokens_delays_eos(temperature: float, n: int) -> None:
    engine, _, tok = make()
    params = SamplingParams(
        temperature=temperature,
        n=n,
        min_new_tokens=3,
        max_new_tokens=8,
        seed=0,
        logits_processor=EosBoost(50.0),  # EOS wins every step it is allowed
    )
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    N = len(PROMPTS) * n
    assert result.completion_lengths.tolist() == [4] * N
    assert result.completion_ids[:, 3].tolist() == [EOS] * N
    assert not result.completion_ids[:, :3].eq(EOS).any()
    assert result.finish_reasons == ["stop"] * N


def test_min_new_tokens_equal_to_max_new_tokens_never_ends_with_eos() -> None:
    engine, _, tok = make()
    params = SamplingParams(
        min_new_tokens=4, max_new_tokens=4, seed=0, logits_processor=EosBoost(50.0)
    )
    result = engine.generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.completion_lengths.tolist() == [4] * 3
    assert not result.completion_ids.eq(EOS).any()
    assert result.finish_reasons == ["length"] * 3


# --------------------------------------------------------------------------- stops


def test_stop_strings_cut_texts_and_end_masks() -> None:
    engine, _, tok = make()
    scripts = script_for(
        tok, {"abc": "mnxyzzzz", "def": "xyabcdef", "ghi": "mqqxyzzz", "jkl": "mnopmnop"}
    )
    params = SamplingParams(
        n=2,
        max_new_tokens=8,
        stop=("xy", "qq"),
        seed=0,
        logits_processor=scripts,
        return_logprobs=True,
    )
    prompts = ["abc", "def", "ghi", "jkl"]
    result = engine.generate(prompts, params)
    check_result(result, params, prompt_tokens_of(tok, prompts))
    per_prompt = [  # (tokens up to the mask end, text, finish)
        ("mnxy", "mn", "stop"),
        ("xy", "", "stop"),
        ("mqq", "m", "stop"),  # "qq" completes before "xy"
        ("mnopmnop", "mnopmnop", "length"),
    ]
    expected = [e for e in per_prompt for _ in range(2)]
    assert rows(result) == [ids(tok, toks) for toks, _, _ in expected]
    assert result.texts == [text for _, text, _ in expected]
    assert result.finish_reasons == [finish for _, _, finish in expected]
    assert result.completion_lengths.tolist() == [len(toks) for toks, _, _ in expected]


def test_stop_string_completed_first_wins() -> None:
    engine, _, tok = make()
    params = SamplingParams(
        max_new_tokens=8,
        stop=("abcd", "bc"),
        seed=0,
        logits_processor=script_for(tok, {"hello": "zabcdzzz"}),
    )
    result = engine.generate(["hello"], params)
    check_result(result, params, prompt_tokens_of(tok, ["hello"]))
    assert rows(result) == [ids(tok, "zabc")]  # "bc" completes at the 4th token
    assert result.texts == ["za"]
    assert result.finish_reasons == ["stop"]


def test_stop_strings_are_literal_text() -> None:
    engine, _, tok = make()
    params = SamplingParams(
        max_new_tokens=8,
        stop=("a+b", "(?"),
        seed=0,
        logits_processor=script_for(tok, {"hello": "zab(a+bzz"}),
    )
    result = engine.generate(["hello"], params)
    check_result(result, params, prompt_tokens_of(tok, ["hello"]))
    assert rows(result) == [ids(tok, "zab(a+b")]
    assert result.texts == ["zab("]
    assert result.finish_reasons == ["stop"]


def test_stop_string_in_the_prompt_is_ignored() -> None:
    engine, _, tok = make()
    params = SamplingParams(
        max_new_tokens=6,
        stop=("xy",),
        seed=0,
        logits_processor=script_for(tok, {"axyb": "cdefgh"}),
    )
    result = engine.generate(["axyb"], params)
    check_result(result, params, prompt_tokens_of(tok, ["axyb"]))
    assert result.texts == ["cdefgh"]
    assert result.finish_reasons == ["length"]
    assert result.completion_lengths.tolist() == [6]


def test_stop_token_ids_end_the_completion_and_eos_still_does() -> None:
    engine, _, tok = make()
    q = ids(tok, "q")[0]
    scripts = script_for(tok, {"abc": "xqrstuv", "def": [*ids(tok, "w"), EOS]})
    params = SamplingParams(
        n=2, max_new_tokens=6, stop_token_ids=(q,), seed=0, logits_processor=scripts
    )
    prompts = ["abc", "def"]
    result = engine.generate(prompts, params)
    check_result(result, params, prompt_tokens_of(tok, prompts))
    assert rows(result) == [ids(tok, "xq")] * 2 + [[*ids(tok, "w"), EOS]] * 2
    assert result.finish_reasons == ["stop"] * 4
    # a stop token id is not a stop string: the text runs up to the mask end, the id included
    assert result.texts[:2] == ["xq", "xq"]
    assert all(text_ok(t, "w", eos_at_end=True) for t in result.texts[2:]), result.texts


@pytest.mark.parametrize(
    ("stop", "n_tokens", "text"),
    [
        ("he a", 3, " answer t"),  # starts in " the", completed by " apples"
        ("ns", 1, " a"),  # inside the first token " answer"
    ],
)
def test_stop_string_across_and_inside_multichar_tokens(
    stop: str, n_tokens: int, text: str
) -> None:
    tok = bpe_tokenizer()
    model, tok = tiny(tokenizer=tok)
    words = [" answer", " the", " apples", " two", " two", " two", " two", " two"]
    script: list[int] = []
    for w in words:
        piece = ids(tok, w)
        assert len(piece) == 1, w
        script += piece
    prompt = "what is"
    params = SamplingParams(
        max_new_tokens=8,
        stop=(stop,),
        seed=0,
        logits_processor=ForceScript({tuple(ids(tok, prompt)): script}),
    )
    result = HFEngine(model, tok).generate([prompt], params)
    check_result(result, params, prompt_tokens_of(tok, [prompt]))
    assert rows(result) == [script[:n_tokens]]
    assert result.texts == [text]
    assert result.finish_reasons == ["stop"]


# --------------------------------------------------------------------------- seeding


def test_same_seed_same_completions_and_global_rng_untouched() -> None:
    engine, model, tok = make()
    params = SamplingParams(
        n=3, max_new_tokens=8, seed=11, return_logprobs=True, logit_mask=chars_only_mask(len(tok))
    )
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = engine.generate(PROMPTS, params)
    # bit-exact: RNG state bytes
    assert torch.equal(torch.get_rng_state(), state), "generate advanced the global RNG"
    check_result(first, params, prompt_tokens_of(tok, PROMPTS))

    torch.manual_seed(12345)  # the global state must not matter either
    assert_same_result(engine.generate(PROMPTS, params), first)
    assert_same_result(HFEngine(model, tok).generate(PROMPTS, params), first)


def test_different_seeds_differ() -> None:
    engine, _, tok = make()
    mask = chars_only_mask(len(tok))
    a = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, seed=1, logit_mask=mask))
    b = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, seed=2, logit_mask=mask))
    assert a.completion_ids.shape == b.completion_ids.shape
    assert not torch.equal(a.completion_ids, b.completion_ids)  # bit-exact: integer token ids


# --------------------------------------------------------------------------- chunking


CHUNK_PROMPTS = ["hello", "ab", "what is 2+3?", "xyz", "count: 1 2 3"]  # 5, 2, 12, 3, 12 tokens


def spy_generate(model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Records each generation call of the engine (one per chunk; the real one still runs),
    whether it goes through ``model.generate`` or the lean loop: prompts and ``n``."""
    calls: list[dict[str, Any]] = []
    real = HFEngine._generate_chunk

    def chunk(self: HFEngine, prompts: list[list[int]], params: SamplingParams) -> Any:
        calls.append({"prompts": len(prompts), "num_return_sequences": params.n})
        return real(self, prompts, params)

    monkeypatch.setattr(HFEngine, "_generate_chunk", chunk)
    return calls


@pytest.mark.parametrize(
    ("engine_kw", "n_calls"),
    [
        ({"prompts_per_batch": 1}, 5),
        ({"prompts_per_batch": 2}, 3),
        # (prompt_len + 8) * 1 per prompt: 13, 10 | 20 | 11 | 20
        ({"token_budget": 30}, 4),
    ],
    ids=repr,
)
@pytest.mark.parametrize("arch", ARCHS)
def test_chunking_gives_the_same_greedy_results(
    arch: str, engine_kw: dict[str, Any], n_calls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = SamplingParams.eval_preset(
        max_new_tokens=8, return_logprobs=True, logits_processor=LastTokenEosBoost(bonus=4.0)
    )
    model, tok = tiny(arch)
    calls = spy_generate(model, monkeypatch)
    whole = HFEngine(model, tok).generate(CHUNK_PROMPTS, params)
    assert len(calls) == 1
    check_result(whole, params, prompt_tokens_of(tok, CHUNK_PROMPTS))

    calls.clear()
    chunked = HFEngine(model, tok, **engine_kw).generate(CHUNK_PROMPTS, params)
    assert len(calls) == n_calls
    check_result(chunked, params, prompt_tokens_of(tok, CHUNK_PROMPTS))
    assert_same_result(chunked, whole)


def test_token_budget_counts_samples_per_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    # (4 + 4) * n=2 = 16 tokens per prompt: a budget of 40 holds 2 prompts -> 3 calls for 5
    model, tok = tiny()
    calls = spy_generate(model, monkeypatch)
    prompts = ["abcd", "efgh", "ijkl", "mnop", "qrst"]
    params = SamplingParams(n=2, max_new_tokens=4, seed=0, return_logprobs=True)
    result = HFEngine(model, tok, token_budget=40).generate(prompts, params)
    assert len(calls) == 3
    for call in calls:
        if "num_return_sequences" in call:
            assert call["num_return_sequences"] == 2
    check_result(result, params, prompt_tokens_of(tok, prompts))


@pytest.mark.parametrize("engine_kw", [{"prompts_per_batch": 2}, {"token_budget": 60}], ids=repr)
def test_chunked_sampling_keeps_prompt_major_rows(engine_kw: dict[str, Any]) -> None:
    engine, _, tok = make(**engine_kw)
    params = SamplingParams(n=3, max_new_tokens=6, seed=5, return_logprobs=True, top_p=0.9)
    state = torch.get_rng_state()
    result = engine.generate(CHUNK_PROMPTS, params)
    assert torch.equal(torch.get_rng_state(), state)  # bit-exact: RNG state bytes
    check_result(result, params, prompt_tokens_of(tok, CHUNK_PROMPTS))
    assert result.prompt_ids.shape == (15, 12)
    # chunked runs are reproducible too
    assert_same_result(engine.generate(CHUNK_PROMPTS, params), result)


# --------------------------------------------------------------------------- prompts


def test_token_id_prompts_match_string_prompts() -> None:
    engine, _, tok = make()
    params = SamplingParams.eval_preset(max_new_tokens=6, return_logprobs=True)
    from_text = engine.generate(PROMPTS, params)
    from_ids = engine.generate([ids(tok, p) for p in PROMPTS], params)
    check_result(from_ids, params, prompt_tokens_of(tok, PROMPTS))
    assert_same_result(from_ids, from_text)


def test_token_id_prompts_sampled() -> None:
    engine, _, _ = make("llama")
    prompts = [[9, 10, 11], [12], [13, 14, 15, 16, 17]]
    params = SamplingParams(n=2, max_new_tokens=5, seed=0, temperature=0.8, top_k=20)
    result = engine.generate(prompts, params)
    check_result(result, params, prompts)


@pytest.mark.parametrize(
    "prompts",
    [[], [""], ["ab", ""], [[]], [[9, 10], []]],
    ids=["none", "empty-str", "one-empty-str", "empty-ids", "one-empty-ids"],
)
def test_empty_prompts_raise(prompts: list[Any]) -> None:
    engine, _, _ = make()
    with pytest.raises(ValueError):  # noqa: PT011 - the spec fixes the type only
        engine.generate(prompts, SamplingParams(max_new_tokens=2))


def test_a_single_prompt_must_be_wrapped_in_a_list() -> None:
    engine, _, _ = make()
    params = SamplingParams(max_new_tokens=2)
    single = "`prompts` must be a list of prompts; wrap a single prompt: ['hello']"
    with pytest.raises(ValueError, match=re.escape(single)):
        engine.generate("hello", params)
    with pytest.raises(ValueError, match=re.escape("prompt's ids must be wrapped: [[9, 10, 11]]")):
        engine.generate([9, 10, 11], params)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"prompt 1 has 2\.5, which is not a token id"):
        engine.generate([[9], [10, 2.5]], params)  # type: ignore[list-item]


@pytest.mark.parametrize("where", ["vocab", "huge", "negative"])
def test_prompt_ids_outside_the_vocabulary_name_the_prompt_and_the_token(where: str) -> None:
    engine, model, _ = make()
    vocab = model.get_input_embeddings().num_embeddings
    bad = {"vocab": vocab, "huge": 10**5, "negative": -3}[where]
    message = (
        rf"prompt 1 has token id {bad} \(position 1\), outside the model's vocabulary "
        rf"\[0, {vocab}\)"
    )
    with pytest.raises(ValueError, match=message):
        engine.generate([[9, 10], [5, bad]], SamplingParams(max_new_tokens=2))


def test_the_vocabulary_is_the_input_embeddings_not_the_tokenizers() -> None:
    model, tok = tiny()
    model.resize_token_embeddings(len(tok) + 5)  # ids the model has and the tokenizer lacks
    engine = HFEngine(model, tok)
    assert engine.vocab_size == len(tok) + 5
    mask = chars_only_mask(len(tok) + 5)
    mask[len(tok) :] = False  # sample only what the tokenizer can decode
    params = SamplingParams.eval_preset(max_new_tokens=2, logit_mask=mask)
    result = engine.generate([[9, len(tok) + 4]], params)
    assert result.prompt_ids[0].tolist() == [9, len(tok) + 4]
    with pytest.raises(ValueError, match=rf"prompt 0 has token id {len(tok) + 5} "):
        engine.generate([[9, len(tok) + 5]], params)
    with pytest.raises(ValueError, match=rf"`logit_mask` has {len(tok)} entries"):
        engine.generate(
            [[9]], SamplingParams(max_new_tokens=2, logit_mask=chars_only_mask(len(tok)))
        )


@pytest.mark.parametrize("decode", ["lean", "generate"])
def test_logit_mask_and_stop_token_ids_are_checked_against_the_vocabulary(decode: str) -> None:
    engine, model, _ = make(decode=decode)
    vocab = model.get_input_embeddings().num_embeddings
    mask = torch.ones(7, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=rf"`logit_mask` has 7 entries, the model's vocabulary has {vocab}"
    ):
        engine.generate(["ab"], SamplingParams(max_new_tokens=2, logit_mask=mask))
    params = SamplingParams(max_new_tokens=2, min_new_tokens=1, stop_token_ids=(5, vocab))
    with pytest.raises(
        ValueError,
        match=rf"`stop_token_ids` has {vocab}, outside the model's vocabulary \[0, {vocab}\)",
    ):
        engine.generate(["ab"], params)


# --------------------------------------------------------------------------- truncation

LONG = "abcdefghijklmnopqr"  # 18 tokens


def test_too_long_prompt_errors_naming_both_lengths() -> None:
    engine, _, _ = make(max_model_len=20)
    params = SamplingParams.eval_preset(max_new_tokens=5)  # room for 20 - 5 = 15 prompt tokens
    with pytest.raises(ValueError, match="18") as info:
        engine.generate(["ab", LONG], params)
    msg = str(info.value)
    assert "15" in msg or "20" in msg, msg


def test_prompt_exactly_at_the_limit_is_accepted() -> None:
    engine, _, tok = make(max_model_len=20)
    params = SamplingParams.eval_preset(max_new_tokens=5)
    result = engine.generate([LONG[:15]], params)
    check_result(result, params, prompt_tokens_of(tok, [LONG[:15]]))
    with pytest.raises(ValueError, match="16"):
        engine.generate([LONG[:16]], params)


def test_max_model_len_defaults_to_max_position_embeddings() -> None:
    model, tok = tiny(max_position_embeddings=32)
    engine = HFEngine(model, tok)
    prompt = "abcdefghijklmnopqrstuvwxyz0123"  # 30 tokens > 32 - 4
    params = SamplingParams.eval_preset(max_new_tokens=4)
    with pytest.raises(ValueError, match="30") as info:
        engine.generate([prompt], params)
    msg = str(info.value)
    assert "28" in msg or "32" in msg, msg
    result = engine.generate([prompt[:28]], params)
    check_result(result, params, prompt_tokens_of(tok, [prompt[:28]]))


@pytest.mark.parametrize("bad", [0, -5])
def test_max_model_len_must_be_at_least_one(bad: int) -> None:
    model, tok = tiny()
    with pytest.raises(ValueError, match=rf"`max_model_len` must be >= 1 .*got {bad}"):
        HFEngine(model, tok, max_model_len=bad)
    with pytest.raises(ValueError, match="`max_model_len` must be an int or None"):
        HFEngine(model, tok, max_model_len=2.5)  # type: ignore[arg-type]


def test_generating_past_the_position_embeddings_warns_once_naming_both() -> None:
    model, tok = tiny(max_position_embeddings=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # building it with more room than positions is silent
        engine = HFEngine(model, tok, max_model_len=40)
        assert engine.max_model_len == 40  # a rope-scaled model may legitimately go further
        engine.generate(["hi"], SamplingParams(max_new_tokens=4, seed=0))  # within 32: silent
    both = "more than the model's max_position_embeddings = 32 (`max_model_len` = 40)"
    with pytest.warns(UserWarning, match=re.escape(both)):
        engine.generate(["hi"], SamplingParams(max_new_tokens=36, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per engine
        engine.generate(["hi"], SamplingParams(max_new_tokens=36, seed=0))


def test_left_truncation_keeps_the_tail() -> None:
    model, tok = tiny()
    params = SamplingParams.eval_preset(
        max_new_tokens=5, logit_mask=chars_only_mask(len(tok)), return_logprobs=True
    )
    truncated = HFEngine(model, tok, max_model_len=20, truncation="left").generate(
        [LONG, "hi"], params
    )
    tail = LONG[-15:]
    check_result(truncated, params, prompt_tokens_of(tok, [tail, "hi"]))
    assert truncated.prompt_ids[0].tolist() == ids(tok, tail)
    reference = HFEngine(model, tok, max_model_len=20).generate([tail, "hi"], params)
    assert_same_result(truncated, reference)


def test_unknown_truncation_mode_raises() -> None:
    model, tok = tiny()

    def build_and_generate() -> None:  # the spec does not say whether init or generate raises
        engine = HFEngine(model, tok, truncation="right")  # type: ignore[arg-type]
        engine.generate(["ab"], SamplingParams(max_new_tokens=2))

    with pytest.raises(ValueError, match="truncation"):
        build_and_generate()


def test_generate_kwargs_reach_generate_and_sampling_ones_are_refused() -> None:
    """``generate_kwargs`` (e.g. ZeRO-3's ``synced_gpus``) pass through to ``generate``."""
    engine, model, _ = make("qwen2")
    seen: dict[str, Any] = {}
    original = model.generate

    def spy(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return original(**kwargs)

    model.generate = spy  # a spy on the real call, which still runs
    engine.generate_kwargs = {"output_scores": False}
    params = SamplingParams(n=2, max_new_tokens=3, seed=0)
    assert engine.generate(PROMPTS, params).completion_ids.shape[0] == 6
    assert seen["output_scores"] is False
    engine.generate_kwargs = {"top_p": 0.5}
    with pytest.raises(ValueError, match=r"generate_kwargs.*top_p.*SamplingParams"):
        engine.generate(PROMPTS, params)


def test_greedy_generation_does_not_warn_about_sampling_flags(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, _, _ = make("qwen2")
    with caplog.at_level("WARNING"):
        engine.generate(PROMPTS, SamplingParams.eval_preset(max_new_tokens=3))
    assert "not valid" not in caplog.text


def test_seeded_generate_leaves_other_generators_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SamplingParams.seed`` seeds the CPU generator (and the model's CUDA device's), which
    ``fork_rng`` restores, and no other: ``torch.manual_seed`` would reseed every CUDA device."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    engine, _, _ = make()
    params = SamplingParams(n=2, max_new_tokens=4, seed=0)
    before = torch.random.get_rng_state()
    first = engine.generate(PROMPTS, params)
    assert calls == []
    # bit-exact: the caller's CPU generator is restored exactly
    assert torch.equal(torch.random.get_rng_state(), before)
    assert_same_result(engine.generate(PROMPTS, params), first)  # the seed still repeats
