"""Small cases worked out by hand (arithmetic in the comments).

Every case runs against both the implementation ("impl") and the loop reference ("ref"), which
checks the references themselves as well. (DAPO's overlong shaping is a reward transform and has
no counterpart in rl_losses.)
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import ref_losses as reference
import rl_losses
import torch
from losses_testlib import grad_of
from rl_testing.tolerance import assert_close

F64 = torch.float64
T = True
F = False
NAN = float("nan")
# rl_testing.tolerance for the hand-worked values (two routes: the implementation, the loop
# reference): at most 8 tokens per case, up to 3 chained reductions (pooling, means).
HAND: dict[str, int] = {"reduction": 8, "stages": 3}
LN2 = math.log(2.0)


class _Impl:
    def __getattr__(self, name: str) -> Any:
        return getattr(rl_losses, name)


class _Ref:
    def __getattr__(self, name: str) -> Any:
        return getattr(reference, f"ref_{name}")


API = pytest.mark.parametrize("api", [_Impl(), _Ref()], ids=["impl", "ref"])


def t(data: Any) -> torch.Tensor:
    return torch.tensor(data, dtype=F64)


def b(data: Any) -> torch.Tensor:
    return torch.tensor(data, dtype=torch.bool)


def close(got: Any, expected: Any) -> None:
    got_t = got if isinstance(got, torch.Tensor) else t(got)
    exp_t = t(expected) if not isinstance(expected, torch.Tensor) else expected
    assert_close(got_t.detach(), exp_t, **HAND)


def one_token(ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lp = log(ratio) - 1, old = -1 -> r = ratio; mask [[True]]."""
    lp = t([[math.log(ratio) - 1.0]]).requires_grad_(True)
    return lp, t([[-1.0]]), b([[T]])


# --------------------------------------------------------------------------- PPO


@API
@pytest.mark.parametrize(
    ("ratio", "adv", "kw", "loss", "grad"),
    [
        # A = 1, r = 1.5, eps 0.2: -min(1.5 * 1, 1.2 * 1) = -1.2, clipped branch -> zero gradient
        (1.5, 1.0, {}, -1.2, 0.0),
        # A = -1, r = 0.5: -min(-0.5, -0.8) = 0.8, clipped branch -> zero gradient
        (0.5, -1.0, {}, 0.8, 0.0),
        # A = -1, r = 1.1 (inside the band): -min(-1.1, -1.1) = 1.1, d/dlp (r) = r = 1.1
        (1.1, -1.0, {}, 1.1, 1.1),
        # A = -1, r = 1.5 (above the band, pessimistic side is unclipped): -min(-1.5, -1.2) = 1.5,
        # gradient -A * r = 1.5
        (1.5, -1.0, {}, 1.5, 1.5),
        # A = 1, r = 0.5 (below the band, unclipped side): -min(0.5, 0.8) = -0.5, gradient -r = -0.5
        (0.5, 1.0, {}, -0.5, -0.5),
        # asymmetric: clip_high 0.28 -> hi 1.28; A = 1, r = 1.5: -1.28, zero gradient
        (1.5, 1.0, {"clip_high": 0.28}, -1.28, 0.0),
        # ratio_bounds (0.5, 2.0): A = 1, r = 1.5 inside: -1.5, gradient -1.5
        (1.5, 1.0, {"ratio_bounds": (0.5, 2.0)}, -1.5, -1.5),
        # dual clip c = 3, A = -1, r = 5: l = -min(-5, -1.2) = 5 -> min(5, -3 * -1 = 3) = 3, grad 0
        (5.0, -1.0, {"dual_clip": 3.0}, 3.0, 0.0),
        # dual clip c = 3, A = -1, r = 2: l = 2 < 3 -> 2, gradient -A * r = 2
        (2.0, -1.0, {"dual_clip": 3.0}, 2.0, 2.0),
        # dual clip only acts on A < 0: A = 2, r = 5: -min(10, 2.4) = -2.4, zero gradient
        (5.0, 2.0, {"dual_clip": 3.0}, -2.4, 0.0),
        # delta 1.4, A = -1, r = 2: r1 = min(2, 1.4) = 1.4; -min(-1.4, -1.2) = 1.4, zero gradient
        (2.0, -1.0, {"delta": 1.4}, 1.4, 0.0),
        # delta 1.4, A = -1, r = 1.3: r1 = 1.3; -min(-1.3, -1.2) = 1.3, gradient 1.3
        (1.3, -1.0, {"delta": 1.4}, 1.3, 1.3),
        # delta 1.4, A = 1, r = 2: -min(1.4, 1.2) = -1.2, zero gradient
        (2.0, 1.0, {"delta": 1.4}, -1.2, 0.0),
    ],
)
def test_ppo_single_token(
    api: Any, ratio: float, adv: float, kw: dict[str, Any], loss: float, grad: float
) -> None:
    lp, old, mask = one_token(ratio)
    out = api.clipped_surrogate(lp, old, t([adv]), mask, **kw)
    close(out.loss, loss)
    close(grad_of(out.loss, lp), [[grad]])
    close(out.ratio_mean, ratio)
    close(out.ratio_max, ratio)
    # approx_kl = (r - 1) - log r
    close(out.approx_kl, ratio - 1.0 - math.log(ratio))


