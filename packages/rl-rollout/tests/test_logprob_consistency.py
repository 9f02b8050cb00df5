"""The key contract: the trainer's teacher-forced recomputation reproduces ``result.logprobs``.

The trainer runs one forward on ``sequences`` with ``attention_mask`` (position ids from the mask,
as ``generate`` numbers left-padded prompts), takes the logits at positions ``P - 1 .. P + T - 2``,
processes each with ``process_logits`` given the unpadded prefix (prompt without its left padding
+ the completion so far), log-softmaxes and gathers at ``completion_ids``. In float32 that equals
``result.logprobs`` to float32 rounding (``rollout_testlib.assert_logprobs_close``) wherever ``completion_mask`` is True, for every setting of the
processing pipeline. Prompts have different lengths (left padding) and n > 1.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rl_rollout import HFEngine, SamplingParams
from rollout_testlib import (
    ARCHS,
    LastTokenEosBoost,
    assert_logprobs_close,
    check_result,
    prompt_tokens_of,
    recompute,
    tiny,
)

PROMPTS = ["hello", "ab", "what is 2+3?"]  # 5, 2, 12 tokens


def _mask_without(vocab: int, *banned: int) -> torch.Tensor:
    mask = torch.ones(vocab, dtype=torch.bool)
    mask[list(banned)] = False
    return mask


CASES: dict[str, dict[str, Any]] = {
    "t1": {"temperature": 1.0},
    "t0.7": {"temperature": 0.7},
    "t1-topk": {"temperature": 1.0, "top_k": 10},
    "t0.7-topk": {"temperature": 0.7, "top_k": 10},
    "t1-topp": {"temperature": 1.0, "top_p": 0.9},
    "t0.7-topp": {"temperature": 0.7, "top_p": 0.8},
    "t0.7-topk-topp-minp": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.02},
    # the penalty reads the prefix: prompt padding must not count as a present token
    "t1-reppen-mask": {
        "temperature": 1.0,
        "repetition_penalty": 1.3,
        "logit_mask": _mask_without(59, 1, 3, 4, 5, 6, 7),
    },
    # EOS steered by the last token: some rows end early
    "t0.9-processor": {"temperature": 0.9, "logits_processor": LastTokenEosBoost(bonus=3.0)},
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(CASES))
def test_teacher_forced_recomputation_matches_sampling_logprobs(arch: str, case: str) -> None:
    model, tok = tiny(arch, seed=1)
    assert len(tok) == 59
    params = SamplingParams(n=3, max_new_tokens=10, seed=7, return_logprobs=True, **CASES[case])
    result = HFEngine(model, tok).generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.logprobs is not None

    expected, _ = recompute(model, result, params)
    mask = result.completion_mask
    assert_logprobs_close(result.logprobs[mask], expected[mask])
    assert result.logprobs[~mask].eq(0).all()


def test_steered_case_ends_some_rows_early() -> None:
    """Guards the "t0.9-processor" case: it must cover rows ended by EOS."""
    model, tok = tiny("qwen2", seed=1)
    params = SamplingParams(
        n=3, max_new_tokens=10, seed=7, return_logprobs=True, **CASES["t0.9-processor"]
    )
    result = HFEngine(model, tok).generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.logprobs is not None
    expected, _ = recompute(model, result, params)
    mask = result.completion_mask
    assert_logprobs_close(result.logprobs[mask], expected[mask])
    assert "stop" in result.finish_reasons


def test_recomputation_with_chunked_generation() -> None:
    model, tok = tiny("llama", seed=2)
    params = SamplingParams(
        n=2, max_new_tokens=8, seed=3, return_logprobs=True, temperature=0.7, top_p=0.9
    )
    result = HFEngine(model, tok, prompts_per_batch=2).generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.logprobs is not None
    expected, _ = recompute(model, result, params)
    mask = result.completion_mask
    assert_logprobs_close(result.logprobs[mask], expected[mask])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "overrides",
    [{}, {"top_k": 5}, {"repetition_penalty": 1.5}],
    ids=["plain", "topk", "reppen"],
)
def test_greedy_picks_the_argmax_and_reports_its_logprob(
    arch: str, overrides: dict[str, Any]
) -> None:
    model, tok = tiny(arch, seed=1)
    params = SamplingParams.eval_preset(max_new_tokens=10, return_logprobs=True, **overrides)
    assert params.temperature == 0.0
    result = HFEngine(model, tok).generate(PROMPTS, params)
    check_result(result, params, prompt_tokens_of(tok, PROMPTS))
    assert result.logprobs is not None
    expected, argmax = recompute(model, result, params)
    mask = result.completion_mask
    assert torch.equal(result.completion_ids[mask], argmax[mask])  # bit-exact: integer token ids
    assert_logprobs_close(result.logprobs[mask], expected[mask])
