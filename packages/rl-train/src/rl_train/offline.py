"""Offline data: samples and rewards tokenised (trlX's ``make_experience``), JSONL read back.

A sample is a string (all of it output, conditioned on the BOS token, as trlX does) or
alternating ``(prompt, output, ...)`` strings; output tokens are the actions. Each (standardised)
reward sits on its sample's last action token when :class:`rl_algos.ILQL` learns from it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["OfflineDataset", "Sample", "load_offline_data", "make_experience"]

#: One offline sample: a string, or alternating ``(prompt, output, ...)`` strings.
Sample = str | Sequence[str]


@dataclass
class OfflineDataset:
    """A tokenised offline dataset (``N`` samples, ``L`` tokens)."""

    input_ids: torch.Tensor
    """[N, L] long, right-padded with the pad id."""
    action_masks: torch.Tensor
    """[N, L - 1] bool: True where token t + 1 belongs to an output (an action)."""
    rewards: torch.Tensor
    """[N] float32 rewards as learned from (standardised unless ``normalize_rewards=False``);
    the agent puts each on its sample's last action token."""
    raw_rewards: torch.Tensor
    """[N] float32 rewards as given."""
    lengths: torch.Tensor
    """[N] long, tokens of each sample."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(completion_ids, action_masks, rewards)`` of ``rows`` for ``ILQL.learn``.

        The tensors are trimmed to the longest of these rows.
        """
        width = int(self.lengths[rows].max())
        return (
            self.input_ids[rows, :width],
            self.action_masks[rows, : width - 1],
            self.rewards[rows],
        )


def _segments(i: int, sample: Any, bos: str | None) -> list[str]:
    if isinstance(sample, str):
        if bos is None:
            raise ValueError(
                f"`samples`[{i}] is a plain string, which ILQL treats as one output after a BOS "
                "token, but the tokenizer has no bos_token: pass (prompt, output) pairs instead"
            )
        return [bos, sample]
    parts = list(sample)
    if len(parts) < 2 or len(parts) % 2 or not all(isinstance(p, str) for p in parts):
        raise ValueError(
            f"`samples`[{i}] must be a string or an even number of strings alternating prompt "
            f"and output, e.g. (prompt, output); got {sample!r}"
        )
    return parts


def make_experience(
    samples: Sequence[Sample],
    rewards: Sequence[float] | torch.Tensor | None,
    tokenizer: Any,
    max_length: int = 2048,
    *,
    normalize_rewards: bool = True,
    append_eos: bool = True,
) -> OfflineDataset:
    """Tokenise offline samples and shape their rewards (trlX's ``make_experience``).

    A sample is a string (all of it is output, conditioned on the BOS token, as trlX does) or
    alternating ``(prompt, output, prompt, output, ...)`` strings; output tokens are the
    actions. The EOS token is appended to the last output (``append_eos``) so the policy
    learns to stop. Samples longer than ``max_length`` tokens keep their last ``max_length``
    tokens. Rewards are standardised over the dataset, ``(r - mean) / std`` (trlX), unless
    ``normalize_rewards=False``; a constant reward leaves nothing to learn and warns.

    Args:
        samples: ``N`` samples.
        rewards: ``N`` finite scalar rewards, one per sample.
        tokenizer: A Hugging Face tokenizer with a pad token (and EOS for ``append_eos``).
        max_length: Most tokens kept per sample (>= 2).
        normalize_rewards: Standardise the rewards.
        append_eos: End the last output with EOS (unless it already does).

    Returns:
        An :class:`OfflineDataset`.

    Raises:
        ValueError: empty ``samples``, missing / mismatched / non-finite ``rewards``, a
            malformed sample, or a sample with no output token; the message names the
            argument and the fix.
    """
    r = _check_rewards(samples, rewards)
    if max_length < 2:
        raise ValueError(
            f"`max_length` must be >= 2 (a prompt token and an action), got {max_length}"
        )
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs a pad token (set tokenizer.pad_token)")
    if append_eos and tokenizer.eos_token_id is None:
        raise ValueError("`append_eos=True` needs a tokenizer with an eos token")
    rows: list[list[int]] = []
    acts: list[list[bool]] = []
    for i, sample in enumerate(samples):
        ids, is_action = _tokenize(i, sample, tokenizer, append_eos)
        ids, is_action = ids[-max_length:], is_action[-max_length:]
        rows.append(ids)
        acts.append(is_action[1:])
    L = max(len(x) for x in rows)
    input_ids = torch.full((len(rows), L), int(tokenizer.pad_token_id), dtype=torch.long)
    masks = torch.zeros((len(rows), L - 1), dtype=torch.bool)
    for n, (ids, act) in enumerate(zip(rows, acts, strict=True)):
        input_ids[n, : len(ids)] = torch.tensor(ids)
        masks[n, : len(act)] = torch.tensor(act, dtype=torch.bool)
    shaped = _standardise(r) if normalize_rewards else r.clone()
    lengths = torch.tensor([len(x) for x in rows], dtype=torch.long)
    return OfflineDataset(input_ids, masks, shaped, r, lengths)


