"""Sampling parameters and the exact logits processing used for sampling."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["LogitsHook", "SamplingParams", "process_logits"]

#: ``(input_ids [B, t], scores [B, V]) -> scores [B, V]``
LogitsHook = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty")
_INT_FIELDS = ("top_k", "max_new_tokens", "min_new_tokens", "n")


def _is_int(value: object) -> bool:
    """An integer that is not a bool (a JSON ``true`` is never a count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions. Validated on construction (errors name the field)."""

    temperature: float = 1.0
    """Softmax temperature (>= 0); 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with probability mass >= top_p, (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top token's, [0, 1)."""
    repetition_penalty: float = 1.0
    """CTRL-style penalty (> 0) on tokens already in the context (1 = off)."""
    max_new_tokens: int = 64
    """Most tokens generated per completion (>= 1)."""
    min_new_tokens: int = 0
    """EOS and stop token ids are forbidden before this many tokens."""
    stop: tuple[str, ...] = ()
    """Stop strings (non-empty): generation ends at the token completing one; the text is cut
    before it. A list is stored as a tuple."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion like EOS (included in the completion mask); ints >= 0,
    checked against the model's vocabulary by the engine."""
    n: int = 1
    """Samples per prompt (the GRPO group size G)."""
    seed: int | None = None
    """Seed for reproducible sampling (the caller's global RNG is left untouched)."""
    logit_mask: torch.Tensor | None = None
    """[V] bool, True where a token is allowed (trlX's ``logit_mask``); None allows all."""
    logits_processor: LogitsHook | None = None
    """A hook applied to the scores each step (e.g. value-guided decoding), before temperature."""
    return_logprobs: bool = False
    """Return the log-probs of the sampled tokens under the processed distribution."""

    def __post_init__(self) -> None:
        self._check_types()
        checks = [
            ("temperature", self.temperature >= 0, ">= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("min_p", 0 <= self.min_p < 1, "in [0, 1)"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0"),
            ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
            ("min_new_tokens", 0 <= self.min_new_tokens <= self.max_new_tokens,
             "in [0, max_new_tokens]"),
            ("n", self.n >= 1, ">= 1"),
        ]  # fmt: skip
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"`{name}` must be {rule}, got {getattr(self, name)!r}")
        if self.logit_mask is not None and (
            self.logit_mask.ndim != 1 or self.logit_mask.dtype != torch.bool
        ):
            raise ValueError("`logit_mask` must be a 1-D bool tensor [V] (True = allowed)")
        if self.logit_mask is not None and not bool(self.logit_mask.any()):
            raise ValueError("`logit_mask` allows no token at all")

    def _check_types(self) -> None:
        """Types first, so the range checks compare numbers; stop lists become tuples."""
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not (
                isinstance(value, numbers.Real)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                raise ValueError(f"`{name}` must be a finite real number, got {value!r}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"`{name}` must be an int, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.seed is not None:
            if not _is_int(self.seed):
                raise ValueError(f"`seed` must be an int or None, got {self.seed!r}")
            object.__setattr__(self, "seed", int(self.seed))
        if isinstance(self.stop, str):
            raise ValueError(
                f"`stop` must be a tuple of strings, e.g. stop=({self.stop!r},), got the string "
                f"{self.stop!r}"
            )
        if not isinstance(self.stop, (tuple, list)) or not all(
            isinstance(s, str) for s in self.stop
        ):
            raise ValueError(f"`stop` must be a tuple of strings, got {self.stop!r}")
        if any(s == "" for s in self.stop):
            raise ValueError(
                f"`stop` has an empty string, which would end every completion at once: "
                f"pass non-empty stop strings, got {self.stop!r}"
            )
        object.__setattr__(self, "stop", tuple(self.stop))
        ids = self.stop_token_ids
        if not isinstance(ids, (tuple, list)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(
                f"`stop_token_ids` must be a tuple of token ids (ints >= 0), e.g. "
                f"stop_token_ids=(2,), got {ids!r}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0

    @classmethod
    def eval_preset(cls, **overrides: object) -> SamplingParams:
        """Greedy decoding, one sample per prompt, for evaluation."""
        return dataclasses.replace(cls(temperature=0.0, n=1), **overrides)  # type: ignore[arg-type]


def _repetition_penalty(
    scores: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor | None, penalty: float
) -> torch.Tensor:
    present = torch.zeros_like(scores, dtype=torch.bool)
    valid = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    present.scatter_(1, torch.where(valid, input_ids, 0), valid)
    penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
    return torch.where(present, penalised, scores)


def process_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    params: SamplingParams,
    *,
    input_mask: torch.Tensor | None = None,
    step: int | None = None,
    eos_token_ids: tuple[int, ...] = (),
) -> torch.Tensor:
    """Apply the sampling processing to next-token logits, exactly as the engine does.

    Order: repetition penalty (HF convention: positive scores divided, negative multiplied,
    over tokens in the context), ``min_new_tokens`` (EOS and stop ids forbidden while
    ``step < min_new_tokens``), ``logit_mask``, the user hook, temperature (skipped for 0 and
    1), top-k, top-p (keeping at least one token), min-p. Filtered entries become -inf.

    A trainer recomputing sampling log-probs runs this on its teacher-forced logits at each
    completion position, so the mismatch correction compares like with like.

    Args:
        logits: [B, V] next-token logits.
        input_ids: [B, t] the context so far.
        params: The sampling parameters.
        input_mask: [B, t] True on real (non-padding) context tokens, or None (all real).
        step: Index of the token being generated within the completion (for
            ``min_new_tokens``), or None to skip that rule.
        eos_token_ids: EOS ids forbidden with the stop ids before ``min_new_tokens``.

    Returns:
        [B, V] processed scores (a new tensor).
    """
    scores = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits.clone()
    if params.repetition_penalty != 1.0:
        scores = _repetition_penalty(scores, input_ids, input_mask, params.repetition_penalty)
    if step is not None and step < params.min_new_tokens:
        banned = [*eos_token_ids, *params.stop_token_ids]
        if banned:
            scores[:, banned] = float("-inf")
    if params.logit_mask is not None:
        scores = scores.masked_fill(~params.logit_mask.to(scores.device), float("-inf"))
    if params.logits_processor is not None:
        scores = params.logits_processor(input_ids, scores)
    if params.temperature not in (0.0, 1.0):
        scores = scores / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, scores.shape[-1])
        kth = scores.topk(k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    if params.min_p > 0.0:
        probs = scores.softmax(dim=-1)
        threshold = params.min_p * probs.amax(dim=-1, keepdim=True)
        scores = scores.masked_fill(probs < threshold, float("-inf"))
    return scores
