"""The peer-convention arguments of issue 23, against float64 loop references (1e-10), by hand,
as hypothesis properties and with gradcheck: rollout_correction(statistic, weights, lower in
truncate mode), off_policy_mask, kl_penalty(importance_weight, weight_cap, clamp_mode,
is_weights), unit_weight="tokens", luspo_loss and vespo_loss."""

from __future__ import annotations

import math
from typing import Any

import losses_testlib as lib
import pytest
import ref_conventions as rc
import rl_losses as rl
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from losses_testlib import AGGREGATIONS, F64, grad_of
from rl_testing.strategies import mask_batches

SEEDS = range(3)
SHAPES = [(5, 6), (4, 1), (6, 9)]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T_, F_ = True, False


def _inputs(seed: int, shape: tuple[int, int], **kw: Any) -> dict[str, Any]:
    g = lib.gen("conventions", seed, shape)
    return lib.make_policy_inputs(g, *shape, **kw)


def _agree(got: torch.Tensor, exp: torch.Tensor, x: torch.Tensor, msg: str = "") -> None:
    lib.close(got, exp, msg)
    lib.close(grad_of(got, x), grad_of(exp, x), msg + " (gradient)")


# --------------------------------------------------------------------------- reference agreement


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "kw",
    [
        {"level": "sequence", "statistic": "geometric_mean"},
        {"level": "sequence", "statistic": "geometric_mean", "mode": "mask", "weights": "token"},
        {
            "level": "sequence",
            "statistic": "geometric_mean",
            "mode": "mask",
            "lower": 0.9,
            "cap": 1.1,
        },
        {"level": "token", "mode": "truncate", "lower": 0.9, "cap": 1.1},
        {"level": "token", "mode": "mask", "lower": 0.9, "cap": 1.1, "weights": "token"},
        {"level": "sequence", "mode": "mask", "weights": "token", "cap": 1.5},
    ],
)
def test_rollout_correction_matches_reference(seed: int, shape: tuple[int, int], kw: dict) -> None:
    x = _inputs(seed, shape)
    old, samp = x["old_logprobs"], x["logprobs"].detach()
    out = rl.rollout_correction(old, samp, x["mask"], **kw)
    w, m = rc.ref_rollout_correction_ext(old, samp, x["mask"], **kw)
    lib.close(out.weights, w)
    assert torch.equal(out.mask, m)  # bit-exact: bool masks (seeded ratios, none on a bound)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "kw",
    [
        {"token_bounds": (0.8, 1.25)},
        {"sequence_threshold": 0.0},
        {"token_bounds": (0.5, 5.0), "sequence_threshold": 0.03},
    ],
)
def test_off_policy_mask_matches_reference(seed: int, shape: tuple[int, int], kw: dict) -> None:
    x = _inputs(seed, shape)
    args = (x["logprobs"], x["old_logprobs"], x["advantages"], x["mask"])
    got = rl.off_policy_mask(*args, **kw)
    # bit-exact: bool masks (seeded log-ratios, none on a bound)
    assert torch.equal(got, rc.ref_off_policy_mask(*args, **kw))
    assert not (got & ~x["mask"]).any()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(
    "kw",
    [
        {"importance_weight": "ratio"},
        {"importance_weight": "ratio", "weight_cap": 1.05},
        {"importance_weight": "gradient", "weight_cap": 10.0, "clamp": 10.0},
        {"importance_weight": "gradient", "kind": "k1"},
        {"clamp": 0.05, "clamp_mode": "drop"},
        {"kind": "k2", "with_is": True},
    ],
)
def test_kl_penalty_matches_reference(
    seed: int, shape: tuple[int, int], aggregation: str, kw: dict
) -> None:
    kw = dict(kw)
    x = _inputs(seed, shape, noise=0.4)
    lp, mask = x["logprobs"], x["mask"]
    ref_lp = x["old_logprobs"] - 0.3
    if kw.pop("with_is", False):
        kw["is_weights"] = rl.off_policy_mask(
            lp, x["old_logprobs"], x["advantages"], mask, token_bounds=(0.8, 1.25)
        ).to(F64)
    if "importance_weight" in kw:
        kw["old_logprobs"] = x["old_logprobs"]
    got = rl.kl_penalty(lp, ref_lp, mask, aggregation=aggregation, coef=0.7, **kw).loss
    exp = rc.ref_kl_penalty_ext(lp, ref_lp, mask, aggregation=aggregation, coef=0.7, **kw)
    _agree(got, exp, lp, str(kw))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("level", ["turn", "trajectory"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_unit_weight_tokens_matches_reference(
    seed: int, shape: tuple[int, int], level: str, pooling: str, aggregation: str
) -> None:
    x = _inputs(seed, shape)
    kw = {"level": level, "pooling": pooling, "turn_ids": x["turn_ids"], "aggregation": aggregation}
    args = (x["logprobs"], x["old_logprobs"], x["advantages"], x["mask"])
    got = rl.clipped_surrogate(*args, unit_weight="tokens", is_weights=x["is_weights"], **kw).loss
    exp = rc.ref_clipped_surrogate_tokens(*args, is_weights=x["is_weights"], **kw)
    _agree(got, exp, x["logprobs"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("normalizer", [None, 7.0])
def test_luspo_matches_sequence_form_reference(
    seed: int, shape: tuple[int, int], normalizer: float | None
) -> None:
    x = _inputs(seed, shape, adv_per_seq=True, noise=0.05)
    args = (x["logprobs"], x["old_logprobs"], x["advantages"], x["mask"])
    kw = {"normalizer": normalizer, "clip_low": 0.02, "clip_high": 0.03}
    _agree(rl.luspo_loss(*args, **kw).loss, rc.ref_luspo_loss(*args, **kw), x["logprobs"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum"])
def test_vespo_matches_reference(seed: int, shape: tuple[int, int], aggregation: str) -> None:
    x = _inputs(seed, shape, noise=0.15)
    args = (x["logprobs"], x["old_logprobs"], x["advantages"], x["mask"])
    kw = {"aggregation": aggregation, "is_weights": x["is_weights"]}
    _agree(rl.vespo_loss(*args, **kw).loss, rc.ref_vespo_loss(*args, **kw), x["logprobs"])


# --------------------------------------------------------------------------- hand cases


def test_rollout_correction_by_hand() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0]], dtype=F64)
    samp = torch.tensor([[-math.log(2.0), math.log(2.0), 0.0]], dtype=F64)  # rho = 2, 1/2, 1
    m = torch.tensor([[T_, T_, T_]])
    # geometric mean of (2, 1/2, 1) is 1: the sequence passes a tight band, tokens keep rho_t
    out = rl.rollout_correction(
        old, samp, m, level="sequence", statistic="geometric_mean", mode="mask", cap=1.01,
        lower=0.99, weights="token",
    )  # fmt: skip
    lib.close(out.weights, torch.tensor([[2.0, 0.5, 1.0]], dtype=F64))
    # OpenRLHF's token clip (0.6, 1.5): clamp(2) = 1.5, clamp(1/2) = 0.6
    out = rl.rollout_correction(old, samp, m, mode="truncate", lower=0.6, cap=1.5)
    lib.close(out.weights, torch.tensor([[1.5, 0.6, 1.0]], dtype=F64))
    lib.close(out.frac_clamped, 2 / 3)


def test_off_policy_mask_by_hand() -> None:
    lp = torch.tensor([[0.0, 0.0], [-1.0, -1.0]], dtype=F64)
    beh = torch.tensor([[math.log(3.0), 0.0], [-1.0, -0.5]], dtype=F64)  # ratios 1/3, 1; 1, e^-.5
    m = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0], dtype=F64)
    # token band (0.5, 5): drops the 1/3 token only
    keep = rl.off_policy_mask(lp, beh, adv, m, token_bounds=(0.5, 5.0))
    assert keep.tolist() == [[False, True], [True, True]]  # bit-exact: bool masks
    # row 0 drift log(3)/2 ~ 0.55 > 0.5 with A < 0: dropped; row 1 has A > 0: kept
    keep = rl.off_policy_mask(lp, beh, adv, m, sequence_threshold=0.5)
    assert keep.tolist() == [[False, False], [True, True]]  # bit-exact: bool masks


def test_kl_importance_weight_by_hand() -> None:
    lp = torch.tensor([[-1.0]], dtype=F64, requires_grad=True)
    ref_lp = torch.tensor([[-1.5]], dtype=F64)
    old = torch.tensor([[-1.0 - math.log(2.0)]], dtype=F64)  # r = 2
    m = torch.tensor([[T_]])
    ell = 0.5
    k3 = math.exp(-ell) - 1 + ell
    out = rl.kl_penalty(lp, ref_lp, m, old_logprobs=old, importance_weight="ratio")
    lib.close(out.loss, 2 * k3)
    # d(r * k3)/dlp = r * k3 + r * (1 - e^-ell)
    lib.close(grad_of(out.loss, lp), torch.tensor([[2 * k3 + 2 * (1 - math.exp(-ell))]], dtype=F64))
    out = rl.kl_penalty(
        lp, ref_lp, m, old_logprobs=old, importance_weight="gradient", weight_cap=1.5
    )
    lib.close(out.loss, k3)  # the value of k3, the gradient min(r, 1.5) * ell
    lib.close(grad_of(out.loss, lp), torch.tensor([[1.5 * ell]], dtype=F64))


def test_kl_clamp_drop_by_hand() -> None:
    lp = torch.tensor([[-4.0, 0.0]], dtype=F64, requires_grad=True)
    ref_lp = torch.tensor([[0.0, -4.0]], dtype=F64)  # ell = -4 (k3 = e^4 - 5 ~ 49.6), ell = 4
    m = torch.tensor([[T_, T_]])
    k3_pos = math.exp(-4.0) - 1 + 4.0
    out = rl.kl_penalty(
        lp, ref_lp, m, clamp=10.0, clamp_mode="drop", aggregation="seq_mean_token_sum"
    )
    lib.close(out.loss, k3_pos)  # the ell < 0 token is dropped, the other is below the bound
    lib.close(grad_of(out.loss, lp), torch.tensor([[0.0, 1 - math.exp(-4.0)]], dtype=F64))


def test_vespo_by_hand() -> None:
    # one sequence of two tokens, log w = 0.1 + 0.2, A = 1: phi = e^3 w^2 e^{-3 w}
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.1, -2.2]], dtype=F64)
    m = torch.tensor([[T_, T_]])
    w = math.exp(0.3)
    phi = math.exp(3.0) * w**2 * math.exp(-3.0 * w)
    out = rl.vespo_loss(lp, old, torch.tensor([1.0], dtype=F64), m)
    lib.close(out.loss, -phi * (-1.0 - 2.0) / 2)
    lib.close(grad_of(out.loss, lp), torch.tensor([[-phi / 2, -phi / 2]], dtype=F64))


