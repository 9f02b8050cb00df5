"""The fused kernels on every device and training dtype against a float64 CPU reference.

On CPU: float32. On CUDA (``pytest -m cuda``, ``nox -s gpu``): float32, bfloat16 and float16
inputs. The kernels compute in float32 (``upcast``), so log-probs and the loss are held to the
float32 tolerance whatever the input dtype; gradients come back in the input dtype and are held
to its tolerance. The reference: full float64 logits (kernels_testlib's ``naive_logprobs``) and
the rl-losses objective in float64, on the same (rounded) input values, on CPU.
"""

from __future__ import annotations

import kernels_testlib as lib
import pytest
import rl_kernels as rk
import rl_losses
import torch
from rl_testing.devices import DEVICES, dtypes_for

F64 = torch.float64
N, T, H, V = 3, 7, 32, 96


def _cases() -> list[tuple[object, torch.dtype]]:
    out = []
    for dev in DEVICES:
        for dtype in dtypes_for(dev.values[0]):
            out.append(pytest.param(dev.values[0], dtype, marks=dev.marks, id=f"{dev.id}-{dtype}"))
    return out


CASES = _cases()


def _inputs(device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = lib.gen("devices")
    hidden, weight, _ = lib.make_lm_head(g, (N, T), H, V, bias=False, dtype=F64)
    mask = lib.make_mask(g, N, T)
    mask[0] = True
    return {
        "hidden": hidden.detach().to(dtype),  # the rounded values both sides start from
        "weight": weight.detach().to(dtype),
        "targets": lib.make_targets(g, (N, T), V),
        "mask": mask,
        "advantages": torch.randn(N, generator=g, dtype=F64),
        "old": torch.randn(N, T, generator=g, dtype=F64) * 0.3 - 4.0,
    }


def _leaves(
    x: dict[str, torch.Tensor], device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    h = x["hidden"].to(device=device, dtype=dtype).requires_grad_(True)
    w = x["weight"].to(device=device, dtype=dtype).requires_grad_(True)
    return h, w


@pytest.mark.parametrize("head", ["trained", "frozen"])
@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_logprobs_match_float64(device: str, dtype: torch.dtype, head: str) -> None:
    """A frozen head (LoRA) takes the forward's ``p W`` projection where it computes in float32."""
    x = _inputs(device, dtype)
    h, w = _leaves(x, device, dtype)
    frozen = head == "frozen"
    w.requires_grad_(not frozen)
    logp = rk.fused_logprobs(h.reshape(-1, H), w, x["targets"].reshape(-1).to(device))
    assert isinstance(logp, torch.Tensor)
    assert logp.device.type == torch.device(device).type, logp.device
    got_grads = lib.grads(logp.sum(), [h, None if frozen else w])

    h64, w64 = _leaves(x, "cpu", F64)
    ref, _ = lib.naive_logprobs(h64.reshape(-1, H), w64, x["targets"].reshape(-1), upcast=False)
    ref_grads = lib.grads(ref.sum(), [h64, None if frozen else w64])
    # computed in float32 whatever the input dtype: the float32 tolerance on the log-probs
    lib.assert_close(logp.cpu(), ref, f"logprobs {device} {dtype}", dtype=torch.float32,
                     **lib.token_tol(h64, w64))  # fmt: skip
    for got, exp, name in zip(got_grads, ref_grads, ("hidden", "weight"), strict=True):
        if frozen and name == "weight":
            assert got is None and exp is None
            continue
        assert got is not None and exp is not None
        assert got.dtype == dtype and got.device.type == torch.device(device).type
        lib.assert_close(got.cpu(), exp, f"grad {name} {device} {dtype}",
                         **lib.lm_tol(h64, w64), **lib.stored_in(dtype))  # fmt: skip


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_policy_loss_matches_float64(device: str, dtype: torch.dtype) -> None:
    x = _inputs(device, dtype)
    h, w = _leaves(x, device, dtype)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.05}
    ref_lp = x["old"] + 0.1
    out = rk.fused_policy_loss(
        h, w, x["targets"].to(device), x["mask"].to(device), x["advantages"].to(device),
        x["old"].to(device), ref_lp.to(device), **kw,
    )  # fmt: skip
    assert out.loss.device.type == torch.device(device).type
    got_grads = lib.grads(out.loss, [h, w])

    h64, w64 = _leaves(x, "cpu", F64)
    logp64, _ = lib.naive_logprobs(h64.reshape(-1, H), w64, x["targets"].reshape(-1), upcast=False)
    logp64 = logp64.view(N, T)
    policy = rl_losses.clipped_surrogate(logp64, x["old"], x["advantages"], x["mask"],
                                         clip_low=0.2, clip_high=0.28)  # fmt: skip
    kl = rl_losses.kl_penalty(logp64, ref_lp, x["mask"], kind="k3", coef=0.05)
    ref_loss = policy.loss + kl.loss
    ref_grads = lib.grads(ref_loss, [h64, w64])
    tol = lib.lm_tol(h64, w64)
    lib.assert_close(out.loss.cpu(), ref_loss, f"loss {device} {dtype}", dtype=torch.float32,
                     **tol)  # fmt: skip
    for got, exp, name in zip(got_grads, ref_grads, ("hidden", "weight"), strict=True):
        assert got is not None and exp is not None
        lib.assert_close(got.cpu(), exp, f"grad {name} {device} {dtype}", **tol,
                         **lib.stored_in(dtype))  # fmt: skip


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_sum_pi_squared_matches_float64(device: str, dtype: torch.dtype) -> None:
    x = _inputs(device, dtype)
    h, w = (t.detach() for t in _leaves(x, device, dtype))
    got = rk.fused_logprobs(
        h.reshape(-1, H), w, x["targets"].reshape(-1).to(device), with_sum_pi_squared=True
    )
    assert isinstance(got, tuple)
    spi = got[-1]
    assert spi.device.type == torch.device(device).type
    z = x["hidden"].to(F64).reshape(-1, H) @ x["weight"].to(F64).T
    ref = torch.softmax(z, -1).square().sum(-1)
    lib.assert_close(spi.cpu(), ref, f"sum_pi_squared {device} {dtype}", dtype=torch.float32,
                     **lib.token_tol(x["hidden"].to(F64), x["weight"].to(F64)))  # fmt: skip


def _half_cases() -> list[object]:
    out = []
    for dev in DEVICES:
        for dtype in (torch.bfloat16, torch.float16):
            out.append(pytest.param(dev.values[0], dtype, marks=dev.marks, id=f"{dev.id}-{dtype}"))
    return out


@pytest.mark.parametrize(("device", "dtype"), _half_cases())
@pytest.mark.parametrize("path", ["keep", "recompute", "entropy", "tiles"])
def test_half_gemms_match_float64(device: str, dtype: torch.dtype, path: str) -> None:
    """GEMMs on the half-precision operands with fp32 results (the CUDA default; on CPU the same
    products from upcast operands), with a bias and a temperature, against float64."""
    g = lib.gen("half-gemms")
    hidden, weight, bias = lib.make_lm_head(g, (N * T,), H, V, bias=True, dtype=F64)
    targets = lib.make_targets(g, (N * T,), V)
    x = [t.detach().to(dtype) for t in (hidden, weight, bias)]  # the rounded values both use
    leaves = [t.to(device).requires_grad_(True) for t in x]
    budget = rk.DEFAULT_MEMORY_BUDGET if path == "keep" else 1
    out = rk.fused_logprobs(leaves[0], leaves[1], targets.to(device), leaves[2], temperature=0.7,
                            chunk_rows=8, with_entropy=path in ("entropy", "tiles"),
                            memory_budget=budget, half_gemms=True,
                            vocab_chunk=32 if path == "tiles" else None)  # fmt: skip
    logp, ent = (out, None) if isinstance(out, torch.Tensor) else out
    loss = logp.sum() + (ent.sum() * 0.3 if ent is not None else 0.0)
    got = lib.grads(loss, leaves)

    ref_leaves = [t.to(F64).requires_grad_(True) for t in x]
    z = (ref_leaves[0] @ ref_leaves[1].T + ref_leaves[2]) / 0.7
    lsm = torch.log_softmax(z, -1)
    ref_logp = lsm.gather(-1, targets[:, None])[:, 0]
    ref_loss = ref_logp.sum()
    if ent is not None:
        ref_ent = -(lsm.exp() * lsm).sum(-1)
        ref_loss = ref_loss + ref_ent.sum() * 0.3
        lib.assert_close(ent.cpu(), ref_ent, f"entropy {device} {dtype}", dtype=torch.float32,
                         **lib.token_tol(*ref_leaves, 0.7))  # fmt: skip
    expected = lib.grads(ref_loss, ref_leaves)
    tol = lib.lm_tol(ref_leaves[0], ref_leaves[1])
    lib.assert_close(logp.cpu(), ref_logp, f"logprobs {device} {dtype}", dtype=torch.float32,
                     **lib.token_tol(*ref_leaves, 0.7))  # fmt: skip
    for a, b, name in zip(got, expected, ("hidden", "weight", "bias"), strict=True):
        assert a is not None and b is not None and a.dtype == dtype
        lib.assert_close(a.cpu(), b, f"grad {name} {device} {dtype} {path}", **tol,
                         **lib.stored_in(dtype))  # fmt: skip


@pytest.mark.parametrize(("device", "dtype"), _half_cases())
def test_half_gemms_policy_loss_matches_plain(device: str, dtype: torch.dtype) -> None:
    """fused_policy_loss with half-precision GEMMs against its fp32-copy path, a trainable head."""
    x = _inputs(device, dtype)
    results = []
    for half in (True, False):
        h, w = _leaves(x, device, dtype)
        out = rk.fused_policy_loss(
            h, w, x["targets"].to(device), x["mask"].to(device), x["advantages"].to(device),
            x["old"].to(device), clip_low=0.2, clip_high=0.28, chunk_rows=5, half_gemms=half,
        )  # fmt: skip
        results.append((out.loss.detach(), *lib.grads(out.loss, [h, w])))
    h64, w64 = _leaves(x, "cpu", F64)
    tol = lib.lm_tol(h64, w64)
    lib.assert_close(results[0][0].cpu(), results[1][0].cpu().double(), "loss",
                     dtype=torch.float32, **tol)  # fmt: skip
    for a, b, name in zip(results[0][1:], results[1][1:], ("hidden", "weight"), strict=True):
        lib.assert_close(a.cpu(), b.cpu().double(), f"grad {name} {device} {dtype}", **tol,
                         **lib.stored_in(dtype))  # fmt: skip


def test_half_gemms_refuses_float32() -> None:
    h, w = torch.randn(4, H), torch.randn(V, H)
    with pytest.raises(ValueError, match="half_gemms=True"):
        rk.fused_logprobs(h, w, torch.zeros(4, dtype=torch.long), half_gemms=True)
