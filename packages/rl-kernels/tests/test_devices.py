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


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_fused_logprobs_match_float64(device: str, dtype: torch.dtype) -> None:
    x = _inputs(device, dtype)
    h, w = _leaves(x, device, dtype)
    logp = rk.fused_logprobs(h.reshape(-1, H), w, x["targets"].reshape(-1).to(device))
    assert isinstance(logp, torch.Tensor)
    assert logp.device.type == torch.device(device).type, logp.device
    got_grads = lib.grads(logp.sum(), [h, w])

    h64, w64 = _leaves(x, "cpu", F64)
    ref, _ = lib.naive_logprobs(h64.reshape(-1, H), w64, x["targets"].reshape(-1), upcast=False)
    ref_grads = lib.grads(ref.sum(), [h64, w64])
    # computed in float32 whatever the input dtype: the float32 tolerance on the log-probs
    lib.assert_close(logp.cpu(), ref, f"logprobs {device} {dtype}", dtype=torch.float32,
                     **lib.token_tol(h64, w64))  # fmt: skip
    for got, exp, name in zip(got_grads, ref_grads, ("hidden", "weight"), strict=True):
        assert got is not None and exp is not None
        assert got.dtype == dtype and got.device.type == torch.device(device).type
        lib.assert_close(got.cpu(), exp, f"grad {name} {device} {dtype}",
                         **lib.lm_tol(h64, w64), dtype=lib.tolerance.lower_precision(dtype, torch.float32))  # fmt: skip


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
                         dtype=lib.tolerance.lower_precision(dtype, torch.float32))  # fmt: skip


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
