"""The rollout result: everything a trainer needs about a batch of completions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RolloutResult"]


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
