"""ILQL terms: a hand-derived case, float64 loop references, gradcheck, properties and errors."""

from __future__ import annotations

import math
from typing import Any

import losses_testlib as lib
import pytest
import ref_ilql as ref
import rl_losses
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from losses_testlib import AGGREGATIONS, grad_of
from rl_testing.strategies import mask_batches, rewards

F64 = torch.float64
T_, F_ = True, False
# rl_testing.tolerance for the hand case (3 positions, V = 2): the token mean over 3, after the
# log-sum-exp and the sum of the four terms. Elsewhere lib.LOSS_TOL (at most 64 tokens).
HAND_TOL: dict[str, int] = {"reduction": 3, "stages": 3}
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def t(data: Any) -> torch.Tensor:
    return torch.tensor(data, dtype=F64)


def scalar(x: Any) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def close(got: Any, expected: Any, **tol: Any) -> None:
    """``lib.close`` (rl_testing.tolerance, scale at least 1) on tensors, floats or lists."""
    got_t = got if isinstance(got, torch.Tensor) else t(got)
    exp_t = expected if isinstance(expected, torch.Tensor) else t(expected)
    lib.close(got_t, exp_t, **tol)


# --------------------------------------------------------------------------- hand-derived case
#
# One row, T = 3 positions, the last one padding (mask [T, T, F]); V = 2 tokens; one Q head whose
# target copy is equal to it; gamma = 0.5, tau = 0.75, cql_scale = 0.1, awac_scale = 1,
# awac_beta = 1, token mean over the 2 valid tokens.
#
#   values V(s_0) = 0.5, V(s_1) = 2.0            actions a_0 = 1, a_1 = 0
#   Q(s_0, .) = [0.0, 2.0] -> Q(s_0, a_0) = 2.0  Q(s_1, .) = [1.5, 0.0] -> Q(s_1, a_1) = 1.5
#   rewards r = [0, 1] (terminal reward on the last action), log pi = [ln 0.5, ln 0.25]
#
# next values: V(s_1) = 2.0 for t = 0, 0 (terminal) for t = 1
# TD targets:  y_0 = 0 + 0.5 * 2.0 = 1.0, y_1 = 1 + 0.5 * 0 = 1.0
# TD loss:     ((2.0 - 1.0)^2 + (1.5 - 1.0)^2) / 2 = (1 + 0.25) / 2 = 0.625
# expectile:   u_0 = 2.0 - 0.5 = 1.5 >= 0 -> 0.75 * 2.25 = 1.6875
#              u_1 = 1.5 - 2.0 = -0.5 < 0 -> 0.25 * 0.25 = 0.0625;    mean = 0.875
# CQL:         t=0: logsumexp(0, 2) - 2 = log(1 + e^-2);  t=1: logsumexp(1.5, 0) - 1.5 = log(1 + e^-1.5)
#              mean = (log(1 + e^-2) + log(1 + e^-1.5)) / 2 = (0.126928 + 0.201413) / 2 = 0.1641706
# AWAC:        A = [1.5, -0.5], w = [e^1.5, e^-0.5];  -w * log pi = [e^1.5 ln 2, e^-0.5 * 2 ln 2]
#              mean = (4.481689 * 0.693147 + 0.606531 * 1.386294) / 2 = (3.106470 + 0.840830) / 2
#                   = 1.973650
# total:       0.625 + 0.875 + 0.1 * 0.1641706 + 1.973650 = 3.490067
# gradients:   dL/dV(s_0) = -2 * 0.75 * 1.5 / 2 = -1.125 ; dL/dV(s_1) = -2 * 0.25 * (-0.5) / 2 = 0.125
#              dL/dlog pi = -w / 2 = [-e^1.5 / 2, -e^-0.5 / 2]
#              dL/dQ(s_0, a_0) = 2 (2.0 - 1.0) / 2 + 0.1 * (sigmoid(2) - 1) / 2
#              dL/dQ(s_0, 0)   = 0.1 * (1 - sigmoid(2)) / 2   (CQL only: not the taken token)
HAND = {
    "values": [[0.5, 2.0, 99.0]],
    "q": [[[0.0, 2.0], [1.5, 0.0], [7.0, -7.0]]],
    "actions": [[1, 0, -1]],
    "rewards": [[0.0, 1.0, 5.0]],
    "logprobs": [[math.log(0.5), math.log(0.25), 3.0]],
    "mask": [[T_, T_, F_]],
}
HAND_KW = {"gamma": 0.5, "tau": 0.75, "cql_scale": 0.1, "awac_scale": 1.0, "awac_beta": 1.0}
LN2 = math.log(2.0)
CQL_HAND = (math.log(1 + math.exp(-2.0)) + math.log(1 + math.exp(-1.5))) / 2
AWAC_HAND = (math.exp(1.5) * LN2 + math.exp(-0.5) * 2 * LN2) / 2


