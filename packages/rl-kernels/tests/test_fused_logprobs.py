"""``fused_logprobs`` and ``auto_chunk_rows`` vs the naive full-logits path.

Values and gradients (hidden, weight, bias; through log-probs and entropies) must match the
naive computation to rl_testing.tolerance's bound (kernels_testlib.token_tol / lm_tol) for every
chunking (1 row, 7 rows, 8 rows with M = 37, auto, more rows than M), odd vocabularies,
temperatures and with or without bias, in fp32 and float64 (``upcast=False``); bf16 / fp16
inputs with ``upcast=True`` give fp32 outputs within the fp32 bound of the fp32 naive on the
same rounded inputs and gradients within one rounding in the input dtype. The memory tests profile the
CPU allocator: no single allocation may come near the full [M, V] fp32 logits.
"""

from __future__ import annotations

from typing import Any

import pytest
import rl_kernels as rk
import torch
from kernels_testlib import (
    F32,
    F64,
    assert_close,
    assert_grads_close,
    gen,
    grads,
    lm_tol,
    make_lm_head,
    make_targets,
    naive_logprobs,
    stored_in,
    token_tol,
)
from torch.profiler import ProfilerActivity, profile

SHAPES = [(37, 16, 97), (64, 32, 1001), (5, 8, 2), (1, 3, 11)]  # (M, H, V)
CHUNKS: list[int | None] = [1, 7, None, 10_000]
TEMPERATURES = [1.0, 0.7, 1.3]


def _scalar(g: torch.Generator, logp: torch.Tensor, ent: torch.Tensor | None) -> torch.Tensor:
    """A random linear combination of log-probs (and entropies): exercises every grad path."""
    a = torch.randn(logp.shape, generator=g, dtype=F64).to(logp.dtype)
    s = (a * logp).sum()
    if ent is not None:
        b = torch.randn(ent.shape, generator=g, dtype=F64).to(ent.dtype)
        s = s + (b * ent).sum()
    return s


def _run_both(
    key: tuple[Any, ...],
    m: int,
    h: int,
    v: int,
    *,
    bias: bool,
    temperature: float,
    chunk_rows: int | None,
    with_entropy: bool,
    dtype: torch.dtype = F32,
    upcast: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any], list[Any], tuple[Any, Any]]:
    """(fused outputs, naive outputs, fused grads, naive grads, (token, gradient) tolerance)."""
    g = gen(*key)
    hidden, weight, b = make_lm_head(g, (m,), h, v, bias=bias, dtype=dtype)
    targets = make_targets(g, (m,), v)
    out = rk.fused_logprobs(
        hidden,
        weight,
        targets,
        b,
        temperature,
        chunk_rows,
        with_entropy,
        upcast=upcast,
    )
    if with_entropy:
        assert isinstance(out, tuple)
        assert len(out) == 2
        f_logp, f_ent = out
    else:
        assert isinstance(out, torch.Tensor)
        f_logp, f_ent = out, None
    n_logp, n_ent = naive_logprobs(hidden, weight, targets, b, temperature, upcast=upcast)
    g_scalar = gen(*key, "scalar")
    f_grads = grads(_scalar(g_scalar, f_logp, f_ent), [hidden, weight, b])
    g_scalar = gen(*key, "scalar")
    n_grads = grads(_scalar(g_scalar, n_logp, n_ent if with_entropy else None), [hidden, weight, b])
    fused = [f_logp] if f_ent is None else [f_logp, f_ent]
    naive = [n_logp] if f_ent is None else [n_logp, n_ent]
    tols = (token_tol(hidden, weight, b, temperature), lm_tol(hidden, weight))
    return fused, naive, f_grads, n_grads, tols