def _check_rewards(samples: Sequence[Sample], rewards: Any) -> torch.Tensor:
    if rewards is None:
        raise ValueError(
            "`rewards` is None: ILQL learns from (sample, reward) pairs; pass one reward per "
            "sample (for samples without rewards use supervised fine-tuning)"
        )
    if len(samples) == 0:
        raise ValueError("`samples` is empty: pass at least one sample and its reward")
    r = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)
    if r.numel() != len(samples):
        raise ValueError(
            f"`samples` has {len(samples)} items but `rewards` has {r.numel()}: pass exactly "
            "one reward per sample"
        )
    bad = (~torch.isfinite(r)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"`rewards` has NaN or inf at index {bad[:5]} (value {float(r[bad[0]])}): fix the "
            "reward function or drop those samples"
        )
    return r


def _tokenize(
    i: int, sample: Any, tokenizer: Any, append_eos: bool
) -> tuple[list[int], list[bool]]:
    """Token ids of a sample and, per token, whether it is an output (action) token."""
    bos = tokenizer.bos_token if tokenizer.bos_token_id is not None else None
    eos = tokenizer.eos_token_id
    parts = _segments(i, sample, bos)
    ids: list[int] = []
    is_action: list[bool] = []
    for k, text in enumerate(parts):
        if k == 0 and isinstance(sample, str):
            piece = [int(tokenizer.bos_token_id)]
        else:
            piece = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
        if k == len(parts) - 1 and append_eos and (not piece or piece[-1] != eos):
            piece.append(int(eos))
        ids += piece
        is_action += [k % 2 == 1] * len(piece)
    if not any(is_action[1:]):
        raise ValueError(
            f"`samples`[{i}] has no output token to learn from (after a prompt token): give it "
            "a non-empty output or drop it"
        )
    if is_action[0]:
        raise ValueError(f"`samples`[{i}] needs a non-empty prompt before its first output")
    return ids, is_action


def _standardise(r: torch.Tensor) -> torch.Tensor:
    """``(r - mean) / std`` over the dataset (trlX); a constant reward becomes 0, with a warning."""
    std = float(r.std(unbiased=False))
    if std == 0.0:
        warnings.warn(
            "every reward is the same: after standardisation they are all 0 and ILQL has "
            "nothing to learn (pass normalize_rewards=False to keep them)",
            RuntimeWarning,
            stacklevel=3,
        )
    return (r - r.mean()) / (std if std > 0 else 1.0)


def load_offline_data(path: str | Path) -> tuple[list[Any], list[float]]:
    """Read a JSONL file of ``{"sample": ..., "reward": ...}`` lines.

    Args:
        path: The file (``data.offline_path``).

    Returns:
        ``(samples, rewards)``; list samples become tuples.

    Raises:
        ValueError: A missing file, or a line that is not such an object (the line is named).
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"data.offline_path {str(path)!r} does not exist")
    samples: list[Any] = []
    rewards: list[float] = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            sample, reward = row["sample"], float(row["reward"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"data.offline_path line {number}: expected "
                f'{{"sample": ..., "reward": number}}, got {line[:60]!r} ({exc})'
            ) from exc
        samples.append(tuple(sample) if isinstance(sample, list) else sample)
        rewards.append(reward)
    return samples, rewards