@pytest.mark.parametrize(("k_pos", "lambda_pos"), [(1.7, 0.3), (2.0, 0.1)])
def test_vespo_keeps_float64_coefficients(k_pos: float, lambda_pos: float) -> None:
    # 1.7, 0.3 and 0.1 are not float32 numbers: rounded to float32 they move phi by ~1e-8
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.3, -2.2]], dtype=F64)
    m = torch.tensor([[T_, T_]])
    w = math.exp(0.5)
    phi = math.exp(lambda_pos) * w**k_pos * math.exp(-lambda_pos * w)
    out = rl.vespo_loss(lp, old, torch.tensor([1.0], dtype=F64), m, k_pos=k_pos,
                        lambda_pos=lambda_pos)  # fmt: skip
    assert abs(float(out.loss.detach()) - (-phi * (-1.0 - 2.0) / 2)) < 1e-12
    grad = grad_of(out.loss, lp)
    assert float((grad - torch.tensor([[-phi / 2, -phi / 2]], dtype=F64)).abs().max()) < 1e-12


def test_luspo_by_hand() -> None:
    # rows of 1 and 3 tokens, on-policy (s = 1): loss = -(1 * A_0 + 3 * A_1) / 2
    lp = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]], dtype=F64)
    m = torch.tensor([[T_, F_, F_], [T_, T_, T_]])
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    lib.close(rl.luspo_loss(lp, lp, adv, m).loss, -(1.0 - 6.0) / 2)
    lib.close(rl.luspo_loss(lp, lp, adv, m, normalizer=4).loss, -(1.0 - 6.0) / 4)


