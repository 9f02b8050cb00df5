"""Seeded float64 input generators and comparison helpers shared by the rl-losses tests."""

from __future__ import annotations

from typing import Any

import torch
from rl_testing import tolerance
from rl_testing.seeded import ROW_KINDS, gen, make_mask, rand, randint  # noqa: F401 (re-exported)

F64 = torch.float64
# rl_testing.tolerance for a loss (or its gradient, or a diagnostic) against the float64 loop
# reference: the batches here hold at most 64 tokens (the longest sum), and a loss chains up to
# three reductions (a turn or sequence pooling, a sequence mean, the batch mean).
LOSS_TOL: dict[str, int] = {"reduction": 64, "stages": 3}
AGGREGATIONS = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)
DIAG = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max")
RATIO_DIAG = ("approx_kl", "ratio_mean", "ratio_max")


def make_turn_ids(g: torch.Generator, mask: torch.Tensor) -> torch.Tensor:
    """int64 [N, T], -1 at invalid tokens. A turn starts at each run of valid tokens and at random
    cuts inside a run; ids sometimes skip a number (a turn missing in that row) and rows may start
    at turn 1, so turns are missing in some rows and present in others.
    """
    n, t = mask.shape
    ids = torch.full((n, t), -1, dtype=torch.int64)
    for i in range(n):
        turn = -1 if rand(g) < 0.7 else 0
        for s in range(t):
            if not mask[i, s]:
                continue
            new_run = s == 0 or not mask[i, s - 1]
            if new_run or rand(g) < 0.35:
                turn += 2 if rand(g) < 0.3 else 1
            ids[i, s] = turn
    return ids


def garbage(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Finite garbage for invalid positions."""
    return torch.randn(shape, generator=g, dtype=F64) * 7.0 + 3.0


def make_policy_inputs(
    g: torch.Generator,
    n: int,
    t: int,
    *,
    noise: float = 0.3,
    adv_per_seq: bool | None = None,
    with_is: bool | None = None,
    mask: torch.Tensor | None = None,
) -> dict[str, Any]:
    """logprobs (leaf, requires_grad), old_logprobs = lp + noise * randn, advantages [N] or
    [N, T], mask, turn_ids, is_weights (or None). Invalid positions hold finite garbage."""
    mask = make_mask(g, n, t) if mask is None else mask
    lp = -torch.rand(n, t, generator=g, dtype=F64) * 3.0 - 0.05
    old = lp + noise * torch.randn(n, t, generator=g, dtype=F64)
    lp = torch.where(mask, lp, garbage(g, (n, t)))
    old = torch.where(mask, old, garbage(g, (n, t)))
    if adv_per_seq is None:
        adv_per_seq = rand(g) < 0.5
    if adv_per_seq:
        adv = torch.randn(n, generator=g, dtype=F64)
    else:
        adv = torch.where(mask, torch.randn(n, t, generator=g, dtype=F64), garbage(g, (n, t)))
    if with_is is None:
        with_is = rand(g) < 0.5
    isw = None
    if with_is:
        isw = torch.where(
            mask,
            torch.exp(0.3 * torch.randn(n, t, generator=g, dtype=F64)),
            garbage(g, (n, t)),
        )
    return {
        "logprobs": lp.clone().requires_grad_(True),
        "old_logprobs": old,
        "advantages": adv,
        "mask": mask,
        "turn_ids": make_turn_ids(g, mask),
        "is_weights": isw,
    }


def agg_kwargs(g: torch.Generator, aggregation: str, u: int) -> dict[str, Any]:
    """aggregation plus, at random, a normalizer (float or 0-dim tensor) and a max_length."""
    out: dict[str, Any] = {"aggregation": aggregation}
    c = randint(g, 0, 3)
    if c == 1:
        out["normalizer"] = 3.5
    elif c == 2:
        out["normalizer"] = torch.tensor(6.0, dtype=F64)
    if randint(g, 0, 2):
        out["max_length"] = u + 3
    return out


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d loss / d x (zeros when the loss does not depend on x)."""
    if not loss.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(loss, x, allow_unused=True, retain_graph=True)
    return torch.zeros_like(x) if g is None else g


def close(got: Any, expected: Any, msg: str = "", **tol: Any) -> None:
    """``rl_testing.tolerance.assert_close`` with ``LOSS_TOL`` (or ``tol``: reduction, stages,
    scale). The scale is at least 1: the per-token terms are of order one (log-probs in
    [-3, 0], ratios and IS weights near 1, unit advantages) and a loss may cancel below them.
    """
    got_t = got if isinstance(got, torch.Tensor) else torch.tensor(float(got), dtype=F64)
    exp_t = expected if isinstance(expected, torch.Tensor) else torch.tensor(expected, dtype=F64)
    got_t, exp_t = got_t.detach(), exp_t.detach()
    kw = LOSS_TOL | tol
    if kw.get("scale") is None:
        kw["scale"] = max([1.0, *([float(exp_t.abs().max())] if exp_t.numel() else [])])
    tolerance.assert_close(got_t, exp_t.to(got_t.device), msg=msg or None, **kw)


def check_scalar_output(value: torch.Tensor, name: str) -> None:
    assert isinstance(value, torch.Tensor), name
    assert value.dim() == 0, (name, value.shape)
    assert value.dtype == F64, (name, value.dtype)


def check_diag_detached(out: Any, keys: tuple[str, ...]) -> None:
    for k in keys:
        v = getattr(out, k)
        check_scalar_output(v, k)
        assert not v.requires_grad, f"{k} must be detached"