@API
def test_ppo_two_tokens_and_clip_fractions(api: Any) -> None:
    # row 0: r = 1.5 (A = 1, clipped high), r = 0.5 (A = -1, clipped low), NaN at a masked token;
    # row 1: r = 1.0, A = 2 (inside)
    lp = t([[math.log(1.5), math.log(0.5), NAN], [0.0, 0.0, 0.0]]).requires_grad_(True)
    old = t([[0.0, 0.0, NAN], [0.0, 0.0, 0.0]])
    adv = t([[1.0, -1.0, NAN], [2.0, 2.0, 2.0]])
    mask = b([[T, T, F], [T, F, F]])
    out = api.clipped_surrogate(lp, old, adv, mask)
    # token_mean: (-1.2 + 0.8 + (-2 * 1)) / 3 = -0.8
    close(out.loss, -0.8)
    # only the inside token has a gradient: -A * r / 3 = -2 / 3
    close(grad_of(out.loss, lp), [[0.0, 0.0, 0.0], [-2.0 / 3.0, 0.0, 0.0]])
    close(out.clip_frac_high, 1.0 / 3.0)
    close(out.clip_frac_low, 1.0 / 3.0)
    close(out.ratio_mean, (1.5 + 0.5 + 1.0) / 3.0)
    close(out.ratio_max, 1.5)
    # seq_mean_token_mean: ((-1.2 + 0.8) / 2 + (-2) / 1) / 2 = (-0.2 - 2) / 2 = -1.1
    close(api.clipped_surrogate(lp, old, adv, mask, aggregation="seq_mean_token_mean").loss, -1.1)


@API
def test_ppo_turn_level_pooling(api: Any) -> None:
    # turn 0 = tokens 0, 1 with log-ratios 0.1, 0.2; token 2 masked; turn 1 = token 3 (l = 0)
    lp = t([[0.1, 0.2, 5.0, 0.0]]).requires_grad_(True)
    old = t([[0.0, 0.0, 0.0, 0.0]])
    adv = t([[1.0, 3.0, 100.0, -1.0]])
    mask = b([[T, T, F, T]])
    ids = torch.tensor([[0, 0, -1, 1]])
    # sum pooling: turn 0: r = e^0.3 = 1.3499 > 1.2, A = mean(1, 3) = 2 -> -1.2 * 2 = -2.4 (no grad)
    # turn 1: r = 1, A = -1 -> 1. token_mean over 2 turns: (-2.4 + 1) / 2 = -0.7
    out = api.clipped_surrogate(lp, old, adv, mask, level="turn", turn_ids=ids)
    close(out.loss, -0.7)
    close(grad_of(out.loss, lp), [[0.0, 0.0, 0.0, 0.5]])  # turn 1: -A r / 2 = 0.5
    # mean pooling: turn 0: r = e^0.15 = 1.1618 inside -> -2 e^0.15; d/dlp_t = -2 e^0.15 / 2 each
    out = api.clipped_surrogate(lp, old, adv, mask, level="turn", turn_ids=ids, pooling="mean")
    e = math.exp(0.15)
    close(out.loss, (-2.0 * e + 1.0) / 2.0)
    close(grad_of(out.loss, lp), [[-e / 2.0, -e / 2.0, 0.0, 0.5]])


