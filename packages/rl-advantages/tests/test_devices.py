"""The estimators follow their inputs' device and dtype.

Each case runs in float32 on every device (``rl_testing.devices``: CPU here, CUDA under
``pytest -m cuda`` / ``nox -s gpu``), and is compared with the same call in float64 on CPU: the
outputs live on the input's device, in the input's dtype, equal to the float64 values to the
float32 tolerance (each output is a short chain of group reductions of length at most ``T``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import rl_advantages as ra
import torch
from rl_testing.devices import DEVICES
from rl_testing.seeded import gen, make_mask
from rl_testing.tolerance import assert_close

F64 = torch.float64
B, G, T = 3, 4, 6
N = B * G


def _inputs() -> dict[str, torch.Tensor]:
    g = gen("advantages-devices")
    mask = make_mask(g, N, T)
    mask[:, 0] = True  # every row has a step
    return {
        "rewards": torch.rand(N, generator=g, dtype=F64),
        "components": torch.rand(N, 2, generator=g, dtype=F64),
        "token_rewards": torch.randn(N, T, generator=g, dtype=F64) * mask,
        "values": torch.randn(N, T, generator=g, dtype=F64),
        "logprobs": -torch.rand(N, T, generator=g, dtype=F64) * 3,
        "sum_pi_squared": torch.rand(N, T, generator=g, dtype=F64) * 0.5,
        "kl": torch.randn(N, T, generator=g, dtype=F64) * 0.1,
        "mask": mask,
    }


Call = Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]
CALLS: dict[str, Call] = {
    "grpo": lambda x: [ra.get_estimator("grpo")(x["rewards"], G)],
    "dr_grpo": lambda x: [ra.get_estimator("dr_grpo")(x["rewards"], G)],
    "rloo": lambda x: [ra.rloo(x["rewards"], G)],
    "max_rl": lambda x: [ra.max_rl(x["rewards"], G)],
    "pass_at_k": lambda x: [ra.pass_at_k(x["rewards"], G)],
    "gdpo": lambda x: [ra.gdpo(x["components"], G, weights=[1.0, 0.5])],
    "gae": lambda x: list(ra.gae(x["token_rewards"], x["values"], x["mask"], 0.99, 0.95)),
    "reinforce_plus_plus_baseline": lambda x: list(
        ra.reinforce_plus_plus_baseline(x["rewards"], x["mask"], G, kl=x["kl"], beta=0.05)
    ),
    "optimal_token_baseline": lambda x: list(
        ra.optimal_token_baseline(
            x["token_rewards"], x["mask"], x["logprobs"], x["sum_pi_squared"], G
        )
    ),
}


def _on(x: dict[str, torch.Tensor], device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        k: v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)
        for k, v in x.items()
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_outputs_on_the_input_device_and_dtype(name: str, device: str) -> None:
    x = _inputs()
    got = CALLS[name](_on(x, device, torch.float32))
    expected = CALLS[name](x)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.device.type == torch.device(device).type, (name, g.device)
        assert g.dtype == torch.float32, (name, g.dtype)
        assert_close(g, e, reduction=T, stages=3, msg=name)
