"""The rollout result: everything a trainer needs about a batch of completions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["RolloutResult", "assemble_result", "first_stop"]


@dataclass
class RolloutResult:
    """Completions for ``B`` prompts x ``n`` samples, rows prompt-major (``N = B * n``)."""

    prompt_ids: torch.Tensor
    """[N, P] prompt tokens, left-padded with the pad id."""
    prompt_mask: torch.Tensor
    """[N, P] bool, True on real prompt tokens."""
    completion_ids: torch.Tensor
    """[N, T] generated tokens, right-padded with the pad id."""
    completion_mask: torch.Tensor
    """[N, T] bool, True up to and including the first EOS / stop id / stop-string token."""
    finish_reasons: list[str]
    """Per row: ``"stop"`` (EOS, stop id or stop string) or ``"length"``."""
    group_index: torch.Tensor
    """[N] long, the prompt each row belongs to (``row // n``)."""
    texts: list[str]
    """Decoded completions up to the mask end, stop strings cut off."""
    logprobs: torch.Tensor | None = None
    """[N, T] sampling log-probs under the processed distribution (0 where masked), or None."""
    weight_version: int | None = None
    """The version of the adapter the engine sampled with (``Engine.load_adapter``), or None
    when it samples with no version-tagged weights."""
    routes: torch.Tensor | None = None
    """[N, P + T, Y, k] int16: the experts a mixture-of-experts model routed each token of
    :attr:`sequences` to in each of its ``Y`` MoE layers while sampling (``HFEngine(
    record_routes=True)``, :mod:`rl_rollout.routes`); -1 where no forward ran it (padding,
    the last generated token); None unless recorded."""

    @property
    def sequences(self) -> torch.Tensor:
        """[N, P + T] prompt and completion tokens."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P + T] bool mask of real tokens (prompt padding and post-EOS tokens are False)."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] number of generated tokens that count."""
        return self.completion_mask.sum(dim=1)

    @property
    def prompt_lengths(self) -> torch.Tensor:
        """[N] real prompt lengths."""
        return self.prompt_mask.sum(dim=1)


def first_stop(
    tokens: Sequence[int],
    stop_ids: set[int],
    stop: Sequence[str],
    decode: Callable[[list[int]], str],
) -> int | None:
    """Index of the token that ends a completion, or None when nothing ended it.

    The end is the first EOS / stop token id, or the token that completes a stop string
    (the earliest of the two).
    """
    end = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
    if stop:
        limit = len(tokens) if end is None else end
        for i in range(limit):
            text = decode(list(tokens[: i + 1]))
            if any(s in text for s in stop):
                return i
    return end


def assemble_result(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    n: int,
    *,
    pad_id: int,
    stop_ids: set[int],
    stop: Sequence[str],
    decode: Callable[[list[int]], str],
    logprobs: Sequence[Sequence[float]] | None = None,
    logprob_dtype: torch.dtype = torch.float32,
) -> RolloutResult:
    """Build a :class:`RolloutResult` from per-row token lists (what every engine produces).

    Args:
        prompts: ``B`` prompts' token ids.
        completions: ``N = B * n`` generated token lists, prompt-major, as the engine
            returned them; tokens after the end stay but are masked out.
        n: Samples per prompt.
        pad_id: Padding id for the left-padded prompts and right-padded completions.
        stop_ids: EOS and stop token ids.
        stop: Stop strings.
        decode: Token ids -> text (special tokens skipped).
        logprobs: Optional ``N`` lists of sampling log-probs aligned with ``completions``.
        logprob_dtype: dtype of the returned log-probs.
    """
    if len(completions) != len(prompts) * n:
        raise ValueError(
            f"`completions` has {len(completions)} rows, expected len(prompts) * n = "
            f"{len(prompts)} * {n}"
        )
    if logprobs is not None and len(logprobs) != len(completions):
        raise ValueError(
            f"`logprobs` has {len(logprobs)} rows but `completions` has {len(completions)}"
        )
    rows = len(completions)
    p_width = max(len(p) for p in prompts)
    c_width = max(1, *(len(c) for c in completions))
    # one tensor per field from padded lists (not one small copy per row)
    prompt_ids = torch.tensor(
        [[pad_id] * (p_width - len(prompts[r // n])) + list(prompts[r // n]) for r in range(rows)],
        dtype=torch.long,
    ).reshape(rows, p_width)
    p_lens = torch.tensor([len(prompts[r // n]) for r in range(rows)])
    prompt_mask = torch.arange(p_width)[None] >= (p_width - p_lens)[:, None]
    token_lists = [list(generated) for generated in completions]
    completion_ids = torch.tensor(
        [t + [pad_id] * (c_width - len(t)) for t in token_lists], dtype=torch.long
    ).reshape(rows, c_width)
    reasons: list[str] = []
    texts: list[str] = []
    lengths: list[int] = []
    for tokens in token_lists:
        end = first_stop(tokens, stop_ids, stop, decode)
        length = len(tokens) if end is None else end + 1
        lengths.append(length)
        reasons.append("length" if end is None else "stop")
        text = decode(tokens[:length])
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        texts.append(text[:cut] if cut >= 0 else text)
    mask = torch.arange(c_width)[None] < torch.tensor(lengths, dtype=torch.long)[:, None]
    lp = None
    if logprobs is not None:
        lp = torch.tensor(
            [
                list(logprobs[r][:length]) + [0.0] * (c_width - length)
                for r, length in enumerate(lengths)
            ],
            dtype=logprob_dtype,
        ).reshape(rows, c_width)
    return RolloutResult(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=mask,
        finish_reasons=reasons,
        group_index=torch.arange(rows) // n,
        texts=texts,
        logprobs=lp,
    )
