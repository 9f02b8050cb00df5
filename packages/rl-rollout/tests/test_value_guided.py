"""Value-guided decoding (ILQL): the score formula, the hidden-state capture, and HFEngine runs that
match a step-by-step teacher-forced reimplementation."""

from __future__ import annotations

import pytest
import torch
from rl_rollout import (
    HFEngine,
    HiddenStateCapture,
    SamplingParams,
    ValueGuidedProcessor,
    value_guided_decoding,
    value_guided_logits,
)
from rl_testing.tolerance import assert_close
from rollout_testlib import NEG_INF, ids, tiny
from torch import nn

PROMPTS = ["12+3", "ab"]


class LinearHeads(nn.Module):
    """A Q head (H -> V) and a V head (H -> 1) on the hidden state, seeded."""

    def __init__(self, hidden: int, vocab: int, seed: int = 0, favour: int | None = None) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.q = nn.Linear(hidden, vocab)
            self.v = nn.Linear(hidden, 1)
        if favour is not None:  # Q strongly prefers one token
            with torch.no_grad():
                self.q.bias[favour] += 100.0

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q(h), self.v(h).squeeze(-1)


def test_formula_masking_and_beta_zero() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, generator=g)
    logits[1, 2] = NEG_INF
    q = torch.randn(3, 6, generator=g)
    v = torch.randn(3, generator=g)
    got = value_guided_logits(logits, q, v, beta=2.0)
    expected = torch.log_softmax(logits, -1) + 2.0 * (q - v[:, None])
    # bit-exact: value_guided_logits runs these very ops (log_softmax, + beta * (q - v))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert got[1, 2] == NEG_INF
    torch.testing.assert_close(value_guided_logits(logits, q, v[:, None], beta=2.0), expected)
    torch.testing.assert_close(value_guided_logits(logits, q, v, beta=0.0), logits.log_softmax(-1))
    # V shifts a row uniformly: the distribution does not depend on it
    other = value_guided_logits(logits, q, v + 5.0, beta=2.0)
    torch.testing.assert_close(other.softmax(-1), got.softmax(-1))


def test_formula_errors() -> None:
    logits, q, v = torch.zeros(2, 5), torch.zeros(2, 5), torch.zeros(2)
    with pytest.raises(ValueError, match=r"`q` has shape \[2, 4\] but `logits` has shape \[2, 5\]"):
        value_guided_logits(logits, q[:, :4], v)
    with pytest.raises(ValueError, match=r"`v` must have shape \[B\] = \[2\]"):
        value_guided_logits(logits, q, torch.zeros(3))
    with pytest.raises(ValueError, match="`beta` must be >= 0"):
        value_guided_logits(logits, q, v, beta=-1.0)
    with pytest.raises(ValueError, match=r"`logits` must have shape \[B, V\]"):
        value_guided_logits(logits[0], q, v)


def manual_greedy(
    model, heads: LinearHeads, prompt: list[int], beta: float, steps: int
) -> list[int]:  # type: ignore[no-untyped-def]
    """Teacher-forced reimplementation: one full forward per step, no cache, no padding."""
    seq = list(prompt)
    out = []
    for _ in range(steps):
        x = torch.tensor([seq])
        with torch.no_grad():
            hidden = model.model(input_ids=x).last_hidden_state[:, -1]
            logits = model.lm_head(hidden)
            q, v = heads(hidden)
        scores = torch.log_softmax(logits, -1) + beta * (q - v[:, None])
        token = int(scores.argmax(-1))
        out.append(token)
        seq.append(token)
        if token == 2:  # EOS
            break
    return out


@pytest.mark.parametrize("beta", [0.0, 0.7, 3.0])
def test_hf_engine_greedy_matches_teacher_forced_loop(beta: float) -> None:
    model, tok = tiny("qwen2", seed=1)
    heads = LinearHeads(64, len(tok), seed=2)
    engine = HFEngine(model, tok, max_model_len=64)
    with value_guided_decoding(model, heads, beta=beta) as hook:
        params = SamplingParams(temperature=0.0, max_new_tokens=6, logits_processor=hook)
        result = engine.generate(PROMPTS, params)
    for i, prompt in enumerate(PROMPTS):
        got = [t for t, m in zip(result.completion_ids[i].tolist(),
                                 result.completion_mask[i].tolist(), strict=True) if m]  # fmt: skip
        assert got == manual_greedy(model, heads, ids(tok, prompt), beta, 6), (beta, prompt)
    # the hook is removed afterwards: plain greedy generation is pi_beta's (beta = 0) again
    assert not model.get_output_embeddings()._forward_pre_hooks
    plain = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=6))
    for i, prompt in enumerate(PROMPTS):
        got = [t for t, m in zip(plain.completion_ids[i].tolist(),
                                 plain.completion_mask[i].tolist(), strict=True) if m]  # fmt: skip
        assert got == manual_greedy(model, heads, ids(tok, prompt), 0.0, 6)


