"""Tinker's named losses on this server equal a float64 reference of Tinker's documented formulas.

A hand-built batch of two ``tinker.types.Datum`` (5 and 3 tokens, so padded) goes through the
SDK's own protobuf encoder and the server's decoder, then :func:`rl_train.tinker.losses.
compute_loss` with float64 learner log-probs; the reference is the code of Tinker's loss pages
(tinker-docs.thinkingmachines.ai/tinker/losses and its ppo / cispo / gspo / dro pages), run per
datum in float64 and summed. Values and gradients are compared.
"""

from __future__ import annotations

from typing import Any

import pytest
import rl_losses
import torch
from rl_testing.tolerance import assert_close
from rl_train.tinker.losses import MAPPING, LossError, compute_loss, loss_spec
from rl_train.tinker.wire import decode_forward_backward
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

F64 = torch.float64
# two datums: a 2-token prompt (advantage 0, sampler log-prob 0 as the cookbook sends) + completion
TOKENS = [[4, 9, 11, 6, 2], [7, 3, 5]]
SAMPLER = [[0.0, 0.0, -1.2, -0.4, -2.0], [0.0, -0.9, -1.5]]
ADVANTAGES = [[0.0, 0.0, 1.5, 1.5, 1.5], [0.0, -0.7, -0.7]]
WEIGHTS = [[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.5]]
# learner log-probs: ratios exp(lp - q) of 1.35, 0.74, 0.97 and 1.22, 0.90 on the completions
LEARNER = [[-3.1, -2.2, -0.9, -0.7, -2.03], [-1.6, -0.7, -1.6]]


def datums() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens),
            loss_fn_inputs={
                "target_tokens": [*tokens[1:], 1],
                "logprobs": sampler,
                "advantages": advantages,
                "weights": weights,
            },
        )
        for tokens, sampler, advantages, weights in zip(
            TOKENS, SAMPLER, ADVANTAGES, WEIGHTS, strict=True
        )
    ]


def wire(loss_fn: str, config: dict[str, float] | None) -> Any:
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=datums(), loss_fn=loss_fn, loss_fn_config=config
        ),
        model_id="model-1",
        seq_id=1,
    )
    return decode_forward_backward(forward_backward_request_to_proto(request).SerializeToString())


def wire32(values: list[float]) -> torch.Tensor:
    """The float32 values a Datum carries (TensorData is float32 on the wire), in float64."""
    return torch.tensor(values, dtype=torch.float32).to(F64)


def reference(loss_fn: str, lp: torch.Tensor, cfg: dict[str, float]) -> torch.Tensor:
    """Tinker's documented code, one datum at a time, float64."""
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    beta = cfg.get("beta", 0.05)
    total = torch.zeros((), dtype=F64)
    for i, tokens in enumerate(TOKENS):
        target = lp[i, : len(tokens)]
        q, a, w = (wire32(x[i]) for x in (SAMPLER, ADVANTAGES, WEIGHTS))
        ratio = torch.exp(target - q)
        if loss_fn == "cross_entropy":
            loss = (-target * w).sum()
        elif loss_fn == "importance_sampling":
            loss = -(ratio * a).sum()
        elif loss_fn == "ppo":
            loss = -torch.min(ratio * a, torch.clamp(ratio, lo, hi) * a).sum()
        elif loss_fn == "cispo":
            loss = -(torch.clamp(ratio, lo, hi).detach() * target * a).sum()
        elif loss_fn == "dro":
            loss = -(target * a - 0.5 * beta * (target - q) ** 2).sum()
        else:  # gspo: the sequence ratio over the tokens with a nonzero advantage
            in_ratio = a != 0
            log_ratio = (target.detach() - q)[in_ratio].mean()
            seq_ratio = torch.exp(log_ratio + target - target.detach())
            loss = -torch.min(seq_ratio * a, torch.clamp(seq_ratio, lo, hi) * a).sum()
        total = total + loss
    return total


CASES = [
    ("cross_entropy", None),
    ("importance_sampling", None),
    ("ppo", None),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("cispo", None),
    ("cispo", {"clip_low_threshold": 0.95, "clip_high_threshold": 1.3}),
    ("gspo", None),
    ("gspo", {"clip_low_threshold": 0.99, "clip_high_threshold": 1.01}),
    ("dro", None),
    ("dro", {"beta": 0.3}),
]


@pytest.mark.parametrize(("loss_fn", "config"), CASES)
def test_each_loss_equals_tinkers_documented_formula(
    loss_fn: str, config: dict[str, float] | None
) -> None:
    request = wire(loss_fn, config)
    width = max(len(t) for t in TOKENS)
    lp = torch.zeros(len(TOKENS), width, dtype=F64)
    valid = torch.zeros(len(TOKENS), width, dtype=torch.bool)
    for i, row in enumerate(LEARNER):
        lp[i, : len(row)] = torch.tensor(row, dtype=F64)
        valid[i, : len(row)] = True
    ours_lp = lp.clone().requires_grad_(True)
    ref_lp = lp.clone().requires_grad_(True)
    ours = compute_loss(
        request.loss_fn, request.loss_fn_config, ours_lp, valid, [d.inputs for d in request.data]
    )
    expected = reference(loss_fn, ref_lp, config or {})
    (grad_ours,) = torch.autograd.grad(ours, ours_lp)
    (grad_ref,) = torch.autograd.grad(expected, ref_lp)
    n = sum(len(t) for t in TOKENS)
    assert_close(ours, expected, reduction=n, msg=f"{loss_fn} value")
    assert_close(grad_ours, grad_ref, reduction=n, msg=f"{loss_fn} gradient")
    assert float(grad_ref.abs().sum()) > 0  # the case exercises the gradient


def test_the_cases_clip() -> None:
    """The batch puts ratios on both sides of the default and custom clip bounds."""
    lp, q = torch.tensor(LEARNER[0] + LEARNER[1]), torch.tensor(SAMPLER[0] + SAMPLER[1])
    flat = torch.exp(lp - q)[torch.tensor(ADVANTAGES[0] + ADVANTAGES[1]) != 0]
    assert bool((flat > 1.2).any()) and bool((flat < 0.8).any())
    assert bool(((flat > 0.9) & (flat < 1.1)).any())


@pytest.mark.parametrize("name", ["custom", "stable_reinforce", "grpo", "nope"])
def test_custom_and_unmapped_losses_are_refused(name: str) -> None:
    assert name not in MAPPING
    with pytest.raises(LossError, match="not supported by this server"):
        loss_spec(name)


def test_every_mapped_loss_is_registered_in_rl_losses() -> None:
    registered = set(rl_losses.available_policy_losses())
    assert {spec.registry for spec in MAPPING.values()} <= registered


def test_unknown_config_keys_are_refused() -> None:
    request = wire("ppo", {"beta": 0.1})
    lp = torch.zeros(2, 5, dtype=F64)
    with pytest.raises(LossError, match="loss_fn_config keys"):
        compute_loss("ppo", request.loss_fn_config, lp, lp == 0, [d.inputs for d in request.data])
