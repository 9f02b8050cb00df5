"""Tiny real models, scripted logits processors, result invariants and the trainer-side log-prob
recomputation shared by the rl-rollout tests.

Everything is built locally with :mod:`rl_testing.models` (nothing is downloaded, nothing is
mocked). The char tokenizer has ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3 and the
role markers 4-7; every other id is one character, so ``len(encode(text)) == len(text)``.

A random model rarely emits EOS on its own, so the tests steer it with ``logits_processor``
callables (part of :class:`rl_rollout.SamplingParams`):

* :class:`ForceScript` forces a scripted token at each completion step, per prompt. It finds the
  prompt in the row it is given (left padding allowed, or none at all when the engine strips it),
  so it works whatever the batching or chunking.
* :class:`EosBoost` adds a constant to the EOS logit (additive, so an EOS already at ``-inf``,
  e.g. under ``min_new_tokens``, stays there).
* :class:`LastTokenEosBoost` boosts EOS depending only on the row's last token: the same value
  for a padded batch row and for the unpadded prefix the trainer passes, so the log-prob
  consistency check stays exact while some rows end early.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from rl_rollout import RolloutResult, SamplingParams, process_logits
from rl_testing.models import tiny_causal_lm
from rl_testing.tolerance import assert_close
from transformers import PreTrainedModel, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = 0, 1, 2, 3
N_SPECIAL = 8  # ids 0-7: pad, bos, eos, unk and the four role markers
ARCHS = ("qwen2", "llama")
NEG_INF = float("-inf")
# Log-probs of two routes (incremental KV-cache decoding against one teacher-forced forward,
# chunked against whole batches, vLLM against PyTorch) agree to float32 rounding
# (rl_testing.tolerance): the tiny models' longest sum is the MLP's intermediate size 128, and
# the chain from the weights to a log-prob is 2 decoder layers and the head with its log-softmax.
REDUCTION = 128
LOGPROB_STAGES = 3


def assert_logprobs_close(
    actual: torch.Tensor, expected: torch.Tensor, msg: str = "log-probs"
) -> None:
    """Two routes' float32 log-probs agree to rounding, at the scale of the log-probs."""
    assert_close(actual, expected, reduction=REDUCTION, stages=LOGPROB_STAGES, msg=msg)


# --------------------------------------------------------------------------- models and tokens