# --------------------------------------------------------------------------- other objectives


@API
def test_reinforce_trajectory(api: Any) -> None:
    lp = t([[-1.0, -2.0, 7.0]]).requires_grad_(True)
    old = t([[-1.0, -2.0, 0.0]])
    mask = b([[T, T, F]])
    # sum pooling: l = -A * (-1 - 2) = -2 * -3 = 6; gradient -A = -2 per token
    out = api.reinforce_loss(lp, old, t([2.0]), mask, level="trajectory")
    close(out.loss, 6.0)
    close(grad_of(out.loss, lp), [[-2.0, -2.0, 0.0]])
    close(out.clip_frac_low, 0.0)
    close(out.clip_frac_high, 0.0)
    # mean pooling: l = -2 * -1.5 = 3; gradient -2 / 2 = -1 per token
    out = api.reinforce_loss(lp, old, t([2.0]), mask, level="trajectory", pooling="mean")
    close(out.loss, 3.0)
    close(grad_of(out.loss, lp), [[-1.0, -1.0, 0.0]])
    # form "ratio": value -A = -2, same gradient
    out = api.reinforce_loss(
        lp, old, t([2.0]), mask, level="trajectory", pooling="mean", form="ratio"
    )
    close(out.loss, -2.0)
    close(grad_of(out.loss, lp), [[-1.0, -1.0, 0.0]])


@API
def test_cispo_far_outside_band(api: Any) -> None:
    # r = 8 > 1 + eps_high = 5: w = 5, l = -5 * 1 * lp = -5 * -1 = 5; gradient -w A = -5
    lp = t([[-1.0]]).requires_grad_(True)
    old = t([[-1.0 - math.log(8.0)]])
    out = api.cispo_loss(lp, old, t([1.0]), b([[T]]))
    close(out.loss, 5.0)
    close(grad_of(out.loss, lp), [[-5.0]])
    close(out.clip_frac_high, 1.0)
    close(out.clip_frac_low, 0.0)
    # two_sided, r = 0.25 < 0.8: w = 0.8, A = -2: l = -0.8 * -2 * -1 = -1.6; gradient 1.6
    old = t([[-1.0 - math.log(0.25)]])
    out = api.cispo_loss(lp, old, t([-2.0]), b([[T]]), clamp="two_sided")
    close(out.loss, -1.6)
    close(grad_of(out.loss, lp), [[1.6]])
    close(out.clip_frac_low, 1.0)


@API
def test_sapo_at_ratio_one(api: Any) -> None:
    lp = t([[-0.5, -0.7]]).requires_grad_(True)
    old = lp.detach().clone()
    mask = b([[T, T]])
    # r = 1: g = sigmoid(0) * 4 / tau = 2 / tau. token 0: A = 1, tau 1 -> l = -2;
    # token 1: A = -1, tau 1.05 -> l = 2 / 1.05. token_mean = (-2 + 2 / 1.05) / 2
    out = api.sapo_loss(lp, old, t([[1.0, -1.0]]), mask)
    close(out.loss, (-2.0 + 2.0 / 1.05) / 2.0)
    # dg/dr = tau * sigmoid'(0) * 4 / tau = 1, dr/dlp = 1 -> dl/dlp = -A / 2
    close(grad_of(out.loss, lp), [[-0.5, 0.5]])


