"""Logits split over the vocabulary too (``vocab_chunk``): the online log-sum-exp and the
tile-by-tile gradients against full float64 logits, for both kernels."""

from __future__ import annotations

from typing import Any

import kernels_testlib as lib
import pytest
import rl_kernels as rk
import rl_losses
import torch
from torch.profiler import ProfilerActivity, profile

F64 = torch.float64
N, T, H, V = 3, 7, 24, 96


def _head(bias: bool) -> tuple[torch.Tensor, ...]:
    g = lib.gen("vocab-tiles")
    hidden, weight, b = lib.make_lm_head(g, (N * T,), H, V, bias=bias, dtype=F64)
    targets = lib.make_targets(g, (N * T,), V)
    targets[:4] = torch.tensor([0, V - 1, 31, 32])  # first and last column, both sides of a seam
    return hidden.detach(), weight.detach(), None if b is None else b.detach(), targets


@pytest.mark.parametrize("vocab_chunk", [1, 7, 32, 95])
@pytest.mark.parametrize(("with_entropy", "bias", "temperature"), [
    (False, False, 1.0), (True, True, 0.7), (False, True, 1.3),
])  # fmt: skip
def test_fused_logprobs_by_vocab_tiles_match_float64(
    vocab_chunk: int, with_entropy: bool, bias: bool, temperature: float
) -> None:
    hidden, weight, b, targets = _head(bias)
    leaves = [t.float().requires_grad_(True) for t in (hidden, weight, b) if t is not None]
    out = rk.fused_logprobs(
        leaves[0], leaves[1], targets, leaves[2] if bias else None, temperature=temperature,
        chunk_rows=5, with_entropy=with_entropy, with_sum_pi_squared=True,
        vocab_chunk=vocab_chunk,
    )  # fmt: skip
    assert isinstance(out, tuple)
    logp, spi = out[0], out[-1]
    ent = out[1] if with_entropy else None
    loss = (logp * torch.linspace(0.5, 1.5, N * T)).sum()
    if ent is not None:
        loss = loss + 0.3 * ent.sum()
    got = lib.grads(loss, leaves)

    ref_leaves = [t.clone().requires_grad_(True) for t in (hidden, weight, b) if t is not None]
    z = ref_leaves[0] @ ref_leaves[1].T
    if bias:
        z = z + ref_leaves[2]
    lsm = torch.log_softmax(z / temperature, -1)
    ref_logp = lsm.gather(-1, targets[:, None])[:, 0]
    ref_loss = (ref_logp * torch.linspace(0.5, 1.5, N * T, dtype=F64)).sum()
    tok = lib.token_tol(*ref_leaves[:2], ref_leaves[2] if bias else None, temperature)
    if ent is not None:
        ref_ent = -(lsm.exp() * lsm).sum(-1)
        ref_loss = ref_loss + 0.3 * ref_ent.sum()
        lib.assert_close(ent, ref_ent, f"entropy vt={vocab_chunk}", **tok)
    lib.assert_close(logp, ref_logp, f"logprobs vt={vocab_chunk}", **tok)
    lib.assert_close(spi, lsm.exp().square().sum(-1), f"sum_pi_squared vt={vocab_chunk}", **tok)
    expected = lib.grads(ref_loss, ref_leaves)
    tol = lib.lm_tol(ref_leaves[0], ref_leaves[1])
    for a, e, name in zip(got, expected, ("hidden", "weight", "bias"), strict=False):
        assert a is not None and e is not None
        lib.assert_close(a, e, f"grad {name} vt={vocab_chunk}", **tol)


@pytest.mark.parametrize("vocab_chunk", [1, 10, 64])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.05])
def test_fused_policy_loss_by_vocab_tiles_matches_float64(
    vocab_chunk: int, entropy_coef: float
) -> None:
    hidden, weight, _, targets = _head(False)
    g = lib.gen("vocab-tiles-loss")
    mask = lib.make_mask(g, N, T)
    adv = torch.randn(N, generator=g, dtype=F64)
    old = torch.randn(N, T, generator=g, dtype=F64) * 0.3 - 4.0
    ref_lp = old + 0.1
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    h = hidden.float().reshape(N, T, H).requires_grad_(True)
    w = weight.float().requires_grad_(True)
    out = rk.fused_policy_loss(
        h, w, targets.reshape(N, T), mask, adv, old, ref_lp, kl_coef=0.05,
        entropy_coef=entropy_coef, chunk_rows=4, vocab_chunk=vocab_chunk, **kw,
    )  # fmt: skip
    got = lib.grads(out.loss, [h, w])

    h64 = hidden.reshape(N, T, H).clone().requires_grad_(True)
    w64 = weight.clone().requires_grad_(True)
    lsm = torch.log_softmax(h64 @ w64.T, -1)
    logp64 = lsm.gather(-1, targets.reshape(N, T, 1))[..., 0]
    policy = rl_losses.clipped_surrogate(logp64, old, adv, mask, **kw)
    kl = rl_losses.kl_penalty(logp64, ref_lp, mask, kind="k3", coef=0.05)
    ref_loss = policy.loss + kl.loss
    if entropy_coef:
        ent = -(lsm.exp() * lsm).sum(-1)
        ref_loss = ref_loss - entropy_coef * (ent * mask).sum() / mask.sum()
    expected = lib.grads(ref_loss, [h64, w64])
    tol = lib.lm_tol(h64, w64)
    lib.assert_close(out.loss, ref_loss, f"loss vt={vocab_chunk}", **tol)
    for a, e, name in zip(got, expected, ("hidden", "weight"), strict=True):
        assert a is not None and e is not None
        lib.assert_close(a, e, f"grad {name} vt={vocab_chunk}", **tol)


def test_vocab_chunk_is_checked() -> None:
    hidden, weight, _, targets = _head(False)
    with pytest.raises(ValueError, match="vocab_chunk"):
        rk.fused_logprobs(hidden.float(), weight.float(), targets, vocab_chunk=0)


#: The operations that wait for the device (a count read back to the host, a scalar).
SYNCS = ("aten::nonzero", "aten::_local_scalar_dense", "aten::item")


def _syncs(fn: Any) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name in SYNCS)


@pytest.mark.parametrize("kernel", ["fused_logprobs", "fused_policy_loss"])
def test_vocab_tiles_do_not_wait_for_the_device(kernel: str) -> None:
    """Each tile finds its rows' targets with masks: the host synchronisations of a forward and
    backward are those of one whole-vocabulary tile, however many tiles there are (on a GPU
    each one would stall the launch queue)."""
    hidden, weight, _, targets = _head(False)
    g = lib.gen("vocab-tiles-syncs")
    mask = lib.make_mask(g, N, T)
    adv = torch.randn(N, generator=g)

    def run(vocab_chunk: int) -> None:
        h = hidden.float().requires_grad_(True)
        w = weight.float().requires_grad_(True)
        if kernel == "fused_logprobs":
            out = rk.fused_logprobs(h, w, targets, chunk_rows=5, vocab_chunk=vocab_chunk)
            assert isinstance(out, torch.Tensor)
            out.sum().backward()
        else:
            rk.fused_policy_loss(
                h.reshape(N, T, H), w, targets.reshape(N, T), mask, adv, chunk_rows=5,
                vocab_chunk=vocab_chunk,
            ).loss.backward()  # fmt: skip

    one, many = _syncs(lambda: run(V)), _syncs(lambda: run(7))
    assert many == one, f"{many} host synchronisations with {-(-V // 7)} tiles, {one} with one"
