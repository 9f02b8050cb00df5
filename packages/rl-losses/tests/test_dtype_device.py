"""dtype / device follow the inputs (spec: "Pure functions; dtype/device follow inputs").

float32 inputs give float32 outputs close to the float64 result; on CUDA (when available) every
output lives on the input's device (``pytest -m cuda``, ``nox -s gpu``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import losses_testlib as lib
import pytest
import rl_losses as rl
import torch
from rl_testing.devices import needs_cuda

F64 = torch.float64


def _inputs(dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    g = lib.gen("dtype")
    n, t = 4, 5
    mask = lib.make_mask(g, n, t)
    mask[0] = True
    base = lib.make_policy_inputs(g, n, t, mask=mask, adv_per_seq=False, with_is=True)
    out = {
        "logprobs": base["logprobs"].detach(),
        "old_logprobs": base["old_logprobs"],
        "advantages": base["advantages"],
        "mask": mask,
        "turn_ids": base["turn_ids"],
        "is_weights": base["is_weights"],
        "values": torch.randn(n, t, generator=g, dtype=F64),
        "returns": torch.randn(n, t, generator=g, dtype=F64),
        "entropies": torch.rand(n, t, generator=g, dtype=F64) * 3,
    }
    res = {}
    for k, v in out.items():
        moved = v.to(device)
        res[k] = moved.to(dtype) if moved.is_floating_point() else moved
    res["logprobs"].requires_grad_(True)
    res["values"].requires_grad_(True)
    return res


def _policy(name: str, **kw: Any) -> Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]:
    def call(x: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        out = getattr(rl, name)(
            x["logprobs"],
            x["old_logprobs"],
            x["advantages"],
            x["mask"],
            is_weights=x["is_weights"],
            **kw,
        )
        return [out.loss, *(getattr(out, k) for k in lib.DIAG)]

    return call


CALLS: dict[str, Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]] = {
    "clipped_surrogate": _policy("clipped_surrogate", dual_clip=2.0, delta=1.5),
    "reinforce_loss": _policy("reinforce_loss", level="trajectory"),
    "gspo_loss": _policy("gspo_loss", clip_low=0.1, clip_high=0.2),
    "cispo_loss": _policy("cispo_loss", pooling="mean", level="trajectory"),
    "sapo_loss": _policy("sapo_loss"),
    "gmpo_loss": _policy("gmpo_loss"),
    "kl_cov_loss": _policy("kl_cov_loss", kl_cov_ratio=0.2),
    "turn_ppo": lambda x: _policy("clipped_surrogate", level="turn", turn_ids=x["turn_ids"])(x),
    "aggregate": lambda x: [rl.aggregate(x["values"], x["mask"], "seq_mean_token_mean")],
    "value_loss": lambda x: [
        rl.value_loss(x["values"], x["old_logprobs"], x["returns"], x["mask"], clip=0.2).loss
    ],
    "kl_penalty": lambda x: [rl.kl_penalty(x["logprobs"], x["old_logprobs"], x["mask"]).loss],
    "kl_estimate": lambda x: [rl.kl_estimate(x["logprobs"], x["old_logprobs"], "k3")],
    "entropy_bonus": lambda x: [rl.entropy_bonus(x["entropies"], x["mask"], coef=0.1).loss],
    "rollout_correction": lambda x: [
        rl.rollout_correction(x["old_logprobs"], x["logprobs"].detach(), x["mask"]).weights
    ],
    "to_units": lambda x: [rl.to_units(x["values"], x["mask"], "trajectory")[0]],
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_high_entropy_mask_takes_half_precision(dtype: torch.dtype) -> None:
    """torch.quantile takes float32/float64 only: half-precision entropies are upcast for it."""
    x = _inputs(F64, "cpu")
    half = x["entropies"].to(dtype)
    got = rl.high_entropy_mask(half, x["mask"], 0.3)
    expected = rl.high_entropy_mask(half.float(), x["mask"], 0.3)
    assert got.tolist() == expected.tolist()  # bit-exact: bool masks from the same values
    assert 0 < int(got.sum()) < int(x["mask"].sum())


@pytest.mark.parametrize("name", sorted(CALLS))
def test_float32_in_float32_out(name: str) -> None:
    got = CALLS[name](_inputs(torch.float32, "cpu"))
    expected = CALLS[name](_inputs(F64, "cpu"))
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == torch.float32, (name, g.dtype)
        lib.close(g, e, name)  # float32 against float64: rl_testing.tolerance in float32


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", sorted(CALLS))
def test_cuda_outputs_on_input_device(name: str) -> None:
    got = CALLS[name](_inputs(F64, "cuda"))
    expected = CALLS[name](_inputs(F64, "cpu"))
    for g, e in zip(got, expected, strict=True):
        assert g.device.type == "cuda", (name, g.device)
        lib.close(g.cpu(), e, name)  # CUDA kernels against CPU ones
