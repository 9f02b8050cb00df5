"""The base of the kernels' softmax tiles (``rl_kernels._core``): 2 where ``exp2`` is the faster
exponential, e elsewhere.

Each machine picks one base, so both are forced here in turn (``exp2_faster`` patched): each
gives float64 full logits' log-probs, entropies, sums of squared probabilities and gradients,
through the kept-probability and the recomputing backward, whole vocabulary rows and vocabulary
tiles, and ``fused_policy_loss``'s loss and gradients. The profiler shows that the forced base is
the one that runs.
"""

from __future__ import annotations

from typing import Any

import kernels_testlib as lib
import pytest
import rl_kernels as rk
import rl_kernels._core as core
import torch
from torch.profiler import ProfilerActivity, profile

F64 = torch.float64
M, H, V = 29, 24, 97


@pytest.fixture(params=[False, True], ids=["base_e", "base_2"])
def base2(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(core, "exp2_faster", lambda device: request.param)
    return bool(request.param)


def test_the_base_follows_the_cpu_capability() -> None:
    capability = torch.backends.cpu.get_cpu_capability()
    assert core.exp2_faster(torch.device("cpu")) is (capability in core.EXP2_CPU_CAPABILITIES)
    assert core.exp2_faster(torch.device("cuda")) is False
    assert core.exp2_faster(torch.device("meta")) is False


def _head(key: str, bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Any]:
    g = lib.gen("exp-base", key)
    hidden, weight, b = lib.make_lm_head(g, (M,), H, V, bias=bias, dtype=F64)
    return hidden, weight, b, lib.make_targets(g, (M,), V)


@pytest.mark.parametrize(
    ("with_entropy", "bias", "temperature", "vocab_chunk", "keep"),
    [
        (False, False, 1.0, None, True),  # the backward reads the kept probabilities
        (False, True, 0.7, None, False),  # the backward recomputes the logits
        (True, True, 1.3, None, False),
        (True, False, 0.7, 32, False),  # vocabulary tiles: the online log-sum-exp
        (False, True, 1.0, 32, False),
    ],
)
def test_fused_logprobs_match_float64_in_each_base(
    base2: bool,
    with_entropy: bool,
    bias: bool,
    temperature: float,
    vocab_chunk: int | None,
    keep: bool,
) -> None:
    hidden, weight, b, targets = _head(f"{with_entropy}{bias}{temperature}{vocab_chunk}", bias)
    leaves = [
        None if t is None else t.detach().float().requires_grad_(True) for t in (hidden, weight, b)
    ]
    out = rk.fused_logprobs(
        leaves[0], leaves[1], targets, leaves[2], temperature=temperature,
        chunk_rows=8, with_entropy=with_entropy, with_sum_pi_squared=True,
        vocab_chunk=vocab_chunk, memory_budget=rk.DEFAULT_MEMORY_BUDGET if keep else 1,
    )  # fmt: skip
    assert isinstance(out, tuple)
    logp, spi = out[0], out[-1]
    ent = out[1] if with_entropy else None
    coef = torch.linspace(-1.0, 1.5, M, dtype=F64)
    loss = (logp * coef.float()).sum() + (0.3 * ent.sum() if ent is not None else 0.0)

    ref = [
        None if t is None else t.detach().clone().requires_grad_(True) for t in (hidden, weight, b)
    ]
    ref_logp, ref_ent = lib.naive_logprobs(
        ref[0], ref[1], targets, ref[2], temperature, upcast=False
    )
    ref_loss = (ref_logp * coef).sum() + (0.3 * ref_ent.sum() if with_entropy else 0.0)
    tok = lib.token_tol(ref[0], ref[1], ref[2], temperature)
    lib.assert_close(logp, ref_logp, "logprobs", **tok)
    if ent is not None:
        lib.assert_close(ent, ref_ent, "entropies", **tok)
    with torch.no_grad():
        z = lib.naive_logits(ref[0], ref[1], ref[2], temperature, upcast=False)
        lib.assert_close(spi, torch.softmax(z, -1).square().sum(-1), "sum_pi_squared", **tok)
    lib.assert_grads_close(
        lib.grads(loss, leaves), lib.grads(ref_loss, ref), **lib.lm_tol(ref[0], ref[1])
    )


@pytest.mark.parametrize("vocab_chunk", [None, 32])
def test_fused_policy_loss_matches_float64_in_each_base(
    base2: bool, vocab_chunk: int | None
) -> None:
    g = lib.gen("exp-base-policy", vocab_chunk)
    n, t = 4, 7
    hidden, weight, b = lib.make_lm_head(g, (n, t), H, V, bias=True, dtype=F64)
    targets = lib.make_targets(g, (n, t), V)
    mask = torch.rand((n, t), generator=g, dtype=F64) < 0.8
    advantages = torch.randn(n, generator=g, dtype=F64)
    old = torch.randn((n, t), generator=g, dtype=F64) * 0.1 - 4.0
    ref_lp = torch.randn((n, t), generator=g, dtype=F64) * 0.1 - 4.0
    kw: dict[str, Any] = {
        "temperature": 0.8, "objective": "ppo", "clip_low": 0.2, "kl_coef": 0.05,
        "entropy_coef": 0.01, "return_entropy": True,
    }  # fmt: skip
    leaves = [x.detach().float().requires_grad_(True) for x in (hidden, weight, b) if x is not None]
    out = rk.fused_policy_loss(
        leaves[0], leaves[1], targets, mask, advantages.float(), old.float(), ref_lp.float(),
        bias=leaves[2], chunk_rows=5, vocab_chunk=vocab_chunk, **kw,
    )  # fmt: skip
    ref_leaves = [
        x.detach().clone().requires_grad_(True) for x in (hidden, weight, b) if x is not None
    ]
    kw.pop("return_entropy")
    ref = lib.naive_policy_loss(
        ref_leaves[0], ref_leaves[1], targets, mask, advantages, old, ref_lp,
        bias=ref_leaves[2], **kw,
    )  # fmt: skip
    tol = lib.lm_tol(ref_leaves[0], ref_leaves[1])
    lib.assert_close(
        out.loss, ref.loss, "loss", **tol, scale=lib.through_logprobs_scale(ref.loss, ref)
    )
    tok = lib.token_tol(ref_leaves[0], ref_leaves[1], ref_leaves[2], kw["temperature"])
    lib.assert_close(out.logprobs[mask], ref.logp[mask], "logprobs", **tok)
    assert out.entropies is not None
    lib.assert_close(out.entropies[mask], ref.ent[mask], "entropies", **tok)
    lib.assert_grads_close(lib.grads(out.loss, leaves), lib.grads(ref.loss, ref_leaves), **tol)


@pytest.mark.parametrize(
    ("with_entropy", "train_weight"), [(False, False), (True, False), (False, True)]
)
def test_the_forced_base_is_the_exponential_that_runs(
    base2: bool, with_entropy: bool, train_weight: bool
) -> None:
    hidden, weight, _, targets = _head("profile", False)
    h = hidden.detach().float().requires_grad_(True)
    w = weight.detach().float().requires_grad_(train_weight)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = rk.fused_logprobs(
            h, w, targets, None, chunk_rows=8, with_entropy=with_entropy, memory_budget=1
        )
        logp = out[0] if isinstance(out, tuple) else out
        logp.sum().backward()
    counts = {e.key: e.count for e in prof.key_averages()}
    chunks = -(-M // 8)
    # one exponential per chunk in the forward, and one per chunk where the backward recomputes
    # the logits (a frozen head without entropies needs no recomputation)
    calls = chunks * (2 if with_entropy or train_weight else 1)
    ran = counts.get("aten::exp2", 0), counts.get("aten::exp", 0)
    assert ran == ((calls, 0) if base2 else (0, calls)), (base2, ran)