@API
def test_gmpo_two_tokens(api: Any) -> None:
    lp = t([[0.2, 0.6, 3.0]]).requires_grad_(True)
    old = t([[0.0, 0.0, 0.0]])
    mask = b([[T, T, F]])
    # A = 1: l' = min(l, clamp(l, -0.4, 0.4)) = (0.2, 0.4), R = e^0.3, loss -e^0.3,
    # gradient -e^0.3 / 2 on token 0, 0 on the clipped token 1
    out = api.gmpo_loss(lp, old, t([1.0]), mask)
    close(out.loss, -math.exp(0.3))
    close(grad_of(out.loss, lp), [[-math.exp(0.3) / 2.0, 0.0, 0.0]])
    # A = -1: l' = max(l, clamp(l)) = (0.2, 0.6), R = e^0.4, loss e^0.4, gradient e^0.4 / 2 each
    out = api.gmpo_loss(lp, old, t([-1.0]), mask)
    close(out.loss, math.exp(0.4))
    close(grad_of(out.loss, lp), [[math.exp(0.4) / 2.0, math.exp(0.4) / 2.0, 0.0]])


@API
@pytest.mark.parametrize("gradient", ["sequence", "token"])
def test_gspo_two_tokens(api: Any, gradient: str) -> None:
    # log-ratios log 2, log 8: s = exp((log 2 + log 8) / 2) = 4 (geometric mean of 2 and 8)
    lp = t([[math.log(2.0), math.log(8.0), 1.0]]).requires_grad_(True)
    old = t([[0.0, 0.0, 0.0]])
    mask = b([[T, T, F]])
    # band [0.5, 6]: inside. l = -4 * A = -4; sequence: d s / d lp_t = s / 2 -> -2 per token;
    # token (seq_mean_token_mean): each token l = -4, d/dlp_t = -s = -4, mean over 2 -> -2
    out = api.gspo_loss(
        lp,
        old,
        t([1.0]),
        mask,
        clip_low=0.5,
        clip_high=5.0,
        gradient=gradient,
        aggregation="seq_mean_token_mean",
    )
    close(out.loss, -4.0)
    close(grad_of(out.loss, lp), [[-2.0, -2.0, 0.0]])
    # default band [1 - 3e-4, 1 + 4e-4]: s = 4 clipped, A = 1: -(1 + 4e-4), no gradient
    out = api.gspo_loss(
        lp, old, t([1.0]), mask, gradient=gradient, aggregation="seq_mean_token_mean"
    )
    close(out.loss, -(1.0 + 4e-4))
    close(grad_of(out.loss, lp), [[0.0, 0.0, 0.0]])


def _cov_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # lp = (-1, -2, -3) (mean -2), A = (2, 0, -1) (mean 1/3):
    # cov = (5/3)(1) = 5/3, (-1/3)(0) = 0, (-4/3)(-1) = 4/3
    lp = t([[-1.0, -2.0, -3.0]]).requires_grad_(True)
    old = lp.detach() - t([[0.1, -0.2, 0.3]])  # log-ratios 0.1, -0.2, 0.3
    return lp, old, t([[2.0, 0.0, -1.0]]), b([[T, T, T]])


@API
def test_kl_cov_by_hand(api: Any) -> None:
    lp, old, adv, mask = _cov_case()
    # k = max(1, floor(2e-3 * 3)) = 1 -> token 0 (largest cov 5/3) gets + |0.1|
    # losses: -2 e^0.1 + 0.1, 0, e^0.3; token_mean / 3
    out = api.kl_cov_loss(lp, old, adv, mask)
    e1, e3 = math.exp(0.1), math.exp(0.3)
    close(out.loss, (-2.0 * e1 + 0.1 + e3) / 3.0)
    # gradients: token 0: (-2 e^0.1 + 1) / 3, token 1: 0, token 2: e^0.3 / 3
    close(grad_of(out.loss, lp), [[(-2.0 * e1 + 1.0) / 3.0, 0.0, e3 / 3.0]])