def hand_inputs() -> dict[str, torch.Tensor]:
    return {
        "values": t(HAND["values"]).requires_grad_(True),
        "q": t(HAND["q"]).requires_grad_(True),
        "actions": torch.tensor(HAND["actions"]),
        "rewards": t(HAND["rewards"]),
        "logprobs": t(HAND["logprobs"]).requires_grad_(True),
        "mask": torch.tensor(HAND["mask"]),
    }


def test_hand_case_combined_and_terms() -> None:
    x = hand_inputs()
    out = rl_losses.ilql_loss(
        x["logprobs"], x["q"], x["q"], x["values"], x["actions"], x["rewards"], x["mask"],
        **HAND_KW,
    )  # fmt: skip
    close(out.q_loss, 0.625, **HAND_TOL)
    close(out.v_loss, 0.875, **HAND_TOL)
    close(out.cql_loss, CQL_HAND, **HAND_TOL)
    close(out.awac_loss, AWAC_HAND, **HAND_TOL)
    close(out.loss, 0.625 + 0.875 + 0.1 * CQL_HAND + AWAC_HAND, **HAND_TOL)
    # the comment's total, written to 6 decimals
    assert float(out.loss) == pytest.approx(3.490067, abs=5e-7)
    close(out.q_mean, (2.0 + 1.5) / 2, **HAND_TOL)
    close(out.v_mean, (0.5 + 2.0) / 2, **HAND_TOL)
    close(out.advantage_mean, (1.5 - 0.5) / 2, **HAND_TOL)
    close(out.td_target_mean, 1.0, **HAND_TOL)
    close(out.awac_weight_mean, (math.exp(1.5) + math.exp(-0.5)) / 2, **HAND_TOL)
    out.loss.backward()
    close(x["values"].grad, [[-1.125, 0.125, 0.0]], **HAND_TOL)
    close(x["logprobs"].grad, [[-math.exp(1.5) / 2, -math.exp(-0.5) / 2, 0.0]], **HAND_TOL)
    s2 = 1 / (1 + math.exp(-2.0))
    assert x["q"].grad is not None
    close(x["q"].grad[0, 0, 1], 1.0 + 0.1 * (s2 - 1) / 2, **HAND_TOL)
    close(x["q"].grad[0, 0, 0], 0.1 * (1 - s2) / 2, **HAND_TOL)
    close(x["q"].grad[0, 2], [0.0, 0.0], **HAND_TOL)  # the padding position


def test_hand_case_reference_agrees() -> None:
    x = hand_inputs()
    got = ref.ref_ilql_loss(
        x["logprobs"], [x["q"]], [x["q"].detach()], x["values"], x["actions"], x["rewards"],
        x["mask"], **HAND_KW,
    )  # fmt: skip
    close(got["loss"], 0.625 + 0.875 + 0.1 * CQL_HAND + AWAC_HAND, **HAND_TOL)
    close(got["v_loss"], 0.875, **HAND_TOL)


def test_next_state_values_skips_non_actions_and_ends_terminal() -> None:
    values = t([[10.0, 11.0, 12.0, 13.0, 14.0], [20.0, 21.0, 22.0, 23.0, 24.0]])
    mask = torch.tensor([[T_, F_, T_, T_, F_], [F_, F_, F_, F_, T_]])
    close(rl_losses.next_state_values(values, mask), [[12.0, 0, 13.0, 0, 0], [0, 0, 0, 0, 0]])
    got = rl_losses.next_state_values(values, mask, terminal_values=t([-1.0, -2.0]))
    close(got, [[12.0, 0, 13.0, -1.0, 0], [0, 0, 0, 0, -2.0]])


