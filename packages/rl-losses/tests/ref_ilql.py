"""Float64 loop references for the ILQL terms of ``rl_losses`` (arXiv 2206.11871, trlX's loss).

Written from the formulas, independently of ``rl_losses/ilql.py``: plain Python loops over rows and
tokens on 0-dim tensors, so gradients w.r.t. the differentiable inputs compare through autograd.
Invalid positions (mask False) are never read. Aggregation reuses ``ref_losses.ref_aggregate``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from ref_losses import ref_aggregate

F64 = torch.float64
Tensor = torch.Tensor


def _rows(mask: Tensor) -> list[list[bool]]:
    return [[bool(x) for x in row] for row in mask.tolist()]


def _per_token(mask: Tensor, fn: Any) -> Tensor:
    """[N, T] tensor of fn(i, t) at valid positions, 0 elsewhere (a differentiable stack)."""
    rows = []
    for i, row in enumerate(_rows(mask)):
        rows.append(
            torch.stack(
                [fn(i, t) if ok else torch.zeros((), dtype=F64) for t, ok in enumerate(row)]
            )
            if row
            else torch.zeros(0, dtype=F64)
        )
    if not rows:
        return torch.zeros(mask.shape, dtype=F64)
    return torch.stack(rows)


def ref_next_state_values(
    values: Tensor, mask: Tensor, *, terminal_values: Tensor | None = None
) -> Tensor:
    out = torch.zeros(mask.shape, dtype=F64)
    for i, row in enumerate(_rows(mask)):
        actions = [t for t, ok in enumerate(row) if ok]
        for k, t in enumerate(actions):
            if k + 1 < len(actions):
                out[i, t] = float(values[i, actions[k + 1]])
            else:
                out[i, t] = 0.0 if terminal_values is None else float(terminal_values[i])
    return out


def ref_ilql_td_loss(
    q_values: Tensor,
    rewards: Tensor,
    next_values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 0.99,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> Tensor:
    def term(i: int, t: int) -> Tensor:
        y = float(rewards[i, t]) + gamma * float(next_values[i, t])
        return (q_values[i, t] - y) ** 2

    return ref_aggregate(_per_token(mask, term), mask, aggregation, normalizer, max_length)


def ref_expectile_loss(
    values: Tensor,
    target_q: Tensor,
    mask: Tensor,
    *,
    tau: float = 0.7,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> Tensor:
    def term(i: int, t: int) -> Tensor:
        u = float(target_q[i, t]) - values[i, t]
        weight = (1.0 - tau) if float(u.detach()) < 0 else tau
        return weight * u * u

    return ref_aggregate(_per_token(mask, term), mask, aggregation, normalizer, max_length)


def ref_cql_loss(
    q_logits: Tensor,
    actions: Tensor,
    mask: Tensor,
    *,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> Tensor:
    V = q_logits.shape[2]

    def term(i: int, t: int) -> Tensor:
        top = max(float(q_logits[i, t, v].detach()) for v in range(V))
        total = sum(torch.exp(q_logits[i, t, v] - top) for v in range(V))
        return top + torch.log(total) - q_logits[i, t, int(actions[i, t])]  # type: ignore[arg-type]

    return ref_aggregate(_per_token(mask, term), mask, aggregation, normalizer, max_length)


def ref_awac_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    beta: float = 0.0,
    max_weight: float | None = None,
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> Tensor:
    def term(i: int, t: int) -> Tensor:
        w = math.exp(beta * float(advantages[i, t]))
        if max_weight is not None:
            w = min(w, max_weight)
        return -w * logprobs[i, t]

    return ref_aggregate(_per_token(mask, term), mask, aggregation, normalizer, max_length)


def ref_ilql_loss(
    logprobs: Tensor,
    qs: list[Tensor],
    target_qs: list[Tensor],
    values: Tensor,
    actions: Tensor,
    rewards: Tensor,
    mask: Tensor,
    *,
    gamma: float = 0.99,
    tau: float = 0.7,
    cql_scale: float = 0.1,
    awac_scale: float = 1.0,
    awac_beta: float = 0.0,
    awac_max_weight: float | None = None,
    target_reduction: str = "min",
    aggregation: str = "token_mean",
    normalizer: Any = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """The total and its parts (the diagnostics as floats)."""
    agg = {"aggregation": aggregation, "normalizer": normalizer, "max_length": max_length}
    nxt = ref_next_state_values(values.detach(), mask)
    N, T = mask.shape
    taken = [
        torch.stack([torch.stack([q[i, t, int(actions[i, t])] if bool(mask[i, t]) else q[i, t, 0]
                                  for t in range(T)]) for i in range(N)])
        if N and T else torch.zeros(N, T, dtype=F64)
        for q in qs
    ]  # fmt: skip
    tq = torch.zeros(N, T, dtype=F64)
    for i in range(N):
        for t in range(T):
            if bool(mask[i, t]):
                picked = [
                    float(h[i, t, int(actions[i, t])] if h.ndim == 3 else h[i, t])
                    for h in target_qs
                ]
                tq[i, t] = min(picked) if target_reduction == "min" else sum(picked) / len(picked)
    q_loss = sum(ref_ilql_td_loss(q, rewards, nxt, mask, gamma=gamma, **agg) for q in taken)
    cql = sum(ref_cql_loss(q, actions, mask, **agg) for q in qs)
    v_loss = ref_expectile_loss(values, tq, mask, tau=tau, **agg)
    adv = tq - values.detach()
    awac = ref_awac_loss(logprobs, adv, mask, beta=awac_beta, max_weight=awac_max_weight, **agg)
    total = q_loss + v_loss + cql_scale * cql + awac_scale * awac
    valid = [(i, t) for i in range(N) for t in range(T) if bool(mask[i, t])]
    n = max(1, len(valid))

    def mean(x: Tensor) -> float:
        return sum(float(x[i, t]) for i, t in valid) / n

    weights = torch.zeros(N, T, dtype=F64)
    for i, t in valid:
        w = math.exp(awac_beta * float(adv[i, t]))
        weights[i, t] = w if awac_max_weight is None else min(w, awac_max_weight)
    return {
        "loss": total,
        "q_loss": float(q_loss.detach()),
        "v_loss": float(v_loss.detach()),
        "cql_loss": float(cql.detach()),
        "awac_loss": float(awac.detach()),
        "q_mean": sum(mean(q.detach()) for q in taken) / len(taken),
        "target_q_mean": mean(tq),
        "v_mean": mean(values.detach()),
        "advantage_mean": mean(adv),
        "td_target_mean": mean(rewards + gamma * nxt),
        "awac_weight_mean": mean(weights),
    }