# --------------------------------------------------------------------------- properties


@st.composite
def _batch(draw: st.DrawFn) -> dict[str, Any]:
    mask = draw(mask_batches(4, 6, allow_empty_rows=True))
    n, t = mask.shape
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    lp = -torch.rand(n, t, generator=g, dtype=F64) - 0.05
    old = lp + 0.2 * torch.randn(n, t, generator=g, dtype=F64)
    adv = torch.randn(n, generator=g, dtype=F64)
    return {"lp": lp.requires_grad_(True), "old": old, "adv": adv, "mask": mask}


@SETTINGS
@given(_batch())
def test_vespo_on_policy_is_reinforce(b: dict[str, Any]) -> None:
    # phi(1) = 1: on-policy VESPO is REINFORCE (logprob form), value and gradient
    lp, m = b["lp"], b["mask"]
    got = rl.vespo_loss(lp, lp.detach(), b["adv"], m).loss
    exp = rl.reinforce_loss(lp, lp.detach(), b["adv"], m).loss
    _agree(got, exp, lp)


@SETTINGS
@given(_batch(), st.sampled_from(AGGREGATIONS))
def test_unit_weight_tokens_at_token_level_changes_nothing(b: dict[str, Any], agg: str) -> None:
    args = (b["lp"], b["old"], b["adv"], b["mask"])
    got = rl.clipped_surrogate(*args, aggregation=agg, unit_weight="tokens").loss
    _agree(got, rl.clipped_surrogate(*args, aggregation=agg).loss, b["lp"])


