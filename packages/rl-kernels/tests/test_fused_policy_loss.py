"""``fused_policy_loss`` vs the spec's naive composition (full logits + rl_losses).

Loss, gradients (hidden [N, T, H], weight, bias), the detached parts (policy / KL / entropy
loss), diagnostics, ``kl_mean``, ``entropy_mean``, ``logprobs`` and ``entropies`` must match
the naive fp32 composition to rl_testing.tolerance's bound (kernels_testlib.lm_tol and
token_tol; gradients scaled by the largest reference entry), for every objective variant, aggregation, normaliser, on- and
off-policy, KL kinds / clamp / straight-through gradient, entropy bonus, rollout correction,
IS weights, masks with empty rows and holes, temperature and bias. Also: gradient
accumulation over micro-batches with a global normaliser, and masked positions holding NaN
hidden rows and out-of-range targets change nothing.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
import rl_kernels as rk
import torch
from kernels_testlib import (
    AGGREGATIONS,
    DIAG,
    F32,
    F64,
    OBJECTIVE_VARIANTS,
    assert_close,
    assert_grads_close,
    garbage,
    gen,
    grads,
    lm_tol,
    make_lm_head,
    make_mask,
    make_targets,
    naive_logprobs,
    naive_policy_loss,
    rand,
    randint,
    through_logprobs_scale,
    token_tol,
)
from torch.profiler import ProfilerActivity, profile

N, T, H, V = 6, 9, 16, 97
CHUNKS: tuple[int | None, ...] = (None, 1, 7, 1000)
TEMPERATURES = (1.0, 0.8, 1.25)


# --------------------------------------------------------------------------- cases


def make_case(
    key: tuple[Any, ...],
    *,
    n: int = N,
    t: int = T,
    h: int = H,
    v: int = V,
    bias: bool | None = None,
    temperature: float | None = None,
    adv_per_token: bool | None = None,
    old: bool = True,
    ref: bool = False,
    sampling: bool = False,
    is_weights: bool = False,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype = F32,
) -> dict[str, Any]:
    """Tensors for one call; knobs left as None are drawn from the key's generator.

    old / ref / sampling log-probs are the naive log-probs plus 0.3-std noise (finite garbage
    at masked positions), so ratios are spread around 1 and clipping is active on some tokens.
    """
    g = gen(*key)
    if bias is None:
        bias = rand(g) < 0.5
    if temperature is None:
        temperature = TEMPERATURES[randint(g, 0, len(TEMPERATURES))]
    if adv_per_token is None:
        adv_per_token = rand(g) < 0.5
    hidden, weight, b = make_lm_head(g, (n, t), h, v, bias=bias, dtype=dtype)
    targets = make_targets(g, (n, t), v)
    m = make_mask(g, n, t) if mask is None else mask
    with torch.no_grad():
        base = naive_logprobs(
            hidden.reshape(n * t, h), weight, targets.reshape(-1), b, temperature
        )[0].reshape(n, t)

    def near(x: torch.Tensor) -> torch.Tensor:
        noisy = x + 0.3 * torch.randn(n, t, generator=g, dtype=F64).float()
        return torch.where(m, noisy, garbage(g, (n, t)))

    case: dict[str, Any] = {
        "hidden": hidden,
        "weight": weight,
        "targets": targets,
        "mask": m,
        "advantages": (
            torch.where(m, torch.randn(n, t, generator=g, dtype=F64).float(), garbage(g, (n, t)))
            if adv_per_token
            else torch.randn(n, generator=g, dtype=F64).float()
        ),
        "old_logprobs": near(base) if old else None,
        "ref_logprobs": near(base) if ref else None,
        "bias": b,
        "temperature": temperature,
    }
    if sampling:
        assert old
        case["sampling_logprobs"] = near(case["old_logprobs"])
    if is_weights:
        w = torch.exp(0.3 * torch.randn(n, t, generator=g, dtype=F64)).float()
        case["is_weights"] = torch.where(m, w, garbage(g, (n, t)))
    return case


def _positional(case: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    args = [
        case["hidden"],
        case["weight"],
        case["targets"],
        case["mask"],
        case["advantages"],
        case.get("old_logprobs"),
        case.get("ref_logprobs"),
        case.get("sampling_logprobs"),
    ]
    rest = {
        k: x
        for k, x in case.items()
        if k
        not in {
            "hidden",
            "weight",
            "targets",
            "mask",
            "advantages",
            "old_logprobs",
            "ref_logprobs",
            "sampling_logprobs",
        }
    }
    return args, rest


def run_fused(case: dict[str, Any], **kwargs: Any) -> Any:
    args, rest = _positional(case)
    return rk.fused_policy_loss(*args, **rest, **kwargs)


def run_naive(case: dict[str, Any], **kwargs: Any) -> Any:
    args, rest = _positional(case)
    kwargs = {
        k: x
        for k, x in kwargs.items()
        if k not in {"chunk_rows", "return_entropy", "memory_budget"}
    }
    return naive_policy_loss(*args, **rest, **kwargs)


def leaves(case: dict[str, Any]) -> list[torch.Tensor | None]:
    return [case["hidden"], case["weight"], case["bias"]]


def case_tol(case: dict[str, Any]) -> dict[str, Any]:
    """Tolerance of the loss, its parts and gradients: ``lm_tol`` of the case's lm head."""
    return lm_tol(case["hidden"], case["weight"])