# --------------------------------------------------------------------------- fp32 agreement


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_rows", CHUNKS)
@pytest.mark.parametrize(("m", "h", "v"), SHAPES)
def test_matches_naive_fp32(
    m: int,
    h: int,
    v: int,
    chunk_rows: int | None,
    bias: bool,
    temperature: float,
    with_entropy: bool,
) -> None:
    key = ("fp32", m, h, v, chunk_rows, bias, temperature, with_entropy)
    fused, naive, fg, ng, (tol, gtol) = _run_both(
        key,
        m,
        h,
        v,
        bias=bias,
        temperature=temperature,
        chunk_rows=chunk_rows,
        with_entropy=with_entropy,
    )
    for f, n, name in zip(fused, naive, ("logprobs", "entropies"), strict=False):
        assert f.shape == (m,), name
        assert f.dtype == F32, name
        assert_close(f, n, name, **tol)
    assert_grads_close(fg, ng, **gtol)
    for x, ref in zip(fg, ng, strict=True):
        if ref is not None:
            assert x is not None
            assert x.dtype == ref.dtype


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("chunk_rows", [8, 5, 36, 37, 38])
def test_m_not_divisible_by_chunk_rows(chunk_rows: int, with_entropy: bool) -> None:
    key = ("ragged", chunk_rows, with_entropy)
    fused, naive, fg, ng, (tol, gtol) = _run_both(
        key,
        37,
        12,
        97,
        bias=True,
        temperature=0.7,
        chunk_rows=chunk_rows,
        with_entropy=with_entropy,
    )
    for f, n, name in zip(fused, naive, ("logprobs", "entropies"), strict=False):
        assert_close(f, n, name, **tol)
    assert_grads_close(fg, ng, **gtol)


def test_gradient_through_entropies_only() -> None:
    g = gen("entropy-only")
    hidden, weight, b = make_lm_head(g, (19,), 8, 101, bias=True)
    targets = make_targets(g, (19,), 101)
    coeff = torch.randn(19, generator=g, dtype=F64).float()
    _, f_ent = rk.fused_logprobs(hidden, weight, targets, b, 1.3, 4, True)
    f_grads = grads((coeff * f_ent).sum(), [hidden, weight, b])
    _, n_ent = naive_logprobs(hidden, weight, targets, b, 1.3)
    n_grads = grads((coeff * n_ent).sum(), [hidden, weight, b])
    assert_grads_close(f_grads, n_grads, **lm_tol(hidden, weight))


def test_logprobs_only_gradient_with_entropy_requested() -> None:
    g = gen("logp-only")
    hidden, weight, b = make_lm_head(g, (19,), 8, 101, bias=True)
    targets = make_targets(g, (19,), 101)
    f_logp, _ = rk.fused_logprobs(hidden, weight, targets, b, 0.7, 6, True)
    n_logp, _ = naive_logprobs(hidden, weight, targets, b, 0.7)
    assert_grads_close(
        grads(f_logp.sum(), [hidden, weight, b]),
        grads(n_logp.sum(), [hidden, weight, b]),
        **lm_tol(hidden, weight),
    )


def test_chunking_does_not_change_the_result() -> None:
    g = gen("chunk-invariance")
    hidden, weight, b = make_lm_head(g, (41,), 16, 257, bias=True)
    targets = make_targets(g, (41,), 257)
    results = [
        rk.fused_logprobs(hidden, weight, targets, b, 1.0, c, True) for c in (1, 3, 16, 41, 500)
    ]
    tol = token_tol(hidden, weight, b)
    for logp, ent in results[1:]:
        assert_close(logp, results[0][0], "logprobs", **tol)
        assert_close(ent, results[0][1], "entropies", **tol)


def test_frozen_weight_gradient_for_hidden_only() -> None:
    g = gen("frozen")
    hidden, weight, _ = make_lm_head(g, (23,), 16, 97, bias=False)
    weight = weight.detach()
    targets = make_targets(g, (23,), 97)
    logp = rk.fused_logprobs(hidden, weight, targets, chunk_rows=5)
    (gh,) = torch.autograd.grad(logp.sum(), [hidden])
    (nh,) = torch.autograd.grad(naive_logprobs(hidden, weight, targets)[0].sum(), [hidden])
    assert_grads_close([gh], [nh], ("hidden",), **lm_tol(hidden, weight))


def test_under_no_grad() -> None:
    g = gen("no-grad")
    hidden, weight, b = make_lm_head(g, (23,), 16, 97, bias=True)
    targets = make_targets(g, (23,), 97)
    with torch.no_grad():
        logp, ent = rk.fused_logprobs(hidden, weight, targets, b, 0.7, 4, True)
        n_logp, n_ent = naive_logprobs(hidden, weight, targets, b, 0.7)
    assert not logp.requires_grad
    assert not ent.requires_grad
    tol = token_tol(hidden, weight, b, 0.7)
    assert_close(logp, n_logp, "logprobs", **tol)
    assert_close(ent, n_ent, "entropies", **tol)