@SETTINGS
@given(_batch())
def test_trajectory_tokens_is_gspo_token_form(b: dict[str, Any]) -> None:
    # AgileRL's trajectory level = gspo_loss(gradient="token", aggregation="token_mean")
    args = (b["lp"], b["old"], b["adv"], b["mask"])
    got = rl.clipped_surrogate(
        *args, level="trajectory", pooling="mean", unit_weight="tokens", clip_low=0.1
    ).loss
    exp = rl.gspo_loss(*args, gradient="token", clip_low=0.1, clip_high=0.1).loss
    _agree(got, exp, b["lp"])


@SETTINGS
@given(_batch(), st.floats(0.0, 0.3))
def test_off_policy_mask_is_monotone_in_threshold(b: dict[str, Any], delta: float) -> None:
    args = (b["lp"], b["old"], b["adv"], b["mask"])
    loose = rl.off_policy_mask(*args, sequence_threshold=delta + 0.1)
    tight = rl.off_policy_mask(*args, sequence_threshold=delta)
    assert not (tight & ~loose).any()
    assert not (loose & ~b["mask"]).any()


@SETTINGS
@given(_batch())
def test_geometric_mean_of_equal_ratios_is_the_token_ratio(b: dict[str, Any]) -> None:
    m = b["mask"]
    old = torch.zeros_like(b["old"])
    samp = torch.full_like(old, -0.1)  # every token ratio e^0.1
    out = rl.rollout_correction(old, samp, m, level="sequence", statistic="geometric_mean")
    expected = torch.where(m, torch.full_like(old, math.exp(0.1)), torch.zeros_like(old))
    lib.close(out.weights, expected)


