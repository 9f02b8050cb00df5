"""Shared seeded float64 inputs of the conformance run (torch only: imported by the driver and,
by path, by every peer script in its own venv).

One batch per group size G in (2, 4, 5), B = 3 prompts, N = B*G rows, T = 7 tokens. Row
masks cycle through right-padded, holed (a gap between valid tokens), empty and full rows, so
every batch has padding, holes and an empty row. Rewards are binary with ties plus one
continuous group, so groups of equal rewards, mixed groups and distinct values all occur.
"""

from __future__ import annotations

import torch

F64 = torch.float64
GROUP_SIZES = (2, 4, 5)
B, T = 3, 7


def _mask(n: int) -> torch.Tensor:
    rows = []
    for i in range(n):
        kind = i % 4
        if kind == 0:  # right-padded
            row = [s < 4 + (i % 3) for s in range(T)]
        elif kind == 1:  # holes
            row = [s not in (2, 3) and s < 6 for s in range(T)]
        elif kind == 2 and i == 2:  # one empty row per batch
            row = [False] * T
        else:
            row = [True] * T
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


def batch(g_size: int) -> dict[str, torch.Tensor]:
    """Every tensor a case needs, for groups of ``g_size``."""
    gen = torch.Generator().manual_seed(1000 + g_size)
    n = B * g_size
    mask = _mask(n)
    lp = -torch.rand(n, T, generator=gen, dtype=F64) * 2.0 - 0.05
    old = lp + 0.15 * torch.randn(n, T, generator=gen, dtype=F64)
    ref = lp + 0.25 * torch.randn(n, T, generator=gen, dtype=F64)
    samp = old + 0.1 * torch.randn(n, T, generator=gen, dtype=F64)
    scores = (torch.rand(n, generator=gen, dtype=F64) < 0.5).to(F64)
    scores[:g_size] = torch.randn(g_size, generator=gen, dtype=F64)  # one continuous group
    scores[g_size : 2 * g_size] = 1.0  # one all-equal group
    adv = torch.randn(n, generator=gen, dtype=F64)
    values = torch.randn(n, T, generator=gen, dtype=F64) * 0.5
    old_values = values + 0.1 * torch.randn(n, T, generator=gen, dtype=F64)
    returns = torch.randn(n, T, generator=gen, dtype=F64)
    # per-token rewards: the score on each row's last valid token
    token_rewards = torch.zeros(n, T, dtype=F64)
    for i in range(n):
        valid = mask[i].nonzero()
        if len(valid):
            token_rewards[i, int(valid[-1])] = scores[i]
    # turns: two turns per row, split at the middle of the valid tokens
    turn_ids = torch.full((n, T), -1, dtype=torch.int64)
    for i in range(n):
        valid = mask[i].nonzero().flatten().tolist()
        for k, s in enumerate(valid):
            turn_ids[i, s] = 0 if k < (len(valid) + 1) // 2 else 1
    # a tiny lm_head for the fused (Liger / rl-kernels) losses: hidden [N, T, H], weight [V, H]
    hidden = torch.randn(n, T, 8, generator=gen, dtype=F64)
    weight = torch.randn(11, 8, generator=gen, dtype=F64) * 0.5
    targets = torch.randint(0, 11, (n, T), generator=gen)
    lp_h = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets[..., None])[..., 0]
    return {
        "hidden": hidden,
        "weight": weight,
        "targets": targets,
        "old_h": lp_h + 0.15 * torch.randn(n, T, generator=gen, dtype=F64),
        "ref_h": lp_h + 0.25 * torch.randn(n, T, generator=gen, dtype=F64),
        "mask": mask,
        "logprobs": lp,
        "old_logprobs": old,
        "ref_logprobs": ref,
        "sampling_logprobs": samp,
        "scores": scores,
        "advantages": adv,
        "values": values,
        "old_values": old_values,
        "returns": returns,
        "token_rewards": token_rewards,
        "turn_ids": turn_ids,
    }


def all_batches() -> dict[str, dict[str, torch.Tensor]]:
    return {f"G{g}": batch(g) for g in GROUP_SIZES}
