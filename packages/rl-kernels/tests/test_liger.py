"""The Liger backend computes the same loss as fused_policy_loss on its supported subset.

Liger's chunked loss is pure torch, so this runs on CPU. fused_policy_loss itself is checked
against the naive full-logits path in test_fused_policy_loss.py.
"""

from typing import Any

import pytest
import rl_kernels as rk
import torch
from rl_testing.tolerance import assert_close

pytest.importorskip("liger_kernel")

CASES = [
    ("ppo", "token_mean", {"clip_high": 0.28}),
    ("ppo", "token_mean", {"delta": 1.5}),
    ("ppo", "seq_mean_token_mean", {}),
    ("ppo", "seq_mean_token_sum_norm", {"max_length": 10}),
    ("cispo", "token_mean", {"eps_high": 0.5}),
    ("sapo", "seq_mean_token_mean", {"tau_pos": 1.0, "tau_neg": 2.0}),
]


def _inputs(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    n, t, h, v = 4, 6, 8, 53
    hidden = torch.randn(n, t, h, generator=gen).requires_grad_()
    weight = torch.randn(v, h, generator=gen).requires_grad_()
    targets = torch.randint(0, v, (n, t), generator=gen)
    mask = torch.rand(n, t, generator=gen) > 0.3
    mask[:, 0] = True  # no empty row: Liger's grpo/dr_grpo divide by every row
    with torch.no_grad():
        lp = torch.log_softmax((hidden @ weight.T) / 0.9, -1).gather(-1, targets[..., None])[..., 0]
    return {
        "hidden": hidden, "weight": weight, "targets": targets, "mask": mask,
        "advantages": torch.randn(n, generator=gen),
        "old_logprobs": lp + 0.2 * torch.randn(n, t, generator=gen),
        "ref_logprobs": lp + 0.1 * torch.randn(n, t, generator=gen),
    }  # fmt: skip


@pytest.mark.parametrize(("objective", "aggregation", "options"), CASES)
@pytest.mark.parametrize("with_weights", [False, True])
def test_liger_matches_fused(
    objective: str, aggregation: str, options: dict[str, Any], with_weights: bool
) -> None:
    x = _inputs(seed=len(objective) + len(aggregation))
    weights = torch.rand(4, 6, generator=torch.Generator().manual_seed(7)) + 0.5
    common = {
        "temperature": 0.9, "objective": objective, "aggregation": aggregation, "kl_coef": 0.1,
        "is_weights": weights if with_weights else None,
    }  # fmt: skip
    liger = rk.liger_policy_loss(**x, **common, **options)
    fused_options = dict(options)
    if objective == "cispo":
        fused_options["clamp"] = "upper"
    fused = rk.fused_policy_loss(**x, **common, **fused_options)
    # logits over H = 8, log-sum-exp over V = 53, the mean over N * T = 24 tokens
    tol: dict[str, Any] = {"reduction": 53, "stages": 3}
    assert_close(liger.loss, fused.loss, **tol, msg="loss")
    assert_close(liger.kl_mean, fused.kl_mean, **tol, msg="kl_mean")
    g_liger = torch.autograd.grad(liger.loss, (x["hidden"], x["weight"]))
    g_fused = torch.autograd.grad(fused.loss, (x["hidden"], x["weight"]))
    for a, b, name in zip(g_liger, g_fused, ("hidden", "weight"), strict=True):
        assert_close(a, b, **tol, msg=f"grad {name}")


def test_unsupported_combinations_raise() -> None:
    x = _inputs(0)
    with pytest.raises(ValueError, match="not available in the Liger backend"):
        rk.liger_policy_loss(**x, objective="reinforce")
    with pytest.raises(ValueError, match="not available in the Liger backend"):
        rk.liger_policy_loss(**x, aggregation="seq_mean_token_sum")
    with pytest.raises(ValueError, match="`normalizer` is supported only"):
        rk.liger_policy_loss(**x, aggregation="seq_mean_token_mean", normalizer=10.0)
    with pytest.raises(ValueError, match="`advantages` must be"):
        rk.liger_policy_loss(**{**x, "advantages": torch.zeros(4, 6)})
    with pytest.raises(ValueError, match="`ref_logprobs` is required"):
        rk.liger_policy_loss(**{**x, "ref_logprobs": None}, kl_coef=0.1)
    half = x["mask"].float() * 0.5
    with pytest.raises(ValueError, match=r"`mask` must be bool.*`is_weights`"):
        rk.liger_policy_loss(**{**x, "mask": half})


def test_masked_rows_may_hold_nan_and_bad_ids() -> None:
    x = _inputs(3)
    clean = rk.liger_policy_loss(**x, kl_coef=0.1).loss
    dirty_hidden = x["hidden"].detach().clone()
    dirty_hidden[~x["mask"]] = float("nan")
    dirty_targets = torch.where(x["mask"], x["targets"], -100)
    dirty = rk.liger_policy_loss(
        **{**x, "hidden": dirty_hidden, "targets": dirty_targets}, kl_coef=0.1
    ).loss
    # the same chunks with the masked rows replaced: another route to the same loss
    assert_close(dirty, clean.detach(), reduction=53, stages=3)