def test_inputs_without_grad() -> None:
    g = gen("detached")
    hidden, weight, _ = make_lm_head(g, (9,), 4, 13, bias=False)
    targets = make_targets(g, (9,), 13)
    logp = rk.fused_logprobs(hidden.detach(), weight.detach(), targets, chunk_rows=2)
    assert not logp.requires_grad
    tol = token_tol(hidden, weight)
    assert_close(logp, naive_logprobs(hidden, weight, targets)[0], "logprobs", **tol)


def test_int32_targets() -> None:
    g = gen("int32")
    hidden, weight, _ = make_lm_head(g, (17,), 8, 31, bias=False)
    targets = make_targets(g, (17,), 31)
    a = rk.fused_logprobs(hidden, weight, targets.to(torch.int32), chunk_rows=4)
    tol = token_tol(hidden, weight)
    assert_close(a, naive_logprobs(hidden, weight, targets)[0], "logprobs", **tol)


def test_noncontiguous_inputs() -> None:
    g = gen("noncontig")
    big, wbig, _ = make_lm_head(g, (30,), 24, 61, bias=False)
    hidden = big[::2, ::2]  # [15, 12], strided
    weight = wbig[:, ::2]  # [61, 12], strided
    targets = make_targets(g, (30,), 61)[::2]
    f_logp, f_ent = rk.fused_logprobs(hidden, weight, targets, None, 1.0, 4, True)
    n_logp, n_ent = naive_logprobs(hidden, weight, targets)
    tol = token_tol(hidden, weight)
    assert_close(f_logp, n_logp, "logprobs", **tol)
    assert_close(f_ent, n_ent, "entropies", **tol)
    coeff = torch.randn(15, generator=g, dtype=F64).float()
    assert_grads_close(
        grads((f_logp + coeff * f_ent).sum(), [big, wbig]),
        grads((n_logp + coeff * n_ent).sum(), [big, wbig]),
        ("hidden", "weight"),
        **lm_tol(hidden, weight),
    )


def test_empty_batch() -> None:
    g = gen("empty")
    _, weight, b = make_lm_head(g, (1,), 8, 13, bias=True)
    hidden = torch.zeros(0, 8, requires_grad=True)
    targets = torch.zeros(0, dtype=torch.int64)
    logp, ent = rk.fused_logprobs(hidden, weight, targets, b, 1.0, None, True)
    assert logp.shape == (0,)
    assert ent.shape == (0,)


def test_logprobs_are_normalised() -> None:
    """Summing exp(logp) over every target of a row gives 1 (the chunk holds the full row)."""
    g = gen("normalised")
    v = 97
    hidden, weight, b = make_lm_head(g, (3,), 8, v, bias=True)
    rows = hidden.detach().repeat_interleave(v, dim=0)
    targets = torch.arange(v).repeat(3)
    logp = rk.fused_logprobs(rows, weight.detach(), targets, b.detach(), 0.7, 10)
    total = logp.double().exp().reshape(3, v).sum(-1)
    # fp32 log-probs (token_tol's error) exponentiated and summed: the error stays that size
    tol = token_tol(hidden, weight, b, 0.7)
    assert_close(total, torch.ones(3, dtype=F64), "sum of probabilities", **tol, dtype=F32)


# --------------------------------------------------------------------------- float64, low precision


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_rows", [1, 8, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_float64_exact(
    chunk_rows: int | None, bias: bool, temperature: float, with_entropy: bool
) -> None:
    key = ("fp64", chunk_rows, bias, temperature, with_entropy)
    fused, naive, fg, ng, (tol, gtol) = _run_both(
        key,
        37,
        16,
        1001,
        bias=bias,
        temperature=temperature,
        chunk_rows=chunk_rows,
        with_entropy=with_entropy,
        dtype=F64,
        upcast=False,
    )
    for f, n, name in zip(fused, naive, ("logprobs", "entropies"), strict=False):
        assert f.dtype == F64, name
        assert_close(f, n, name, **tol)
    assert_grads_close(fg, ng, **gtol)
    for x in fg:
        assert x is None or x.dtype == F64