@API
def test_clip_cov_by_hand(api: Any) -> None:
    lp, old, adv, mask = _cov_case()
    # candidates: 1 < cov < 5 -> tokens 0 (5/3) and 2 (4/3); ratio 1 -> k = 3 >= 2: both detached.
    # values as PPO: token 0: r = e^0.1 inside -> -2 e^0.1; token 1: 0; token 2: A = -1,
    # r = e^0.3 = 1.35 > 1.2 -> -min(-1.35, -1.2) = e^0.3
    out = api.clip_cov_loss(
        lp, old, adv, mask, clip_cov_ratio=1.0, generator=torch.Generator().manual_seed(0)
    )
    close(out.loss, (-2.0 * math.exp(0.1) + math.exp(0.3)) / 3.0)
    close(grad_of(out.loss, lp), [[0.0, 0.0, 0.0]])
    # no candidate (lb 2 > every cov): plain PPO gradient on token 0: -2 e^0.1 / 3; token 2: e^0.3/3
    out = api.clip_cov_loss(lp, old, adv, mask, clip_cov_lb=2.0)
    close(grad_of(out.loss, lp), [[-2.0 * math.exp(0.1) / 3.0, 0.0, math.exp(0.3) / 3.0]])


# --------------------------------------------------------------------------- aggregate / units

LOSS_2X3 = [[1.0, 2.0, 4.0], [8.0, 16.0, NAN]]
MASK_2X3 = [[T, T, T], [F, T, F]]


@API
@pytest.mark.parametrize(
    ("mode", "kw", "expected"),
    [
        # row 0: 1 + 2 + 4 = 7 (n = 3); row 1: 16 (n = 1); 4 valid tokens, 2 sequences, U = 3
        ("token_mean", {}, 23.0 / 4.0),  # (7 + 16) / 4
        ("seq_mean_token_mean", {}, (7.0 / 3.0 + 16.0) / 2.0),  # 55 / 6
        ("seq_mean_token_sum", {}, 23.0 / 2.0),
        ("seq_mean_token_sum_norm", {}, 23.0 / (2.0 * 3.0)),
        ("seq_mean_token_sum_norm", {"max_length": 4}, 23.0 / (2.0 * 4.0)),
        ("token_mean", {"normalizer": 8.0}, 23.0 / 8.0),
        ("seq_mean_token_mean", {"normalizer": 8.0}, (7.0 / 3.0 + 16.0) / 8.0),
        ("seq_mean_token_sum", {"normalizer": 8.0}, 23.0 / 8.0),
        ("seq_mean_token_sum_norm", {"normalizer": 8.0, "max_length": 4}, 23.0 / 32.0),
    ],
)
def test_aggregate_2x3(api: Any, mode: str, kw: dict[str, Any], expected: float) -> None:
    loss = t(LOSS_2X3).requires_grad_(True)
    out = api.aggregate(loss, b(MASK_2X3), mode, **kw)
    close(out, expected)
    grad = grad_of(out, loss)
    assert bool(torch.isfinite(grad).all())
    assert grad[1, 0] == 0
    assert grad[1, 2] == 0


@API
def test_aggregate_2x3_weights(api: Any) -> None:
    loss = t(LOSS_2X3).requires_grad_(True)
    out = api.aggregate(loss, b(MASK_2X3), "seq_mean_token_mean")
    # weights 1 / (n_i * |S|): row 0: 1 / 6 each; row 1: 1 / 2
    close(grad_of(out, loss), [[1 / 6, 1 / 6, 1 / 6], [0.0, 0.5, 0.0]])