def check_against_naive(case: dict[str, Any], **kwargs: Any) -> Any:
    """Run both paths, compare everything the spec pins down; return the fused output."""
    out = run_fused(case, **kwargs)
    ref = run_naive(case, **kwargs)
    mask = ref.mask
    tok = token_tol(case["hidden"], case["weight"], case["bias"], case["temperature"])

    assert isinstance(out.loss, torch.Tensor)
    assert out.loss.shape == ()
    assert out.loss.dtype == F32
    tol = case_tol(case)
    kl_loss = ref.kl.loss if ref.kl is not None else torch.zeros(())
    kl_mean = ref.kl.kl_mean if ref.kl is not None else 0.0
    # the losses' rounding scales with the log-probs they are made of (their own scale)
    losses = {"policy_loss": ref.policy.loss, "kl_loss": kl_loss, "entropy_loss": ref.entropy.loss}
    scales = {name: through_logprobs_scale(v, ref) for name, v in losses.items()}
    assert_close(out.loss, ref.loss, "loss", **tol, scale=through_logprobs_scale(ref.loss, ref))
    assert_grads_close(grads(out.loss, leaves(case)), grads(ref.loss, leaves(case)), **tol)

    for name, expected in (
        *losses.items(),
        ("kl_mean", kl_mean),
        *((d, getattr(ref.policy, d)) for d in DIAG),
    ):
        value = getattr(out, name)
        assert isinstance(value, torch.Tensor), name
        assert value.numel() == 1, name
        assert not value.requires_grad, f"{name} must be detached"
        assert_close(value, expected, name, **tol, scale=scales.get(name))

    entropies_expected = kwargs.get("return_entropy", False) or kwargs.get("entropy_coef", 0.0) > 0
    if entropies_expected:
        assert out.entropies is not None
        assert out.entropies.shape == mask.shape
        assert not out.entropies.requires_grad
        assert_close(out.entropies[mask], ref.ent[mask], "entropies", **tok)
        assert_close(out.entropy_mean, ref.entropy.entropy_mean, "entropy_mean", **tok)
    else:
        assert out.entropies is None
        assert_close(out.entropy_mean, 0.0, "entropy_mean", **tol)
    assert not out.entropy_mean.requires_grad

    assert out.logprobs.shape == mask.shape
    assert out.logprobs.dtype == F32
    assert not out.logprobs.requires_grad
    assert_close(out.logprobs[mask], ref.logp[mask], "logprobs", **tok)
    assert bool((out.logprobs[~mask] == 0).all()), "logprobs must be 0 at masked positions"
    return out