def test_expectile_half_is_half_mse_and_tau_orders() -> None:
    values = t([[0.0, 1.0, -2.0]])
    target = t([[1.0, 0.5, 0.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    half = rl_losses.expectile_loss(values, target, mask, tau=0.5)
    close(half, 0.5 * ((1.0**2 + 0.5**2 + 2.0**2) / 3), **HAND_TOL)
    # tau = 0.9 weighs u > 0 (V below Q) 9 times more than u < 0
    close(rl_losses.expectile_loss(values, target, mask, tau=0.9),
          (0.9 * 1.0 + 0.1 * 0.25 + 0.9 * 4.0) / 3, **HAND_TOL)  # fmt: skip


def test_awac_beta_zero_is_behaviour_cloning_and_clip() -> None:
    lp = t([[-1.0, -2.0], [-0.5, 0.0]])
    adv = t([[3.0, -1.0], [0.0, 10.0]])
    mask = torch.tensor([[T_, T_], [T_, F_]])
    close(rl_losses.awac_loss(lp, adv, mask), (1.0 + 2.0 + 0.5) / 3, **HAND_TOL)
    clipped = rl_losses.awac_loss(lp, adv, mask, beta=1.0, max_weight=5.0)
    close(clipped, (5.0 * 1.0 + math.exp(-1.0) * 2.0 + 1.0 * 0.5) / 3, **HAND_TOL)


def test_two_heads_sum_and_min_target() -> None:
    g = torch.Generator().manual_seed(3)
    N, T, V = 2, 3, 4
    q1 = torch.randn(N, T, V, generator=g, dtype=F64)
    q2 = torch.randn(N, T, V, generator=g, dtype=F64)
    actions = torch.randint(0, V, (N, T), generator=g)
    mask = torch.tensor([[T_, T_, F_], [T_, T_, T_]])
    values = torch.randn(N, T, generator=g, dtype=F64)
    rw = torch.randn(N, T, generator=g, dtype=F64)
    lp = -torch.rand(N, T, generator=g, dtype=F64)
    both = rl_losses.ilql_loss(lp, [q1, q2], [q1, q2], values, actions, rw, mask)
    one = [rl_losses.ilql_loss(lp, q, q, values, actions, rw, mask) for q in (q1, q2)]
    close(both.q_loss, one[0].q_loss + one[1].q_loss)
    close(both.cql_loss, one[0].cql_loss + one[1].cql_loss)
    taken = torch.minimum(q1.gather(2, actions[..., None]), q2.gather(2, actions[..., None]))
    expected_v = rl_losses.expectile_loss(values, taken.squeeze(2), mask, tau=0.7)
    close(both.v_loss, expected_v)
    # targets already gathered at the taken tokens give the same result
    gathered = [q.gather(2, actions[..., None]).squeeze(2) for q in (q1, q2)]
    close(rl_losses.ilql_loss(lp, [q1, q2], gathered, values, actions, rw, mask).loss, both.loss)
    mean = rl_losses.ilql_loss(lp, [q1, q2], [q1, q2], values, actions, rw, mask,
                               target_reduction="mean")  # fmt: skip
    close(mean.target_q_mean, (gathered[0] + gathered[1])[mask].mean() / 2)


# --------------------------------------------------------------------------- references


def random_inputs(g: torch.Generator, mask: torch.Tensor, V: int, heads: int) -> dict[str, Any]:
    N, T = mask.shape
    garbage = torch.randn(N, T, generator=g, dtype=F64) * 7 + 3

    def valid_or_garbage(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, garbage)

    actions = torch.randint(0, V, (N, T), generator=g)
    return {
        "logprobs": valid_or_garbage(-torch.rand(N, T, generator=g, dtype=F64) * 3),
        "qs": [torch.randn(N, T, V, generator=g, dtype=F64) * 2 for _ in range(heads)],
        "target_qs": [torch.randn(N, T, V, generator=g, dtype=F64) * 2 for _ in range(heads)],
        "values": valid_or_garbage(torch.randn(N, T, generator=g, dtype=F64)),
        "actions": torch.where(mask, actions, torch.full_like(actions, -5)),
        "rewards": valid_or_garbage(torch.randn(N, T, generator=g, dtype=F64)),
        "mask": mask,
    }


CASES = [
    {"aggregation": a, "heads": h, "awac_beta": b}
    for a in AGGREGATIONS
    for h, b in ((1, 0.0), (2, 0.7))
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['aggregation']}-{c['heads']}q")
def test_ilql_loss_matches_loop_reference(case: dict[str, Any]) -> None:
    g = torch.Generator().manual_seed(11)
    mask = torch.tensor([[T_, T_, F_, T_], [F_, F_, F_, F_], [T_, T_, T_, F_], [F_, T_, F_, F_]])
    x = random_inputs(g, mask, 5, case["heads"])
    kw = {"gamma": 0.9, "tau": 0.8, "cql_scale": 0.3, "awac_scale": 0.5,
          "awac_beta": case["awac_beta"], "aggregation": case["aggregation"],
          "max_length": 6, "awac_max_weight": 3.0}  # fmt: skip
    lp = x["logprobs"].clone().requires_grad_(True)
    qs = [q.clone().requires_grad_(True) for q in x["qs"]]
    v = x["values"].clone().requires_grad_(True)
    out = rl_losses.ilql_loss(lp, qs, x["target_qs"], v, x["actions"], x["rewards"], mask, **kw)
    lp_r = x["logprobs"].clone().requires_grad_(True)
    qs_r = [q.clone().requires_grad_(True) for q in x["qs"]]
    v_r = x["values"].clone().requires_grad_(True)
    expected = ref.ref_ilql_loss(lp_r, qs_r, x["target_qs"], v_r, x["actions"], x["rewards"],
                                 mask, **kw)  # fmt: skip
    close(out.loss, expected["loss"])
    for key, value in out.metrics().items():
        close(value, scalar(expected[key]), msg=key)
    for mine, theirs in ((lp, lp_r), (v, v_r), *zip(qs, qs_r, strict=True)):
        close(grad_of(out.loss, mine), grad_of(expected["loss"], theirs))


# --------------------------------------------------------------------------- gradcheck

MASK = torch.tensor([[T_, T_, F_, T_], [F_, F_, F_, F_], [T_, T_, T_, F_], [F_, T_, F_, F_]])


def gradcheck(fn: Any, *inputs: torch.Tensor) -> None:
    inputs = tuple(x.detach().clone().requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def _away_from_zero(x: torch.Tensor, margin: float = 0.05) -> torch.Tensor:
    """Moves entries off the expectile kink u = 0."""
    return torch.where(x.abs() < margin, x.sign() * margin + (x == 0) * margin, x)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradcheck_each_term(aggregation: str) -> None:
    g = torch.Generator().manual_seed(5)
    x = random_inputs(g, MASK, 4, 1)
    agg = {"aggregation": aggregation, "max_length": 5}
    nxt = torch.randn(4, 4, generator=g, dtype=F64)
    gradcheck(lambda q: rl_losses.ilql_td_loss(q, x["rewards"], nxt, MASK, gamma=0.9, **agg),
              x["values"])  # fmt: skip
    target = x["values"] + _away_from_zero(torch.randn(4, 4, generator=g, dtype=F64))
    gradcheck(lambda v: rl_losses.expectile_loss(v, target, MASK, tau=0.8, **agg), x["values"])
    gradcheck(lambda q: rl_losses.cql_loss(q, x["actions"], MASK, **agg), x["qs"][0])
    adv = torch.randn(4, 4, generator=g, dtype=F64)
    gradcheck(lambda lp: rl_losses.awac_loss(lp, adv, MASK, beta=0.5, **agg), x["logprobs"])
    # next_state_values is a gather: linear in values
    gradcheck(lambda v: rl_losses.next_state_values(v, MASK), x["values"])


def test_gradcheck_combined_loss() -> None:
    g = torch.Generator().manual_seed(6)
    x = random_inputs(g, MASK, 3, 2)
    target_taken = [
        x["values"] + _away_from_zero(torch.randn(4, 4, generator=g, dtype=F64)) for _ in range(2)
    ]

    def fn(lp: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # targets and next values fixed; awac_beta = 0 so the stop-gradient AWAC weight is a
        # constant (with beta > 0 it depends on v without a gradient: not a true gradient)
        out = rl_losses.ilql_loss(lp, [q1, q2], target_taken, v, x["actions"], x["rewards"],
                                  MASK, awac_beta=0.0, next_values=x["rewards"])  # fmt: skip
        return out.loss

    gradcheck(fn, x["logprobs"], x["qs"][0], x["qs"][1], x["values"])


# --------------------------------------------------------------------------- properties


@st.composite
def ilql_batches(draw: st.DrawFn) -> dict[str, Any]:
    mask = draw(mask_batches(4, 5, allow_empty_rows=True, right_padded=draw(st.booleans())))
    N, T = mask.shape
    V = draw(st.integers(1, 4))
    heads = draw(st.integers(1, 2))
    qs = [draw(rewards((N, T, V), min_value=-3, max_value=3)) for _ in range(heads)]
    tqs = [draw(rewards((N, T, V), min_value=-3, max_value=3)) for _ in range(heads)]
    actions = draw(
        st.lists(st.integers(0, V - 1), min_size=N * T, max_size=N * T).map(
            lambda xs: torch.tensor(xs, dtype=torch.long).reshape(N, T)
        )
    )
    return {
        "logprobs": draw(rewards((N, T), min_value=-5, max_value=0)),
        "qs": qs,
        "target_qs": tqs,
        "values": draw(rewards((N, T), min_value=-3, max_value=3)),
        "actions": actions,
        "rewards": draw(rewards((N, T), min_value=-2, max_value=2)),
        "mask": mask,
    }


HYPER = st.fixed_dictionaries(
    {
        "gamma": st.floats(0.0, 1.0),
        "tau": st.floats(0.05, 0.95),
        "cql_scale": st.floats(0.0, 2.0),
        "awac_scale": st.floats(0.0, 2.0),
        "awac_beta": st.floats(0.0, 2.0),
        "aggregation": st.sampled_from(AGGREGATIONS),
        "target_reduction": st.sampled_from(("min", "mean")),
    }
)


@SETTINGS
@given(b=ilql_batches(), kw=HYPER)
def test_property_matches_reference_and_is_finite(b: dict[str, Any], kw: dict[str, Any]) -> None:
    out = rl_losses.ilql_loss(b["logprobs"], b["qs"], b["target_qs"], b["values"], b["actions"],
                              b["rewards"], b["mask"], **kw)  # fmt: skip
    expected = ref.ref_ilql_loss(b["logprobs"], b["qs"], b["target_qs"], b["values"],
                                 b["actions"], b["rewards"], b["mask"], **kw)  # fmt: skip
    assert torch.isfinite(out.loss)
    close(out.loss, expected["loss"])
    for key in ("q_loss", "v_loss", "cql_loss", "awac_loss"):
        assert float(getattr(out, key)) >= -1e-12, key  # every term is non-negative
    if not bool(b["mask"].any()):
        assert float(out.loss) == 0.0


@SETTINGS
@given(b=ilql_batches(), kw=HYPER, seed=st.integers(0, 2**16))
def test_property_masked_positions_have_no_influence(
    b: dict[str, Any], kw: dict[str, Any], seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    m = b["mask"]
    N, T = m.shape

    def scramble(x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=g, dtype=F64) * 50
        keep = m if x.ndim == 2 else m[..., None].expand(x.shape)
        return torch.where(keep, x, noise)

    actions = torch.where(m, b["actions"], torch.randint(-9, 9, (N, T), generator=g))
    lp = b["logprobs"].clone().requires_grad_(True)
    lp2 = scramble(b["logprobs"]).requires_grad_(True)
    first = rl_losses.ilql_loss(lp, b["qs"], b["target_qs"], b["values"], b["actions"],
                                b["rewards"], m, **kw)  # fmt: skip
    second = rl_losses.ilql_loss(lp2, [scramble(q) for q in b["qs"]],
                                 [scramble(q) for q in b["target_qs"]], scramble(b["values"]),
                                 actions, scramble(b["rewards"]), m, **kw)  # fmt: skip
    close(first.loss, second.loss)
    for key, value in first.metrics().items():
        close(value, second.metrics()[key], msg=key)
    grad = grad_of(second.loss, lp2)
    assert bool((grad[~m] == 0).all())


@SETTINGS
@given(b=ilql_batches(), kw=HYPER)
def test_property_micro_batches_sum_to_the_full_loss(b: dict[str, Any], kw: dict[str, Any]) -> None:
    """With the global normaliser (valid tokens, or valid rows), two row halves add up."""
    m = b["mask"]
    N = m.shape[0]
    agg = kw["aggregation"]
    denom = float(m.sum()) if agg == "token_mean" else float(m.any(1).sum())
    if denom == 0 or N < 2:
        return
    args = ("logprobs", "qs", "target_qs", "values", "actions", "rewards", "mask")

    def rows(sl: slice) -> list[Any]:
        return [[q[sl] for q in b[a]] if a.endswith("qs") else b[a][sl] for a in args]

    full = rl_losses.ilql_loss(*rows(slice(None)), normalizer=denom, max_length=7, **kw)
    half = N // 2
    parts = [rl_losses.ilql_loss(*rows(sl), normalizer=denom, max_length=7, **kw).loss
             for sl in (slice(0, half), slice(half, N))]  # fmt: skip
    close(parts[0] + parts[1], full.loss)  # two row halves: another summation order


@SETTINGS
@given(b=ilql_batches(), gamma=st.floats(0.0, 1.0))
def test_property_td_loss_is_zero_at_the_target(b: dict[str, Any], gamma: float) -> None:
    m = b["mask"]
    nxt = rl_losses.next_state_values(b["values"], m)
    q = b["rewards"] + gamma * nxt
    assert float(rl_losses.ilql_td_loss(q, b["rewards"], nxt, m, gamma=gamma)) == pytest.approx(
        0.0, abs=1e-12
    )
    # bit-exact: next values are the values moved, no arithmetic
    assert torch.equal(nxt, ref.ref_next_state_values(b["values"], m))


# --------------------------------------------------------------------------- errors


def test_errors_name_the_argument_and_both_shapes() -> None:
    x = hand_inputs()
    lp, q, v, a, r, m = (x[k] for k in ("logprobs", "q", "values", "actions", "rewards", "mask"))
    with pytest.raises(
        ValueError, match=r"`rewards` has shape \[1, 2\] but `values` has shape \[1, 3\]"
    ):
        rl_losses.ilql_loss(lp, q, q, v, a, r[:, :2], m)
    with pytest.raises(
        ValueError,
        match=r"`qs\[0\]` must have shape \[N, T, V\] with \[N, T\] = \[1, 3\].*\[1, 2, 2\]",
    ):
        rl_losses.ilql_loss(lp, q[:, :2], q, v, a, r, m)
    with pytest.raises(ValueError, match=r"`target_qs` has 1 head\(s\) but `qs` has 2"):
        rl_losses.ilql_loss(lp, [q, q], [q], v, a, r, m)
    with pytest.raises(ValueError, match=r"`actions` has 1 token id\(s\) outside \[0, 2\)"):
        rl_losses.ilql_loss(lp, q, q, v, torch.tensor([[1, 2, 0]]), r, m)
    with pytest.raises(TypeError, match="`actions` must hold integer token ids"):
        rl_losses.cql_loss(q, a.double(), m)
    with pytest.raises(
        ValueError, match=r"`values` has 1 non-finite value\(s\) at valid positions"
    ):
        rl_losses.ilql_loss(lp, q, q, t([[0.5, math.nan, 0.0]]), a, r, m)
    with pytest.raises(ValueError, match=r"`terminal_values` must have shape \[N\] = \[1\]"):
        rl_losses.next_state_values(v, m, terminal_values=t([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"`target_qs\[0\]` must have shape \[N, T\] = \[1, 3\]"):
        rl_losses.ilql_loss(lp, q, v[:, :2], v, a, r, m)
    with pytest.raises(ValueError, match="`qs` is empty"):
        rl_losses.ilql_loss(lp, [], [], v, a, r, m)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"gamma": 1.5}, r"`gamma` must be in \[0.0, 1.0\]"),
        ({"tau": 1.0}, r"`tau` must be in \(0.0, 1.0\)"),
        ({"cql_scale": -1.0}, "`cql_scale` must be >= 0"),
        ({"awac_scale": -0.1}, "`awac_scale` must be >= 0"),
        ({"awac_beta": -1.0}, "`awac_beta` must be >= 0"),
        ({"awac_max_weight": 0.0}, "`awac_max_weight` must be > 0"),
        ({"target_reduction": "max"}, "`target_reduction` must be one of 'min', 'mean'"),
        ({"aggregation": "sum"}, "`aggregation` must be one of"),
    ],
)
def test_bad_hyperparameters(kw: dict[str, Any], message: str) -> None:
    x = hand_inputs()
    with pytest.raises(ValueError, match=message):
        rl_losses.ilql_loss(x["logprobs"], x["q"], x["q"], x["values"], x["actions"],
                            x["rewards"], x["mask"], **kw)  # fmt: skip


def test_float32_and_detached_diagnostics() -> None:
    x = hand_inputs()
    out = rl_losses.ilql_loss(
        x["logprobs"].float(), x["q"].float(), x["q"].float(), x["values"].float(),
        x["actions"], x["rewards"].float(), x["mask"], **HAND_KW,
    )  # fmt: skip
    assert out.loss.dtype == torch.float32
    close(out.loss, 0.625 + 0.875 + 0.1 * CQL_HAND + AWAC_HAND, **HAND_TOL)  # float32
    for key in out.metrics():
        if key != "loss":
            assert not getattr(out, key).requires_grad, key