@API
@pytest.mark.parametrize(
    "mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
)
def test_aggregate_nothing_valid(api: Any, mode: str) -> None:
    loss = t([[NAN, 1.0], [2.0, 3.0]]).requires_grad_(True)
    out = api.aggregate(loss, b([[F, F], [F, F]]), mode)
    close(out, 0.0)
    close(grad_of(out, loss), [[0.0, 0.0], [0.0, 0.0]])


@API
def test_to_units_turns(api: Any) -> None:
    x = t([[1.0, 2.0, NAN, 4.0]])
    mask = b([[T, T, F, T]])
    ids = torch.tensor([[0, 0, -1, 2]])
    # K = 3; turn 0 = {1, 2}, turn 1 empty, turn 2 = {4}
    x_u, m_u = api.to_units(x, mask, "turn", ids, "sum")
    assert m_u.tolist() == [[T, F, T]]  # bit-exact: bool masks
    close(x_u[m_u], [3.0, 4.0])
    x_u, m_u = api.to_units(x, mask, "turn", ids, "mean")
    close(x_u[m_u], [1.5, 4.0])
    x_u, m_u = api.to_units(x, mask, "trajectory", pooling="mean")
    assert m_u.tolist() == [[T]]  # bit-exact: bool masks
    close(x_u, [[7.0 / 3.0]])


# --------------------------------------------------------------------------- value loss


@API
def test_value_loss_by_hand(api: Any) -> None:
    v = t([[1.5]]).requires_grad_(True)
    old, ret, mask = t([[1.0]]), t([[2.0]]), b([[T]])
    # unclipped: 0.5 (1.5 - 2)^2 = 0.125, gradient V - R = -0.5
    out = api.value_loss(v, old, ret, mask)
    close(out.loss, 0.125)
    close(grad_of(out.loss, v), [[-0.5]])
    # clip 0.2: Vc = 1 + 0.2 = 1.2; max(0.125, 0.5 * 0.8^2 = 0.32) = 0.32, Vc const -> gradient 0
    out = api.value_loss(v, old, ret, mask, clip=0.2)
    close(out.loss, 0.32)
    close(grad_of(out.loss, v), [[0.0]])
    close(out.clip_frac, 1.0)
    # Huber d = 0.3: |x| = 0.5 > 0.3 -> 0.3 (0.5 - 0.15) = 0.105, gradient d sgn(x) = -0.3
    out = api.value_loss(v, old, ret, mask, huber_delta=0.3)
    close(out.loss, 0.105)
    close(grad_of(out.loss, v), [[-0.3]])


@API
def test_explained_variance_by_hand(api: Any) -> None:
    # R = (1, 3), V = (1, 2): R - V = (0, 1), Var = 0.25; Var(R) = 1 -> 1 - 0.25 = 0.75
    out = api.value_loss(
        t([[1.0, 2.0, 9.0]]), t([[1.0, 2.0, 0.0]]), t([[1.0, 3.0, NAN]]), b([[T, T, F]])
    )
    close(out.explained_variance, 0.75)
    close(out.value_mean, 1.5)
    # Var(R) = 0 -> 0
    out = api.value_loss(t([[1.0, 2.0]]), t([[1.0, 2.0]]), t([[3.0, 3.0]]), b([[T, T]]))
    close(out.explained_variance, 0.0)


# --------------------------------------------------------------------------- KL / entropy