def _normalizer(case: dict[str, Any], aggregation: str, as_tensor: bool) -> float | torch.Tensor:
    """An arbitrary positive global denominator (not the local count)."""
    m = case["mask"]
    local = int(m.sum()) if aggregation == "token_mean" else int(m.any(dim=1).sum())
    value = 1.7 * local + 0.3
    return torch.tensor(value) if as_tensor else value


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("normalizer", [False, True])
@pytest.mark.parametrize("old", [False, True], ids=["on_policy", "old_given"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("variant", list(OBJECTIVE_VARIANTS))
def test_objectives_and_aggregations(
    variant: str, aggregation: str, old: bool, normalizer: bool
) -> None:
    key = ("matrix", variant, aggregation, old, normalizer)
    objective, kwargs = OBJECTIVE_VARIANTS[variant]
    case = make_case(key, old=old)
    g = gen(*key, "knobs")
    extra: dict[str, Any] = {"chunk_rows": CHUNKS[randint(g, 0, len(CHUNKS))]}
    if normalizer:
        extra["normalizer"] = _normalizer(case, aggregation, as_tensor=rand(g) < 0.3)
    if aggregation == "seq_mean_token_sum_norm" and rand(g) < 0.5:
        extra["max_length"] = T + 3
    check_against_naive(case, objective=objective, aggregation=aggregation, **extra, **kwargs)


@pytest.mark.parametrize("chunk_rows", CHUNKS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.5])
def test_temperature_bias_chunking(temperature: float, bias: bool, chunk_rows: int | None) -> None:
    key = ("temp-bias", temperature, bias, chunk_rows)
    case = make_case(key, bias=bias, temperature=temperature, ref=True)
    check_against_naive(
        case,
        chunk_rows=chunk_rows,
        kl_coef=0.1,
        entropy_coef=0.01,
        clip_low=0.2,
        clip_high=0.28,
    )


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize(
    ("kl_clamp", "kl_grad_kind"),
    [(None, None), (0.05, None), (None, "k2"), (0.05, "k1")],
    ids=["plain", "clamp", "grad_k2", "clamp_grad_k1"],
)
@pytest.mark.parametrize("kl_kind", ["k1", "k2", "k3", "abs"])
def test_kl_penalty(
    kl_kind: str, kl_clamp: float | None, kl_grad_kind: str | None, aggregation: str
) -> None:
    key = ("kl", kl_kind, kl_clamp, kl_grad_kind, aggregation)
    case = make_case(key, ref=True)
    out = check_against_naive(
        case,
        aggregation=aggregation,
        kl_coef=0.2,
        kl_kind=kl_kind,
        kl_clamp=kl_clamp,
        kl_grad_kind=kl_grad_kind,
        chunk_rows=5,
    )
    assert float(out.kl_loss) != 0.0


def test_kl_mean_reported_with_zero_coef() -> None:
    """ref given with kl_coef = 0: no KL loss, kl_mean still the masked mean estimate."""
    case = make_case(("kl-zero",), ref=True)
    out = check_against_naive(case, kl_coef=0.0, kl_kind="k3")
    assert float(out.kl_mean) > 0.0
    assert float(out.kl_loss) == 0.0


def test_no_ref_means_no_kl() -> None:
    """Without ``ref_logprobs`` (``kl_coef`` 0: a positive one raises, see test_errors.py)."""
    case = make_case(("no-ref",), ref=False)
    out = check_against_naive(case)
    assert float(out.kl_loss) == 0.0
    assert float(out.kl_mean) == 0.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(
    ("entropy_coef", "return_entropy"),
    [(0.0, False), (0.0, True), (0.01, False), (0.3, True)],
)
def test_entropy(entropy_coef: float, return_entropy: bool, aggregation: str) -> None:
    key = ("entropy", entropy_coef, return_entropy, aggregation)
    case = make_case(key)
    out = check_against_naive(
        case,
        aggregation=aggregation,
        entropy_coef=entropy_coef,
        return_entropy=return_entropy,
        chunk_rows=4,
    )
    if entropy_coef > 0:
        assert float(out.entropy_loss) < 0.0  # a bonus: minimising it raises the entropy


@pytest.mark.parametrize("cap", [2.0, 1.2])
@pytest.mark.parametrize("objective", ["ppo", "cispo"])
@pytest.mark.parametrize(
    ("level", "mode", "lower"),
    [
        ("token", "truncate", None),
        ("sequence", "truncate", None),
        ("token", "mask", None),
        ("token", "mask", 0.8),
        ("sequence", "mask", None),
        ("sequence", "mask", 0.5),
    ],
)
def test_rollout_correction(
    level: str, mode: str, lower: float | None, objective: str, cap: float
) -> None:
    key = ("correction", level, mode, lower, objective, cap)
    case = make_case(key, sampling=True, ref=True)
    check_against_naive(
        case,
        objective=objective,
        correction_level=level,
        correction_mode=mode,
        correction_cap=cap,
        correction_lower=lower,
        kl_coef=0.05,
        entropy_coef=0.01,
        chunk_rows=7,
    )


@pytest.mark.parametrize("with_sampling", [False, True])
@pytest.mark.parametrize("variant", ["ppo-dual_clip", "cispo-two_sided", "reinforce-ratio", "sapo"])
def test_is_weights(variant: str, with_sampling: bool) -> None:
    """Explicit is_weights take precedence over sampling_logprobs (spec: first branch)."""
    key = ("is-weights", variant, with_sampling)
    objective, kwargs = OBJECTIVE_VARIANTS[variant]
    case = make_case(key, is_weights=True, sampling=with_sampling)
    check_against_naive(
        case, objective=objective, correction_mode="mask", correction_cap=1.1, **kwargs
    )


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("variant", ["ppo-clip_high", "cispo-upper", "reinforce-logprob", "sapo"])
def test_everything_at_once(variant: str, aggregation: str) -> None:
    key = ("all", variant, aggregation)
    objective, kwargs = OBJECTIVE_VARIANTS[variant]
    case = make_case(key, bias=True, temperature=0.8, ref=True, sampling=True)
    check_against_naive(
        case,
        objective=objective,
        aggregation=aggregation,
        normalizer=_normalizer(case, aggregation, as_tensor=False),
        max_length=T + 2,
        kl_coef=0.1,
        kl_kind="k3",
        kl_clamp=0.5,
        kl_grad_kind="k2",
        entropy_coef=0.02,
        correction_level="token",
        correction_mode="truncate",
        correction_cap=1.5,
        chunk_rows=11,
        return_entropy=True,
        **kwargs,
    )


def test_larger_vocab_and_hidden() -> None:
    case = make_case(("large",), n=5, t=40, h=32, v=1001, ref=True)
    check_against_naive(case, kl_coef=0.1, entropy_coef=0.01, chunk_rows=16)


# --------------------------------------------------------------------------- edge cases


def test_all_masked() -> None:
    mask = torch.zeros(N, T, dtype=torch.bool)
    case = make_case(("all-masked",), mask=mask, ref=True, bias=True)
    out = run_fused(case, kl_coef=0.1, entropy_coef=0.1)
    assert torch.isfinite(out.loss)
    assert float(out.loss.detach()) == 0.0
    for gr in grads(out.loss, leaves(case)):
        assert gr is not None
        assert bool((gr == 0).all())
    assert bool((out.logprobs == 0).all())
    for name in ("policy_loss", "kl_loss", "entropy_loss", "kl_mean", "entropy_mean", *DIAG):
        assert torch.isfinite(getattr(out, name)), name


def test_grad_output_scales_gradients() -> None:
    case = make_case(("scale",), ref=True)
    kwargs: dict[str, Any] = {"kl_coef": 0.1, "entropy_coef": 0.01, "chunk_rows": 7}
    out = run_fused(case, **kwargs)
    ref = run_naive(case, **kwargs)
    got = grads(3.0 * out.loss, leaves(case))
    expected = grads(3.0 * ref.loss, leaves(case))
    assert_grads_close(got, expected, **case_tol(case))


def test_backward_into_leaf_grads() -> None:
    """The ordinary training step: loss.backward() fills .grad of the leaves."""
    case = make_case(("backward",), bias=True, ref=True)
    kwargs: dict[str, Any] = {"kl_coef": 0.1, "entropy_coef": 0.01, "chunk_rows": 7}
    expected = grads(run_naive(case, **kwargs).loss, leaves(case))
    run_fused(case, **kwargs).loss.backward()
    got = [x.grad for x in leaves(case) if x is not None]
    assert_grads_close(got, expected, **case_tol(case))


def test_noncontiguous_shifted_hidden() -> None:
    """hidden[:, :-1] of a model's output (the usual next-token shift) is not contiguous."""
    g = gen("shift")
    full, weight, b = make_lm_head(g, (N, T + 1), H, V, bias=True)
    case = make_case(("shift",), bias=True, ref=True)
    case["hidden"], case["weight"], case["bias"] = full[:, :-1], weight, b
    case["old_logprobs"] = None
    kwargs: dict[str, Any] = {"kl_coef": 0.1, "entropy_coef": 0.01, "chunk_rows": 5}
    out = run_fused(case, **kwargs)
    ref = run_naive(case, **kwargs)
    tol = case_tol(case)
    assert_close(out.loss, ref.loss, "loss", **tol)
    assert_grads_close(
        grads(out.loss, [full, weight, b]), grads(ref.loss, [full, weight, b]), **tol
    )


def test_frozen_lm_head() -> None:
    case = make_case(("frozen",), bias=True)
    case["weight"] = case["weight"].detach()
    case["bias"] = case["bias"].detach()
    out = run_fused(case, chunk_rows=3)
    ref = run_naive(case)
    (got,) = torch.autograd.grad(out.loss, [case["hidden"]])
    (expected,) = torch.autograd.grad(ref.loss, [case["hidden"]])
    assert_grads_close([got], [expected], ("hidden",), **case_tol(case))


def test_under_no_grad() -> None:
    case = make_case(("no-grad",), ref=True)
    kwargs: dict[str, Any] = {"kl_coef": 0.1, "entropy_coef": 0.01}
    with torch.no_grad():
        out = run_fused(case, **kwargs)
        ref = run_naive(case, **kwargs)
    assert not out.loss.requires_grad
    assert_close(out.loss, ref.loss, "loss", **case_tol(case))


def test_metrics() -> None:
    case = make_case(("metrics",), ref=True)
    out = run_fused(case, kl_coef=0.1, entropy_coef=0.01)
    assert isinstance(out, rk.FusedPolicyLossOutput)
    metrics = out.metrics()
    assert isinstance(metrics, dict)
    expected = {"policy_loss", "kl_loss", "entropy_loss", "kl_mean", "entropy_mean", *DIAG}
    assert expected <= set(metrics)
    for name in expected:
        assert isinstance(metrics[name], float), name
        # bit-exact: metrics() is float() of the same tensors
        assert metrics[name] == float(getattr(out, name))
    assert "logprobs" not in metrics
    assert "entropies" not in metrics
    names = {f.name for f in fields(out)}
    assert {"loss", "logprobs", "entropies", *expected} <= names


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype: torch.dtype) -> None:
    """bf16 / fp16 hidden and lm_head: fp32 log-probs and loss, gradients in the input dtype."""
    case = make_case(("lowp", str(dtype)), bias=True, ref=True, dtype=dtype)
    kwargs: dict[str, Any] = {"kl_coef": 0.1, "entropy_coef": 0.01, "chunk_rows": 7}
    out = run_fused(case, **kwargs)
    assert out.loss.dtype == F32
    assert out.logprobs.dtype == F32
    up = dict(case)
    up["hidden"] = case["hidden"].detach().float().requires_grad_(True)
    up["weight"] = case["weight"].detach().float().requires_grad_(True)
    up["bias"] = case["bias"].detach().float().requires_grad_(True)
    ref = run_naive(up, **kwargs)
    # fp32 on both sides, from the same rounded inputs
    assert_close(out.loss, ref.loss, "loss", **case_tol(up))
    m = ref.mask
    tok = token_tol(up["hidden"], up["weight"], up["bias"], up["temperature"])
    assert_close(out.logprobs[m], ref.logp[m], "logprobs", **tok)
    got = grads(out.loss, leaves(case))
    expected = grads(ref.loss, leaves(up))
    for a, e, name in zip(got, expected, ("hidden", "weight", "bias"), strict=True):
        assert a is not None
        assert e is not None
        assert a.dtype == dtype, f"grad {name} must be in the input dtype"
        # fp32 gradients rounded once to the input dtype: one rounding in that dtype
        assert_close(a, e, f"grad {name}", dtype=dtype)