def test_guidance_changes_the_output_and_top_k_sampling() -> None:
    model, tok = tiny("qwen2", seed=1)
    favoured = ids(tok, "z")[0]
    heads = LinearHeads(64, len(tok), seed=2, favour=favoured)
    engine = HFEngine(model, tok, max_model_len=64)
    plain = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=4))
    assert not all(t == favoured for c in plain.completion_ids for t in c.tolist())
    with value_guided_decoding(model, heads, beta=1.0) as hook:
        greedy = engine.generate(
            PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=4, logits_processor=hook)
        )
        # top_k = 1 sampling is greedy; the recorded log-prob of the only allowed token is 0
        sampled = engine.generate(
            PROMPTS,
            SamplingParams(temperature=0.8, top_k=1, max_new_tokens=4, seed=3, n=2,
                           logits_processor=hook, return_logprobs=True),
        )  # fmt: skip
    assert all(t == favoured for c in greedy.completion_ids for t in c.tolist())
    assert all(t == favoured for c in sampled.completion_ids for t in c.tolist())
    assert sampled.logprobs is not None
    torch.testing.assert_close(sampled.logprobs, torch.zeros_like(sampled.logprobs))


def test_sampling_logprobs_are_those_of_the_guided_distribution() -> None:
    model, tok = tiny("qwen2", seed=4)
    heads = LinearHeads(64, len(tok), seed=5)
    engine = HFEngine(model, tok, max_model_len=64)
    with value_guided_decoding(model, heads, beta=1.5) as hook:
        params = SamplingParams(temperature=0.7, top_k=5, max_new_tokens=3, seed=0,
                                logits_processor=hook, return_logprobs=True)  # fmt: skip
        result = engine.generate(["7"], params)
    prompt = ids(tok, "7")
    seq = list(prompt)
    assert result.logprobs is not None
    for step, token in enumerate(result.completion_ids[0].tolist()):
        if not result.completion_mask[0, step]:
            break
        with torch.no_grad():
            hidden = model.model(input_ids=torch.tensor([seq])).last_hidden_state[:, -1]
            q, v = heads(hidden)
            scores = value_guided_logits(model.lm_head(hidden), q, v, 1.5) / 0.7
        kth = scores.topk(5, -1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, NEG_INF)
        expected = torch.log_softmax(scores, -1)[0, token]
        top = float(scores.topk(5, -1).values.abs().max())  # the size of the summed scores
        scale = max(top, float(expected.abs()))
        # The engine's cached decode against one full forward: 2 layers, the heads (their
        # longest sum the intermediate size 128) and the log-softmax.
        assert_close(result.logprobs[0, step], expected, reduction=128, stages=4, scale=scale)
        seq.append(token)


def test_capture_errors() -> None:
    model, tok = tiny("qwen2", seed=1)
    heads = LinearHeads(64, len(tok))
    with HiddenStateCapture(model) as capture:
        hook = ValueGuidedProcessor(heads, capture)
        with pytest.raises(RuntimeError, match="no hidden state was captured"):
            hook(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, len(tok)))
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6]]))
        assert capture.last is not None and capture.last.shape == (1, 64)
        with pytest.raises(
            RuntimeError, match="captured hidden states have 1 rows but the scores have 2"
        ):
            hook(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, len(tok)))
    with pytest.raises(ValueError, match="no output embedding layer"):
        HiddenStateCapture(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="`beta` must be >= 0"):
        ValueGuidedProcessor(heads, capture, beta=-0.5)


def test_capture_reads_each_rows_last_real_state_under_left_padding() -> None:
    """With left padding, position -1 is every row's last real token: the captured state of a
    padded batch equals each prompt's own, run alone (a right-padding index would differ)."""
    model, tok = tiny("qwen2")
    rows = [ids(tok, p) for p in ("12+3", "ab", "7")]
    width = max(len(r) for r in rows)
    batch = torch.full((len(rows), width), int(tok.pad_token_id))
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        batch[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), HiddenStateCapture(model) as capture:
        model(input_ids=batch, attention_mask=mask, position_ids=positions)
        padded = capture.last
        alone = []
        for r in rows:
            model(input_ids=torch.tensor([r]))
            alone.append(capture.last[0])
    assert padded is not None and padded.shape == (len(rows), model.config.hidden_size)
    # left-padded batch against each row alone: 2 layers and the final norm, in another layout
    assert_close(padded, torch.stack(alone), reduction=128, stages=3, msg="captured state")
    assert not torch.allclose(alone[0], alone[1])  # the rows' states really differ