# --------------------------------------------------------------------------- gradcheck

GMASK = torch.tensor([[T_, T_, F_, T_], [F_, F_, F_, F_], [T_, T_, T_, F_], [F_, T_, F_, F_]])
GTURNS = torch.tensor([[0, 0, -1, 2], [-1, -1, -1, -1], [0, 1, 1, -1], [-1, 0, -1, -1]])


def _gin() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(4, 4, generator=g, dtype=F64) - 0.1
    old = lp + 0.03 * torch.randn(4, 4, generator=g, dtype=F64)
    adv = torch.tensor([0.7, -0.4, -1.1, 0.9], dtype=F64)
    return lp, old, adv


def _gradcheck(fn: Any, x: torch.Tensor) -> None:
    assert torch.autograd.gradcheck(fn, (x.clone().requires_grad_(True),), eps=1e-6, atol=1e-6)


def test_gradcheck_vespo_and_luspo() -> None:
    lp, old, adv = _gin()
    # VESPO's phi is a stop-gradient: shift old with lp so that w stays fixed
    _gradcheck(lambda x: rl.vespo_loss(x, old + (x - lp), adv, GMASK).loss, lp)
    _gradcheck(lambda x: rl.luspo_loss(x, old, adv, GMASK, clip_low=0.2, clip_high=0.2).loss, lp)


def test_gradcheck_kl_ratio_and_unit_weight_tokens() -> None:
    lp, old, adv = _gin()
    ref_lp = lp - 0.2
    _gradcheck(
        lambda x: rl.kl_penalty(x, ref_lp, GMASK, old_logprobs=old, importance_weight="ratio").loss,
        lp,
    )
    _gradcheck(
        lambda x: (
            rl.clipped_surrogate(
                x, old, adv, GMASK, level="turn", turn_ids=GTURNS, unit_weight="tokens"
            ).loss
        ),
        lp,
    )


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda a: rl.rollout_correction(*a[:2], a[3], statistic="median"), "statistic"),
        (lambda a: rl.rollout_correction(*a[:2], a[3], weights="token"), "weights"),
        (lambda a: rl.off_policy_mask(*a, token_bounds=(1.2, 2.0)), "token_bounds"),
        (lambda a: rl.off_policy_mask(*a, sequence_threshold=-1.0), "sequence_threshold"),
        (lambda a: rl.kl_penalty(a[0], a[1], a[3], importance_weight="ratio"), "old_logprobs"),
        (lambda a: rl.kl_penalty(a[0], a[1], a[3], importance_weight="both"), "importance_weight"),
        (lambda a: rl.kl_penalty(a[0], a[1], a[3], clamp_mode="drop"), "clamp"),
        (
            lambda a: rl.kl_penalty(
                a[0], a[1], a[3], old_logprobs=a[1], importance_weight="ratio", weight_cap=0.0
            ),
            "weight_cap",
        ),
        (lambda a: rl.kl_penalty(a[0], a[1], a[3], weight_cap=2.0), "weight_cap"),
        (lambda a: rl.clipped_surrogate(*a, unit_weight="rows"), "unit_weight"),
        (lambda a: rl.vespo_loss(*a, k_pos=0.0), "k_pos"),
        (lambda a: rl.vespo_loss(*a, lambda_neg=-1.0), "lambda_neg"),
    ],
)
def test_new_arguments_raise_naming_the_argument(call: Any, name: str) -> None:
    lp, old, adv = _gin()
    with pytest.raises(ValueError, match=name):
        call((lp, old, adv, GMASK))
