"""``sample``: ancestral sampling with the log-probs of the distribution sampled from.

Each step's logits are divided by the temperature, cut to the ``top_k`` most likely tokens and
to the smallest set of probability ``top_p`` (the order ``rl_rollout.process_logits`` applies),
and a token is drawn from the renormalised distribution. The reported log-prob of each sampled
token is its log-probability under that same processed distribution, recomputed by one forward
of the whole sequence after sampling (prompt + completion), so it equals what the training
client's ``forward`` gives for those tokens at temperature 1 up to float32 rounding. A
``seed`` makes the draw reproducible (a ``torch.Generator`` of its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl_train.tinker.futures import UserError
from rl_train.tinker.wire import SampledTokens

__all__ = ["process", "sample"]


def process(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """[..., V] log-probs after temperature, top-k and top-p (cut tokens at -inf)."""
    scaled = logits.float() / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    logprobs = torch.log_softmax(scaled, dim=-1)
    if top_p < 1.0:
        probs, order = torch.sort(logprobs.exp(), dim=-1, descending=True)
        before = probs.cumsum(-1) - probs  # mass strictly above each token
        cut = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logprobs = torch.log_softmax(logprobs.masked_fill(cut, float("-inf")), dim=-1)
    return logprobs


def _stop_set(stop: Any, eos: Any) -> tuple[set[int], list[str]]:
    if stop is None:
        ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        return {int(i) for i in ids}, []
    if isinstance(stop, str):
        return set(), [stop]
    items = list(stop)
    if all(isinstance(s, int) for s in items):
        return {int(s) for s in items}, []
    if all(isinstance(s, str) for s in items):
        return set(), [str(s) for s in items]
    raise UserError("sampling_params.stop must be a string, a list of strings or of token ids")


def _max_new_tokens(prompt: Sequence[int], max_tokens: Any, max_context_length: int) -> int:
    """How many tokens to sample: ``max_tokens``, or up to the context length when None."""
    room = max_context_length - len(prompt)
    max_new = room if max_tokens is None else int(max_tokens)
    if not prompt:
        raise UserError("the prompt is empty")
    if max_tokens is not None and max_new < 1:
        raise UserError(
            f"`max_tokens` must be >= 1, got {max_new}; pass None to sample up to the context "
            f"length ({max_context_length} tokens with the prompt)"
        )
    if room < 1:
        raise UserError(
            f"the prompt ({len(prompt)} tokens) leaves no room to sample within the context "
            f"length {max_context_length} of this server's model; shorten the prompt"
        )
    if max_new > room:
        raise UserError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_new}) exceeds the context length "
            f"{max_context_length} of this server's model; shorten the prompt or lower max_tokens"
        )
    return max_new


def sample(
    model: Any,
    prompt: Sequence[int],
    params: Mapping[str, Any],
    num_samples: int,
    *,
    max_context_length: int,
    eos_token_id: Any,
    tokenizer: Any = None,
) -> list[SampledTokens]:
    """``num_samples`` completions of ``prompt`` with their sampling log-probs."""
    temperature = float(params.get("temperature", 1.0))
    top_k = int(params.get("top_k", -1))
    top_p = float(params.get("top_p", 1.0))
    if not temperature > 0:
        raise UserError(f"sampling_params.temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise UserError(f"sampling_params.top_p must be in (0, 1], got {top_p}")
    if top_k < -1:
        raise UserError(f"`top_k` must be >= 1, or -1 (or 0) for no limit, got {top_k}")
    if num_samples < 1:
        raise UserError(f"num_samples must be >= 1, got {num_samples}")
    max_new = _max_new_tokens(prompt, params.get("max_tokens"), max_context_length)
    stop_ids, stop_strings = _stop_set(params.get("stop"), eos_token_id)
    if stop_strings and tokenizer is None:
        raise UserError("stop strings need the server's tokenizer (--tokenizer)")
    seed = params.get("seed")
    generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    out: list[SampledTokens] = []
    with torch.no_grad():
        for _ in range(num_samples):
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            cache = None
            step_ids = ids
            new: list[int] = []
            reason = "length"
            for _ in range(max_new):
                result = model(input_ids=step_ids, past_key_values=cache, use_cache=True)
                cache = result.past_key_values
                logprobs = process(result.logits[0, -1], temperature, top_k, top_p)
                token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
                new.append(token)
                step_ids = torch.tensor([[token]], dtype=torch.long)
                if token in stop_ids:
                    reason = "stop"
                    break
                if stop_strings:
                    text = tokenizer.decode(new)
                    if any(s in text for s in stop_strings):
                        reason = "stop"
                        break
            full = torch.tensor([list(prompt) + new], dtype=torch.long)
            logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1]
            scored = process(logits, temperature, top_k, top_p)
            chosen = scored.gather(-1, torch.tensor(new)[:, None])[:, 0]
            out.append(SampledTokens(torch.tensor(new), chosen, reason))
    return out


def prompt_logprobs(model: Any, prompt: Sequence[int]) -> torch.Tensor:
    """[P] log-probs of each prompt token after its prefix (NaN for the first)."""
    with torch.no_grad():
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        picked = logprobs[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    return torch.cat([torch.tensor([float("nan")]), picked.float()])