@API
def test_kl_estimates_at_log2(api: Any) -> None:
    # l = lp - ref = log 2 (first) and -log 2 (second)
    lp = t([[LN2, 0.0]]).requires_grad_(True)
    ref = t([[0.0, LN2]])
    # k1 = l
    close(api.kl_estimate(lp, ref, "k1"), [[LN2, -LN2]])
    # k2 = l^2 / 2
    close(api.kl_estimate(lp, ref, "k2"), [[LN2**2 / 2, LN2**2 / 2]])
    # k3 = e^-l - 1 + l: 1/2 - 1 + log 2 = log 2 - 1/2;  2 - 1 - log 2 = 1 - log 2
    k3 = api.kl_estimate(lp, ref, "k3")
    close(k3, [[LN2 - 0.5, 1.0 - LN2]])
    # d k3 / d lp = 1 - e^-l: 1 - 1/2 = 1/2;  1 - 2 = -1
    close(grad_of(k3.sum(), lp), [[0.5, -1.0]])
    close(api.kl_estimate(lp, ref, "abs"), [[LN2, LN2]])
    # clamp 0.25: k3 = (0.193, 0.307) -> (0.193, 0.25), the clamped one has no gradient
    k3c = api.kl_estimate(lp, ref, "k3", clamp=0.25)
    close(k3c, [[LN2 - 0.5, 0.25]])
    close(grad_of(k3c.sum(), lp), [[0.5, 0.0]])
    # straight-through: value k3, gradient of k1 (= 1)
    st = api.kl_estimate(lp, ref, "k3", grad_kind="k1")
    close(st, [[LN2 - 0.5, 1.0 - LN2]])
    close(grad_of(st.sum(), lp), [[1.0, 1.0]])


@API
def test_kl_penalty_by_hand(api: Any) -> None:
    lp = t([[LN2, 0.0, NAN]]).requires_grad_(True)
    ref = t([[0.0, LN2, NAN]])
    out = api.kl_penalty(lp, ref, b([[T, T, F]]), kind="k3", coef=0.5)
    # 0.5 * mean(log 2 - 0.5, 1 - log 2) = 0.5 * 0.25 = 0.125
    close(out.loss, 0.125)
    close(out.kl_mean, 0.25)
    close(out.kl_max, 1.0 - LN2)
    close(grad_of(out.loss, lp), [[0.5 * 0.5 / 2, 0.5 * -1.0 / 2, 0.0]])


@API
def test_maxima_with_nothing_valid_are_zero(api: Any) -> None:
    # every token masked (a micro-batch of padding, a fused chunk without policy tokens): the
    # maxima over no token are 0, not -inf, and the losses 0 with a zero gradient
    lp = t([[0.5, NAN]]).requires_grad_(True)
    nothing = b([[F, F]])
    out = api.clipped_surrogate(lp, t([[0.0, NAN]]), t([1.0]), nothing)
    close(out.ratio_max, 0.0)
    close(out.loss, 0.0)
    kl = api.kl_penalty(lp, t([[0.0, NAN]]), nothing, kind="k3", coef=0.5)
    close(kl.kl_max, 0.0)
    close(kl.loss, 0.0)
    close(grad_of(out.loss + kl.loss, lp), [[0.0, 0.0]])


@API
def test_entropy_bonus_by_hand(api: Any) -> None:
    ent = t([[1.0, 3.0], [2.0, NAN]]).requires_grad_(True)
    out = api.entropy_bonus(ent, b([[T, T], [T, F]]), coef=0.01)
    # -0.01 * (1 + 3 + 2) / 3 = -0.02
    close(out.loss, -0.02)
    close(out.entropy_mean, 2.0)
    close(grad_of(out.loss, ent), [[-0.01 / 3, -0.01 / 3], [-0.01 / 3, 0.0]])


@API
@pytest.mark.parametrize(
    ("top", "expected"),
    [
        # valid entropies 0..4 (5 values): quantile q at position q * 4 (linear interpolation)
        (0.2, [F, F, F, F, T]),  # q 0.8 -> 3.2: only 4
        (0.5, [F, F, T, T, T]),  # q 0.5 -> 2: 2, 3, 4
        (1.0, [T, T, T, T, T]),  # q 0 -> 0: all valid
    ],
)
def test_high_entropy_mask_by_hand(api: Any, top: float, expected: list[bool]) -> None:
    ent = t([[0.0, 1.0, 2.0], [3.0, 4.0, 100.0]])
    mask = b([[T, T, T], [T, T, F]])
    got = api.high_entropy_mask(ent, mask, top)
    assert got.tolist() == [expected[:3], [*expected[3:], F]]  # bit-exact: bool masks