# --------------------------------------------------------------------------- accumulation


def _rows(case: dict[str, Any], sl: slice) -> dict[str, Any]:
    part = dict(case)
    for k in (
        "hidden",
        "targets",
        "mask",
        "advantages",
        "old_logprobs",
        "ref_logprobs",
        "sampling_logprobs",
        "is_weights",
    ):
        if part.get(k) is not None:
            part[k] = case[k][sl]
    return part


ACCUM_SETUPS: dict[str, dict[str, Any]] = {
    "on_policy": {"case": {"old": False}, "kwargs": {}},
    "off_policy_kl_entropy": {
        "case": {"ref": True},
        "kwargs": {"kl_coef": 0.1, "kl_kind": "k3", "entropy_coef": 0.02},
    },
    "tis": {
        "case": {"ref": True, "sampling": True},
        "kwargs": {"kl_coef": 0.1, "kl_kind": "k2", "correction_cap": 1.5},
    },
    "is_weights": {"case": {"is_weights": True}, "kwargs": {"entropy_coef": 0.05}},
}


@pytest.mark.parametrize("setup", list(ACCUM_SETUPS))
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("objective", ["ppo", "cispo", "reinforce", "sapo"])
def test_gradient_accumulation(objective: str, aggregation: str, setup: str) -> None:
    n, t = 7, 8
    key = ("accum", objective, aggregation, setup)
    case = make_case(key, n=n, t=t, bias=True, **ACCUM_SETUPS[setup]["case"])
    kwargs = dict(ACCUM_SETUPS[setup]["kwargs"], objective=objective, aggregation=aggregation)
    if aggregation == "seq_mean_token_sum_norm":
        kwargs["max_length"] = t
    full = run_fused(case, **kwargs)
    full_grads = grads(full.loss, leaves(case))
    naive = run_naive(case, **kwargs)

    m = case["mask"]
    global_count = int(m.sum()) if aggregation == "token_mean" else int(m.any(dim=1).sum())
    micro = [
        run_fused(_rows(case, sl), normalizer=global_count, chunk_rows=5, **kwargs)
        for sl in (slice(0, 3), slice(3, n))
    ]
    total = micro[0].loss + micro[1].loss
    tol = case_tol(case)
    assert_close(total, full.loss, "accumulated loss", **tol)
    assert_close(total, naive.loss, "accumulated loss vs naive", **tol)
    acc_grads = grads(total, leaves(case))
    assert_grads_close(acc_grads, full_grads, **tol)
    assert_grads_close(acc_grads, grads(naive.loss, leaves(case)), **tol)