def tiny(
    arch: str = "qwen2",
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
    **overrides: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny random-weight causal LM and its tokenizer (the char tokenizer by default)."""
    model, tok = tiny_causal_lm(arch, tokenizer, seed=seed, **overrides)  # type: ignore[call-overload]
    return model, tok


def ids(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    """Token ids of ``text`` without any added special token."""
    return list(tok.encode(text, add_special_tokens=False))


def chars_only_mask(vocab_size: int) -> torch.Tensor:
    """A ``[V]`` bool logit mask allowing every non-special token (so EOS never comes)."""
    mask = torch.ones(vocab_size, dtype=torch.bool)
    mask[:N_SPECIAL] = False
    return mask


def make_pad_eos(model: PreTrainedModel, tok: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A tokenizer copy whose pad token is the EOS token; the model's configs are set to match."""
    tok2 = copy.deepcopy(tok)
    tok2.pad_token = tok2.eos_token
    assert tok2.pad_token_id == EOS
    assert tok.pad_token_id == PAD
    model.config.pad_token_id = EOS
    if model.generation_config is not None:
        model.generation_config.pad_token_id = EOS
    return tok2


# --------------------------------------------------------------------------- logits processors


class ForceScript:
    """Forces ``scripts[prompt][step]`` at completion step ``step`` (everything else ``-inf``).

    ``scripts`` maps a prompt (token ids) to the tokens to force; steps past the end of a script,
    and rows whose prompt is not found, are left untouched. The prompt is located in each row as
    the first occurrence preceded only by pad tokens, so left-padded batches and unpadded prefixes
    both work (no prompt may start with the pad id).
    """

    def __init__(self, scripts: Mapping[Sequence[int], Sequence[int]], pad_id: int = PAD) -> None:
        self.scripts = {tuple(k): list(v) for k, v in scripts.items()}
        self.pad_id = pad_id
        for key in self.scripts:
            assert key, "empty prompt"
            assert key[0] != pad_id, "a scripted prompt may not start with the pad id"

    def _locate(self, row: list[int]) -> tuple[list[int], int] | None:
        for key, script in self.scripts.items():
            n = len(key)
            p = 0
            while p + n <= len(row):
                if tuple(row[p : p + n]) == key:
                    return script, len(row) - (p + n)
                if row[p] != self.pad_id:
                    break
                p += 1
        return None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for b in range(input_ids.shape[0]):
            found = self._locate(input_ids[b].tolist())
            if found is None:
                continue
            script, step = found
            if step < len(script):
                out[b] = NEG_INF
                out[b, script[step]] = 0.0
        return out


class EosBoost:
    """Adds ``bonus`` to the EOS logit of every row at every step."""

    def __init__(self, bonus: float = 50.0, eos_id: int = EOS) -> None:
        self.bonus = bonus
        self.eos_id = eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        out[:, self.eos_id] = out[:, self.eos_id] + self.bonus
        return out


class LastTokenEosBoost:
    """Adds ``bonus`` to the EOS logit of rows whose last token id is ``0 (mod modulus)``.

    Depends only on the last token, so a left-padded batch row and the trainer's unpadded prefix
    give identical processed logits.
    """

    def __init__(self, bonus: float = 4.0, modulus: int = 3, eos_id: int = EOS) -> None:
        self.bonus = bonus
        self.modulus = modulus
        self.eos_id = eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        hit = (input_ids[:, -1] % self.modulus) == 0
        out[hit, self.eos_id] = out[hit, self.eos_id] + self.bonus
        return out


# --------------------------------------------------------------------------- result invariants


def prompt_tokens_of(
    tok: PreTrainedTokenizerFast, prompts: Sequence[str | Sequence[int]]
) -> list[list[int]]:
    return [ids(tok, p) if isinstance(p, str) else list(p) for p in prompts]


def check_result(
    result: RolloutResult,
    params: SamplingParams,
    prompt_tokens: Sequence[Sequence[int]],
    *,
    pad_id: int = PAD,
    eos_id: int = EOS,
) -> None:
    """Asserts every structural promise of the spec that holds for any completion."""
    assert isinstance(result, RolloutResult)
    n = params.n
    n_prompts = len(prompt_tokens)
    N = n_prompts * n
    lens = [len(p) for p in prompt_tokens]
    P = max(lens)

    # prompts: left-padded with the pad id, prompt-major rows
    assert result.prompt_ids.shape == (N, P)
    assert result.prompt_mask.shape == (N, P)
    assert result.prompt_mask.dtype == torch.bool
    for r in range(N):
        toks = list(prompt_tokens[r // n])
        L = len(toks)
        assert result.prompt_ids[r, P - L :].tolist() == toks, f"row {r}: prompt tokens"
        assert result.prompt_ids[r, : P - L].eq(pad_id).all(), f"row {r}: left padding"
        assert result.prompt_mask[r].tolist() == [False] * (P - L) + [True] * L, f"row {r}"

    # group index
    assert result.group_index.dtype == torch.long
    assert result.group_index.tolist() == [r // n for r in range(N)]

    # completions
    T = result.completion_ids.shape[1]
    assert result.completion_ids.shape == (N, T)
    assert result.completion_mask.shape == (N, T)
    assert result.completion_mask.dtype == torch.bool
    assert 1 <= T <= params.max_new_tokens
    lengths = result.completion_mask.sum(1)
    assert result.completion_lengths.tolist() == lengths.tolist()
    for r in range(N):
        L = int(lengths[r])
        assert L >= 1, f"row {r}: no generated token"
        assert result.completion_mask[r].tolist() == [True] * L + [False] * (T - L), (
            f"row {r}: completion mask is not a prefix"
        )
        assert result.completion_ids[r, L:].eq(pad_id).all(), f"row {r}: right padding"
        # min_new_tokens: no EOS among the first min_new_tokens generated tokens
        head = result.completion_ids[r, : min(L, params.min_new_tokens)]
        assert not head.eq(eos_id).any(), f"row {r}: EOS before min_new_tokens"

    # concatenations
    # bit-exact: integer token ids
    assert torch.equal(
        result.sequences, torch.cat([result.prompt_ids, result.completion_ids], dim=1)
    )
    # bit-exact: bool masks
    assert torch.equal(
        result.attention_mask.bool(), torch.cat([result.prompt_mask, result.completion_mask], 1)
    )
    assert result.attention_mask.shape == (N, P + T)

    # finish reasons
    assert isinstance(result.finish_reasons, list)
    assert len(result.finish_reasons) == N
    stop_ids = {eos_id, *params.stop_token_ids}
    for r in range(N):
        L = int(lengths[r])
        reason = result.finish_reasons[r]
        assert reason in {"stop", "length"}, reason
        if reason == "length":
            assert params.max_new_tokens == L, f"row {r}: 'length' but {L} tokens"
        toks = result.completion_ids[r, :L].tolist()
        # the mask ends at the FIRST stop id
        assert not any(t in stop_ids for t in toks[:-1]), f"row {r}: stop id inside the mask"
        if not params.stop:  # without stop strings, "stop" <=> the last token is a stop id
            assert (reason == "stop") == (toks[-1] in stop_ids), f"row {r}: {reason} {toks}"

    # texts
    assert isinstance(result.texts, list)
    assert len(result.texts) == N
    assert all(isinstance(t, str) for t in result.texts)

    # log-probs
    if params.return_logprobs:
        assert result.logprobs is not None
        assert result.logprobs.shape == (N, T)
        assert result.logprobs.is_floating_point()
        assert result.logprobs[~result.completion_mask].eq(0).all()
        inside = result.logprobs[result.completion_mask]
        assert torch.isfinite(inside).all()
        assert (inside <= 1e-6).all()
    else:
        assert result.logprobs is None


def text_ok(text: str, chars: str, *, eos_at_end: bool) -> bool:
    """``text`` is ``chars``, possibly followed by ``<eos>`` when the mask ends at an EOS (whether
    special tokens are decoded is not fixed by the spec)."""
    return text == chars or (eos_at_end and text == chars + "<eos>")


# --------------------------------------------------------------------------- trainer side


@torch.no_grad()
def teacher_forced_logits(model: PreTrainedModel, result: RolloutResult) -> torch.Tensor:
    """Logits ``[N, P + T, V]`` of one forward on ``sequences`` with ``attention_mask``.

    Position ids follow the attention mask (``cumsum - 1``), as ``generate`` does for left-padded
    prompts; a plain forward would number the pad positions too.
    """
    am = result.attention_mask.long()
    pos = (am.cumsum(-1) - 1).masked_fill(am == 0, 0)
    out = model(input_ids=result.sequences, attention_mask=am, position_ids=pos)
    logits: torch.Tensor = out.logits.float()
    return logits


@torch.no_grad()
def recompute(
    model: PreTrainedModel, result: RolloutResult, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's view: ``(logprobs [N, T], argmax [N, T])`` of the processed distribution.

    For completion position ``j`` of row ``r`` the logits at sequence position ``P - 1 + j`` are
    processed with :func:`rl_rollout.process_logits` given the prefix ``prompt (unpadded) +
    completion[:j]``, then log-softmaxed and gathered at the completion token. Positions outside
    the completion mask are 0 (logprobs) and -1 (argmax).
    """
    logits = teacher_forced_logits(model, result)
    N, P = result.prompt_ids.shape
    T = result.completion_ids.shape[1]
    logprobs = torch.zeros(N, T, dtype=torch.float32)
    argmax = torch.full((N, T), -1, dtype=torch.long)
    for r in range(N):
        prompt = result.prompt_ids[r][result.prompt_mask[r]]
        for j in range(int(result.completion_lengths[r])):
            prefix = torch.cat([prompt, result.completion_ids[r, :j]])[None]
            row = logits[r, P - 1 + j][None].clone()
            processed = process_logits(row, prefix, params)
            assert processed.shape == row.shape
            tok_id = int(result.completion_ids[r, j])
            logprobs[r, j] = torch.log_softmax(processed.float(), dim=-1)[0, tok_id]
            argmax[r, j] = int(processed[0].argmax())
    return logprobs, argmax