# --------------------------------------------------------------------------- rollout correction


@API
def test_rollout_correction_token(api: Any) -> None:
    # rho = exp(old - samp) = (3, 0.5), token 2 masked
    old = t([[math.log(3.0), math.log(0.5), 50.0]])
    samp = t([[0.0, 0.0, 0.0]])
    mask = b([[T, T, F]])
    out = api.rollout_correction(old, samp, mask, cap=2.0)
    close(out.weights, [[2.0, 0.5, 0.0]])  # min(rho, 2)
    assert out.mask.tolist() == [[T, T, F]]  # bit-exact: bool masks
    close(out.ratio_mean, 1.75)
    close(out.frac_clamped, 0.5)
    # ess = (2.5)^2 / (2 * (4 + 0.25)) = 6.25 / 8.5
    close(out.ess, 6.25 / 8.5)
    # mismatch_kl = mean(rho - 1 - log rho)
    close(out.mismatch_kl, ((2.0 - math.log(3.0)) + (-0.5 + LN2)) / 2.0)
    out = api.rollout_correction(old, samp, mask, cap=2.0, mode="mask")
    close(out.weights, [[0.0, 0.5, 0.0]])  # rho 3 > cap is dropped
    assert out.mask.tolist() == [[F, T, F]]  # bit-exact: bool masks
    close(out.frac_clamped, 0.5)
    close(out.ess, 0.25 / (2.0 * 0.25))  # (0.5)^2 / (2 * 0.25) = 0.5
    out = api.rollout_correction(old, samp, mask, cap=4.0, mode="mask", lower=0.6)
    close(out.weights, [[3.0, 0.0, 0.0]])  # 0.5 < lower is dropped
    assert out.mask.tolist() == [[T, F, F]]  # bit-exact: bool masks


@API
def test_rollout_correction_sequence(api: Any) -> None:
    # row 0: rho = exp(log 3 + log 0.5) = 1.5; row 1: rho = exp(log 4) = 4 > cap 2
    old = t([[math.log(3.0), math.log(0.5), 9.0], [math.log(4.0), 0.0, 0.0]])
    samp = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = b([[T, T, F], [T, F, F]])
    out = api.rollout_correction(old, samp, mask, level="sequence")
    close(out.weights, [[1.5, 1.5, 0.0], [2.0, 0.0, 0.0]])
    close(out.ratio_mean, (1.5 + 4.0) / 2.0)
    close(out.frac_clamped, 0.5)
    close(out.ess, 3.5**2 / (2.0 * (2.25 + 4.0)))
    # mismatch_kl is per token: mean over (3, 0.5, 4) of rho - 1 - log rho
    kl = [r - 1.0 - math.log(r) for r in (3.0, 0.5, 4.0)]
    close(out.mismatch_kl, sum(kl) / 3.0)
    out = api.rollout_correction(old, samp, mask, level="sequence", mode="mask")
    close(out.weights, [[1.5, 1.5, 0.0], [0.0, 0.0, 0.0]])
    assert out.mask.tolist() == [[T, T, F], [F, F, F]]  # bit-exact: bool masks


@API
def test_ess_edge_cases(api: Any) -> None:
    # ratio 3 > cap 2 in mode "mask": the only unit is dropped, every weight is 0, so there is no
    # effective sample: ess = 0 (the normalised ESS (sum w)^2 / (n sum w^2) is 0/0 here, and 0
    # is what "no usable sample" means to a monitor); with nothing valid it is 0 too.
    old = t([[math.log(3.0)]])
    samp = t([[0.0]])
    out = api.rollout_correction(old, samp, b([[T]]), mode="mask", cap=2.0)  # everything dropped
    close(out.weights, [[0.0]])
    close(out.ess, 0.0)
    out = api.rollout_correction(old, samp, b([[F]]))
    close(out.ess, 0.0)
    close(out.weights, [[0.0]])