# --------------------------------------------------------------------------- masked positions


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("variant", ["ppo-dual_clip", "cispo-two_sided", "sapo"])
def test_masked_positions_change_nothing(variant: str, aggregation: str) -> None:
    key = ("masked", variant, aggregation)
    objective, okw = OBJECTIVE_VARIANTS[variant]
    case = make_case(key, bias=True, adv_per_token=True, ref=True, sampling=True)
    m = case["mask"]
    assert bool((~m).any())
    kwargs: dict[str, Any] = dict(
        okw,
        objective=objective,
        aggregation=aggregation,
        kl_coef=0.1,
        entropy_coef=0.05,
        return_entropy=True,
        chunk_rows=4,
    )
    clean = run_fused(case, **kwargs)
    clean_grads = grads(clean.loss, leaves(case))

    dirty = dict(case)
    hidden = case["hidden"].detach().clone()
    hidden[~m] = float("nan")
    hidden.requires_grad_(True)
    dirty["hidden"] = hidden
    targets = case["targets"].clone()
    bad = torch.tensor([-100, V, V + 3, -1])
    targets[~m] = bad[torch.arange(int((~m).sum())) % 4]
    dirty["targets"] = targets
    nan = torch.tensor(float("nan"))
    for k in ("advantages", "old_logprobs", "ref_logprobs", "sampling_logprobs"):
        dirty[k] = torch.where(m, case[k], nan)
    out = run_fused(dirty, **kwargs)
    dirty_grads = grads(out.loss, leaves(dirty))

    tol = case_tol(case)
    assert_close(out.loss, clean.loss, "loss", **tol)
    assert_grads_close(dirty_grads[1:], clean_grads[1:], ("weight", "bias"), **tol)
    gh = dirty_grads[0]
    assert gh is not None
    assert bool((gh[~m] == 0).all()), "grad of hidden must be 0 at masked positions"
    clean_gh = clean_grads[0]
    assert clean_gh is not None
    assert_grads_close([gh[m]], [clean_gh[m]], ("hidden",), **tol)
    for name in ("policy_loss", "kl_loss", "entropy_loss", "kl_mean", "entropy_mean", *DIAG):
        assert_close(getattr(out, name), getattr(clean, name), name, **tol)
    tok = token_tol(case["hidden"], case["weight"], case["bias"], case["temperature"])
    assert_close(out.logprobs, clean.logprobs, "logprobs", **tok)
    assert bool((out.logprobs[~m] == 0).all())
    assert out.entropies is not None
    assert clean.entropies is not None
    assert_close(out.entropies[m], clean.entropies[m], "entropies", **tok)
    # and against the naive composition on the dirty inputs (it sanitises masked positions)
    check_against_naive(dirty, **kwargs)


# --------------------------------------------------------------------------- memory


def test_never_allocates_full_logits() -> None:
    n, t, v = 16, 128, 4096
    case = make_case(
        ("memory",), n=n, t=t, v=v, bias=True, ref=True, mask=torch.ones(n, t, dtype=torch.bool)
    )
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run_fused(case, kl_coef=0.1, entropy_coef=0.01, chunk_rows=64)
        out.loss.backward()
    sizes = [int(e.self_cpu_memory_usage) for e in prof.events()]
    sizes += [int(e.cpu_memory_usage) for e in prof.events() if e.name == "[memory]"]
    largest = max(sizes, default=0)
    full = n * t * v * 4
    assert largest < full // 4, f"largest single allocation {largest} B vs full logits {full} B"
    assert case["hidden"].grad is not None