def test_upcast_false_fp32_equals_upcast_true() -> None:
    g = gen("upcast-false")
    hidden, weight, b = make_lm_head(g, (21,), 8, 97, bias=True)
    targets = make_targets(g, (21,), 97)
    a = rk.fused_logprobs(hidden, weight, targets, b, 0.7, 4, True, upcast=False)
    c = rk.fused_logprobs(hidden, weight, targets, b, 0.7, 4, True, upcast=True)
    for x, y, name in zip(a, c, ("logprobs", "entropies"), strict=True):
        assert x.dtype == F32
        assert_close(x, y, name, **token_tol(hidden, weight, b, 0.7))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_upcast_false_keeps_input_dtype(dtype: torch.dtype) -> None:
    g = gen("upcast-false-lowp", str(dtype))
    hidden, weight, b = make_lm_head(g, (21,), 8, 97, bias=True, dtype=dtype)
    targets = make_targets(g, (21,), 97)
    logp, ent = rk.fused_logprobs(hidden, weight, targets, b, 1.0, 4, True, upcast=False)
    assert logp.dtype == dtype
    assert ent.dtype == dtype
    n_logp, n_ent = naive_logprobs(hidden, weight, targets, b, 1.0, upcast=True)
    # the whole computation runs in 8 (bf16) or 11 (fp16) significant bits
    tol = token_tol(hidden, weight, b)
    assert_close(logp, n_logp, "logprobs", **tol)
    assert_close(ent, n_ent, "entropies", **tol)


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_upcast(dtype: torch.dtype, bias: bool, with_entropy: bool) -> None:
    key = ("lowp", str(dtype), bias, with_entropy)
    g = gen(*key)
    hidden, weight, b = make_lm_head(g, (37,), 32, 1001, bias=bias, dtype=dtype)
    targets = make_targets(g, (37,), 1001)
    out = rk.fused_logprobs(hidden, weight, targets, b, 0.7, 8, with_entropy, upcast=True)
    f_logp, f_ent = out if with_entropy else (out, None)
    assert f_logp.dtype == F32
    assert f_ent is None or f_ent.dtype == F32
    # fp32 naive on the same rounded inputs
    h32 = hidden.detach().float().requires_grad_(True)
    w32 = weight.detach().float().requires_grad_(True)
    b32 = None if b is None else b.detach().float().requires_grad_(True)
    n_logp, n_ent = naive_logprobs(h32, w32, targets, b32, 0.7)
    tol = token_tol(h32, w32, b32, 0.7)  # fp32 on both sides
    assert_close(f_logp, n_logp, "logprobs", **tol)
    if f_ent is not None:
        assert_close(f_ent, n_ent, "entropies", **tol)
    f_grads = grads(_scalar(gen(*key, "s"), f_logp, f_ent), [hidden, weight, b])
    n_grads = grads(
        _scalar(gen(*key, "s"), n_logp, n_ent if with_entropy else None), [h32, w32, b32]
    )
    for fgrad, ngrad, src, name in zip(
        f_grads, n_grads, (hidden, weight, b), ("hidden", "weight", "bias"), strict=True
    ):
        if src is None:
            continue
        assert fgrad is not None
        assert ngrad is not None
        assert fgrad.dtype == dtype, f"grad {name} must be in the input dtype"
        assert torch.isfinite(fgrad).all()
        # fp32 gradients rounded once to the input dtype: one rounding in that dtype
        assert_close(fgrad, ngrad, f"grad {name}", dtype=dtype)


def test_mixed_dtypes_upcast() -> None:
    """bf16 hidden with an fp32 lm_head (autocast-style): fp32 outputs, per-input grad dtypes."""
    g = gen("mixed")
    hidden, weight, b = make_lm_head(g, (13,), 8, 97, bias=True)
    hb = hidden.detach().bfloat16().requires_grad_(True)
    targets = make_targets(g, (13,), 97)
    logp = rk.fused_logprobs(hb, weight, targets, b, 1.0, 4)
    assert logp.dtype == F32
    gh, gw, gb = grads(logp.sum(), [hb, weight, b])
    assert gh is not None
    assert gw is not None
    assert gb is not None
    assert gh.dtype == torch.bfloat16
    assert gw.dtype == F32
    assert gb.dtype == F32
    n_logp = naive_logprobs(hb.detach().float(), weight, targets, b)[0]
    assert_close(logp, n_logp, "logprobs", **token_tol(hb, weight, b))


# --------------------------------------------------------------------------- auto_chunk_rows


@pytest.mark.parametrize(
    ("vocab", "budget"),
    [
        (151_936, 256 * 2**20),
        (32_000, 256 * 2**20),
        (128_256, 64 * 2**20),
        (97, 4 * 97 * 100),
        (1001, 4 * 1001 * 100 + 3),
        (50_000, 2**30),
        (4096, 4096 * 4 * 17),
    ],
)
def test_auto_chunk_rows_respects_budget(vocab: int, budget: int) -> None:
    rows = rk.auto_chunk_rows(vocab, budget)
    assert isinstance(rows, int)
    assert 16 <= rows <= 8192
    expected = min(max(budget // (vocab * 4), 16), 8192)
    assert rows == expected
    if rows > 16:  # not clamped at the floor: the tile fits the budget
        assert rows * vocab * 4 <= budget
    if rows < 8192:  # not clamped at the cap: one more row would not fit
        assert (rows + 1) * vocab * 4 > budget


def test_auto_chunk_rows_default_budget() -> None:
    assert rk.auto_chunk_rows(151_936) == (256 * 2**20) // (151_936 * 4)
    assert rk.auto_chunk_rows(32_000) == (256 * 2**20) // (32_000 * 4)


def test_auto_chunk_rows_floor_and_cap() -> None:
    assert rk.auto_chunk_rows(10**9, 2**20) == 16  # would be 0 rows
    assert rk.auto_chunk_rows(1, 2**30) == 8192  # would be 2**28 rows
    assert rk.auto_chunk_rows(10**9, 2**20, floor=3) == 3
    assert rk.auto_chunk_rows(1, 2**30, cap=100) == 100
    assert rk.auto_chunk_rows(1000, 4000 * 50, floor=1, cap=10**6) == 50
    assert rk.auto_chunk_rows(1000, 4000 * 50, floor=64) == 64
    assert rk.auto_chunk_rows(1000, 4000 * 50, cap=32) == 32
    assert rk.auto_chunk_rows(1000, 4000 * 50 - 1, floor=1) == 49


def test_auto_chunk_rows_cpu_keeps_tiles_under_the_mmap_ceiling() -> None:
    """On CPU a tile stays under CPU_TILE_BYTES unless that would leave too few rows."""
    limit = rk.chunking.CPU_TILE_BYTES
    assert 32 * 2**20 - 2**20 < limit < 32 * 2**20
    # V = 8192: 1024 rows would be exactly 32 MiB; on CPU 1022 rows (just under)
    assert rk.auto_chunk_rows(8192, total_rows=8192) == 1024
    rows = rk.auto_chunk_rows(8192, total_rows=8192, cpu=True)
    assert rows == limit // (4 * 8192) == 1022
    assert rows * 8192 * 4 <= limit < (rows + 1) * 8192 * 4
    # V = 32000: 512 rows by the eighth-of-M rule, 261 on CPU
    assert rk.auto_chunk_rows(32_000, total_rows=4096) == 512
    assert rk.auto_chunk_rows(32_000, total_rows=4096, cpu=True) == limit // (4 * 32_000) == 261
    # V = 152k: the cap would leave 55 rows (< CPU_MIN_TILE_ROWS): unchanged
    assert limit // (4 * 151_936) < rk.chunking.CPU_MIN_TILE_ROWS
    assert rk.auto_chunk_rows(151_936, total_rows=8192, cpu=True) == rk.auto_chunk_rows(
        151_936, total_rows=8192
    )
    # explicit budgets below the cap are unchanged
    assert rk.auto_chunk_rows(8192, 2**20, cpu=True) == 32


def test_auto_chunk_rows_cpu_eighth_of_m_stops_at_the_minimum_tile() -> None:
    """On CPU the eighth-of-M cap leaves at least min(CPU_MIN_TILE_ROWS, CPU_TILE_BYTES) rows."""
    floor_rows = rk.chunking.CPU_MIN_TILE_ROWS
    assert rk.auto_chunk_rows(1000, total_rows=512) == 64  # an eighth of M
    assert rk.auto_chunk_rows(1000, total_rows=512, cpu=True) == floor_rows
    assert rk.auto_chunk_rows(1000, total_rows=100, cpu=True) == floor_rows  # one tile of M
    assert rk.auto_chunk_rows(1000, total_rows=8 * 300, cpu=True) == 300  # the eighth binds
    # V = 152k: 32 MiB holds 55 rows, fewer than CPU_MIN_TILE_ROWS: the eighth binds from 55
    limit_rows = rk.chunking.CPU_TILE_BYTES // (4 * 151_936)
    assert limit_rows == 55
    assert rk.auto_chunk_rows(151_936, total_rows=8 * 40, cpu=True) == limit_rows
    assert rk.auto_chunk_rows(151_936, total_rows=8 * 128, cpu=True) == 128
    # the budget still binds below the minimum tile
    assert rk.auto_chunk_rows(1000, 4000 * 50, total_rows=512, cpu=True) == 50


def test_fused_logprobs_default_chunk_on_cpu() -> None:
    """chunk_rows=None on CPU chunks by auto_chunk_rows(cpu=True), with the same results.

    The vocabulary is just large enough for the cap to bind (256-row tiles of about 32 MiB),
    so the naive full-logits reference would take gigabytes: the other chunkings' agreement
    with it is tested above; here the chosen chunk is compared with the uncapped one.
    """
    g = gen("cpu-chunk")
    vocab = rk.chunking.CPU_TILE_BYTES // (4 * rk.chunking.CPU_MIN_TILE_ROWS)  # 256 rows fit
    m = 8 * rk.chunking.CPU_MIN_TILE_ROWS + 8  # ceil(m / 8) = 257 rows: one over the cap
    hidden, weight, _ = make_lm_head(g, (m,), 4, vocab, bias=False)
    targets = make_targets(g, (m,), vocab)
    assert rk.auto_chunk_rows(vocab, total_rows=m) == 257
    coeff = torch.linspace(-1, 1, m)
    results = []
    for chunk_rows, chunk in ((None, 256), (257, 257)):
        h = hidden.detach().clone().requires_grad_(True)
        logp = rk.fused_logprobs(h, weight.detach(), targets, chunk_rows=chunk_rows)
        assert isinstance(logp, torch.Tensor)
        assert logp.grad_fn.chunk == chunk  # type: ignore[union-attr]
        (coeff * logp).sum().backward()
        results.append((logp.detach(), h.grad))
    (lp, gh), (lp_ref, gh_ref) = results
    tol = token_tol(hidden, weight, None)
    assert_close(lp, lp_ref, "logprobs", **tol)
    assert_close(gh, gh_ref, "grad hidden", **lm_tol(hidden, weight))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"vocab_size": 100, "memory_budget": 0}, "memory_budget"),
        ({"vocab_size": 100, "memory_budget": -1}, "memory_budget"),
    ],
)
def test_auto_chunk_rows_errors(kwargs: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        rk.auto_chunk_rows(**kwargs)


def test_default_chunking_uses_memory_budget() -> None:
    """chunk_rows=None with a tiny budget still matches the naive result."""
    g = gen("budget")
    hidden, weight, b = make_lm_head(g, (50,), 8, 97, bias=True)
    targets = make_targets(g, (50,), 97)
    logp, ent = rk.fused_logprobs(
        hidden, weight, targets, b, 1.0, None, True, memory_budget=97 * 4 * 3
    )
    n_logp, n_ent = naive_logprobs(hidden, weight, targets, b)
    tol = token_tol(hidden, weight, b)
    assert_close(logp, n_logp, "logprobs", **tol)
    assert_close(ent, n_ent, "entropies", **tol)


# --------------------------------------------------------------------------- kept probabilities


@pytest.mark.parametrize(("m", "h", "v"), [(37, 16, 97), (64, 32, 1001)])
@pytest.mark.parametrize("chunk_rows", [7, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_kept_probabilities_give_the_recomputed_gradients(
    m: int, h: int, v: int, chunk_rows: int | None, temperature: float, bias: bool
) -> None:
    """A small problem keeps its probabilities for the backward: same values and gradients."""
    g = gen("kept", m, h, v, chunk_rows, temperature, bias)
    hidden, weight, b = make_lm_head(g, (m,), h, v, bias=bias)
    targets = make_targets(g, (m,), v)
    coeff = torch.randn(m, generator=g, dtype=F64).float()
    results = []
    for budget in (rk.DEFAULT_MEMORY_BUDGET, 8 * m * v * 4 - 1):  # kept; one byte short
        inputs = [
            t.detach().clone().requires_grad_(True) for t in (hidden, weight, b) if t is not None
        ]
        hb, wb, bb = inputs[0], inputs[1], inputs[2] if bias else None
        logp = rk.fused_logprobs(hb, wb, targets, bb, temperature, chunk_rows, memory_budget=budget)
        assert isinstance(logp, torch.Tensor)
        kept = logp.grad_fn.probs  # type: ignore[union-attr]
        assert (kept is not None) == (budget == rk.DEFAULT_MEMORY_BUDGET)
        (coeff * logp).sum().backward(retain_graph=True)
        first = [t.grad.clone() for t in inputs]  # type: ignore[union-attr]
        for t in inputs:
            t.grad = None
        (coeff * logp).sum().backward()  # a second backward: the kept tiles are unchanged
        for a, t in zip(first, inputs, strict=True):
            # bit-exact: the same backward run twice on the same kept tiles
            assert torch.equal(t.grad, a)
        results.append((logp.detach(), first))
    (kept_lp, kept_grads), (re_lp, re_grads) = results
    assert_close(kept_lp, re_lp, "logprobs", **token_tol(hidden, weight, b, temperature))
    for a, r in zip(kept_grads, re_grads, strict=True):
        assert_close(a, r, "gradient", **lm_tol(hidden, weight))
    n_logp = naive_logprobs(hidden, weight, targets, b, temperature)[0]
    assert_close(kept_lp, n_logp, "logprobs", **token_tol(hidden, weight, b, temperature))


def test_probabilities_are_kept_for_any_gradient_but_not_with_entropy() -> None:
    g = gen("kept-when")
    hidden, weight, _ = make_lm_head(g, (20,), 8, 50, bias=False)
    targets = make_targets(g, (20,), 50)
    logp, _ = rk.fused_logprobs(hidden, weight, targets, with_entropy=True)
    assert logp.grad_fn.probs is None  # type: ignore[union-attr]
    # only the weight trained (a full fine-tune of the head): kept, and its gradient exact
    w = weight.detach().clone().requires_grad_(True)
    only_w = rk.fused_logprobs(hidden.detach(), w, targets, temperature=0.8)
    assert isinstance(only_w, torch.Tensor)
    assert only_w.grad_fn.probs is not None  # type: ignore[union-attr]
    only_w.sum().backward()
    w_naive = weight.detach().clone().requires_grad_(True)
    naive_logprobs(hidden.detach(), w_naive, targets, None, 0.8)[0].sum().backward()
    assert_close(w.grad, w_naive.grad, "weight gradient", **lm_tol(hidden, weight))


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("chunk_rows", [7, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_a_frozen_head_projects_the_probabilities_in_the_forward(
    chunk_rows: int | None, temperature: float, bias: bool, dtype: torch.dtype
) -> None:
    """Only ``hidden`` needs a gradient and no entropies: the forward keeps ``p W`` [M, H], not
    the tiles, and the backward runs no GEMM. Its gradient is the kept-probability path's (in
    bf16 too: both upcast on the CPU, and round the fp32 gradient once at the end)."""
    m, h, v = 37, 16, 97
    g = gen("project", chunk_rows, temperature, bias)
    hidden, weight, b = make_lm_head(g, (m,), h, v, bias=bias, dtype=dtype)
    targets = make_targets(g, (m,), v)
    coeff = torch.randn(m, generator=g, dtype=F64).float()
    frozen_b = None if b is None else b.detach()

    hp = hidden.detach().clone().requires_grad_(True)
    logp = rk.fused_logprobs(hp, weight.detach(), targets, frozen_b, temperature, chunk_rows)
    assert isinstance(logp, torch.Tensor)
    fn: Any = logp.grad_fn
    assert fn.probs is None
    saved = [tuple(t.shape) for t in fn.saved_tensors if t is not None]
    assert saved == [(v, h), (m,), (m, h)]  # the weight, the targets, p W: no [M, V] tile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (gp,) = torch.autograd.grad((coeff * logp).sum(), [hp], retain_graph=True)
    gemms = [e.key for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm")]
    assert gemms == [], gemms
    (again,) = torch.autograd.grad((coeff * logp).sum(), [hp])
    assert torch.equal(again, gp)  # bit-exact: the same elementwise backward twice

    # the weight trained too: the probabilities are kept, and the hidden gradient is formed by
    # the same operations (p W, minus W_y, times -g) on the same tiles
    hk = hidden.detach().clone().requires_grad_(True)
    wk = weight.detach().clone().requires_grad_(True)
    kept = rk.fused_logprobs(hk, wk, targets, frozen_b, temperature, chunk_rows)
    assert isinstance(kept, torch.Tensor)
    assert kept.grad_fn.probs is not None  # type: ignore[union-attr]
    gk, _ = torch.autograd.grad((coeff * kept).sum(), [hk, wk])
    assert torch.equal(kept, logp)  # bit-exact: the same forward kernels on the same inputs
    assert torch.equal(gk, gp)  # bit-exact: the same operations, see above

    assert gp.dtype == dtype
    if dtype != F32:
        return  # the kept path's half-precision accuracy is test_low_precision_upcast's
    hn = hidden.detach().clone().requires_grad_(True)
    naive = naive_logprobs(hn, weight.detach(), targets, frozen_b, temperature)[0]
    (gn,) = torch.autograd.grad((coeff * naive).sum(), [hn])
    assert_grads_close([gp], [gn], ("hidden",), **lm_tol(hidden, weight))


# --------------------------------------------------------------------------- memory


def _largest_allocation(fn: Any) -> int:
    """Largest net allocation (bytes) of any single op while running ``fn`` (CPU allocator)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes = [int(e.self_cpu_memory_usage) for e in prof.events()]
    sizes += [int(e.cpu_memory_usage) for e in prof.events() if e.name == "[memory]"]
    return max(sizes, default=0)


def test_profiler_sees_full_logits() -> None:
    """Calibration: the measurement does see a naive [M, V] fp32 allocation."""
    g = gen("calibrate")
    m, v = 512, 4096
    hidden, weight, _ = make_lm_head(g, (m,), 16, v, bias=False)
    targets = make_targets(g, (m,), v)

    def naive() -> None:
        naive_logprobs(hidden, weight, targets)[0].sum().backward()

    assert _largest_allocation(naive) >= m * v * 4


@pytest.mark.parametrize(
    "call",
    [
        {"chunk_rows": 64},
        {"chunk_rows": None, "memory_budget": 64 * 4096 * 4},
    ],
    ids=["chunk_rows", "memory_budget"],
)
def test_never_allocates_full_logits(call: dict[str, Any]) -> None:
    g = gen("memory")
    m, v = 2048, 4096
    hidden, weight, b = make_lm_head(g, (m,), 16, v, bias=True)
    targets = make_targets(g, (m,), v)
    coeff = torch.randn(m, generator=g, dtype=F64).float()

    def fused() -> None:
        logp, ent = rk.fused_logprobs(hidden, weight, targets, b, 0.9, with_entropy=True, **call)
        (logp + coeff * ent).sum().backward()

    largest = _largest_allocation(fused)
    full = m * v * 4
    assert largest < full // 4, f"largest single allocation {largest} B vs full logits {full} B"
    assert hidden.grad is not None
    assert weight.grad is not None


@pytest.mark.parametrize(
    "call", [{"half_gemms": True}, {"vocab_chunk": 64}], ids=["half_gemms", "vocab_tiles"]
)
def test_a_bfloat16_backward_keeps_no_float32_hidden_gradient(call: dict[str, Any]) -> None:
    """With half-precision GEMMs or vocabulary tiles the backward writes each chunk's hidden
    gradient in the input dtype: no [M, H] fp32 buffer, and the same bits as rounding one at
    the end (the fp32 path's gradient)."""
    g = gen("bf16-grad-h")
    m, h, v = 4096, 64, 256
    hidden, weight, _ = make_lm_head(g, (m,), h, v, bias=False, dtype=torch.bfloat16)
    targets = make_targets(g, (m,), v)
    coeff = torch.randn(m, generator=g, dtype=F64).float()
    hp = hidden.detach().clone().requires_grad_(True)
    kw = {"chunk_rows": 64, "memory_budget": 2**20, **call}
    logp = rk.fused_logprobs(hp, weight.detach(), targets, None, 0.9, **kw)
    assert isinstance(logp, torch.Tensor)
    grads: list[torch.Tensor] = []

    def backward() -> None:
        grads.extend(torch.autograd.grad((coeff * logp).sum(), [hp]))

    largest = _largest_allocation(backward)
    assert grads[0].dtype == torch.bfloat16
    assert largest < m * h * 4, f"largest single allocation {largest} B, [M, H] fp32 {m * h * 4} B"
    # against float64 on the same rounded inputs: fp32 sums, stored in bfloat16
    h64 = hidden.detach().double().requires_grad_(True)
    ref = naive_logprobs(h64, weight.detach().double(), targets, None, 0.9)[0]
    (g64,) = torch.autograd.grad((coeff.double() * ref).sum(), [h64])
    assert_close(grads[0], g64, "grad hidden", **lm_tol(h64, weight), **stored_in(torch.bfloat16))
