"""Bad input -> ValueError naming the argument (and both shapes for shape mismatches);
non-finite rewards; the estimator registry.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import rl_advantages as ra
import torch
from rl_testing import tolerance

F64 = torch.float64
NAN = float("nan")
INF = float("inf")


def t(data: Any) -> torch.Tensor:
    return torch.tensor(data, dtype=F64)


def ones(*shape: int) -> torch.Tensor:
    return torch.ones(shape, dtype=F64)


def bmask(*shape: int) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.bool)


def _shape_pattern(*dims: int) -> str:
    # accepts "(3, 4)", "[3, 4]", "torch.Size([3, 4])", "(3,4)"
    return r"\D" + r",\s*".join(str(d) for d in dims) + r"\D"


# --------------------------------------------------------------------------- shape mismatches

# (call, argument names one of which the message must name); shapes [3, 4] vs [3, 5]
SHAPE_MISMATCHES: dict[str, tuple[Callable[[], Any], str]] = {
    "masked_sum": (lambda: ra.masked_sum(x=ones(3, 4), mask=bmask(3, 5)), "x|mask"),
    "masked_mean": (lambda: ra.masked_mean(x=ones(3, 4), mask=bmask(3, 5)), "x|mask"),
    "masked_var": (lambda: ra.masked_var(x=ones(3, 4), mask=bmask(3, 5)), "x|mask"),
    "whiten": (lambda: ra.whiten(x=ones(3, 4), mask=bmask(3, 5)), "x|mask"),
    "rebn": (lambda: ra.rebn(returns=ones(3, 4), mask=bmask(3, 5)), "returns|mask"),
    "discounted_returns": (
        lambda: ra.discounted_returns(rewards=ones(3, 4), mask=bmask(3, 5), gamma=1.0),
        "rewards|mask",
    ),
    "gae_values": (
        lambda: ra.gae(
            rewards=ones(3, 4), values=ones(3, 5), mask=bmask(3, 4), gamma=1.0, lmbda=1.0
        ),
        "values",
    ),
    "gae_mask": (
        lambda: ra.gae(
            rewards=ones(3, 4), values=ones(3, 4), mask=bmask(3, 5), gamma=1.0, lmbda=1.0
        ),
        "mask",
    ),
    "remax": (
        lambda: ra.remax(token_rewards=ones(3, 4), mask=bmask(3, 5), baselines=ones(3)),
        "token_rewards|mask",
    ),
    "reinforce_plus_plus": (
        lambda: ra.reinforce_plus_plus(token_rewards=ones(3, 4), mask=bmask(3, 5)),
        "token_rewards|mask",
    ),
    "kl_in_reward": (
        lambda: ra.kl_in_reward(scores=ones(3), mask=bmask(3, 4), kl=ones(3, 5), beta=0.1),
        "kl",
    ),
    "reinforce_plus_plus_baseline": (
        lambda: ra.reinforce_plus_plus_baseline(
            scores=ones(3), mask=bmask(3, 4), group_size=3, kl=ones(3, 5), beta=0.1
        ),
        "kl",
    ),
    "pool_to_turns": (
        lambda: ra.pool_to_turns(values=ones(3, 4), turn_ids=torch.zeros(3, 5, dtype=torch.long)),
        "values|turn_ids",
    ),
    "group_relative_per_turn": (
        lambda: ra.group_relative_per_turn(rewards=ones(3, 4), turn_mask=bmask(3, 5), group_size=3),
        "rewards|turn_mask",
    ),
}


@pytest.mark.parametrize("case", sorted(SHAPE_MISMATCHES))
def test_shape_mismatch_names_argument_and_both_shapes(case: str) -> None:
    call, names = SHAPE_MISMATCHES[case]
    with pytest.raises(ValueError, match=names) as info:
        call()
    message = str(info.value)
    assert re.search(_shape_pattern(3, 4), f" {message} "), message
    assert re.search(_shape_pattern(3, 5), f" {message} "), message


# [N] arguments against N = 4 (group functions) or the batch of a [3, 4] tensor
LENGTH_MISMATCHES: dict[str, tuple[Callable[[], Any], str]] = {
    "group_relative_mask": (
        lambda: ra.group_relative(rewards=ones(4), group_size=2, mask=bmask(6)),
        "mask",
    ),
    "rloo_mask": (lambda: ra.rloo(rewards=ones(4), group_size=2, mask=bmask(6)), "mask"),
    "gpg_mask": (lambda: ra.gpg(rewards=ones(4), group_size=2, mask=bmask(6)), "mask"),
    "pass_at_k_mask": (lambda: ra.pass_at_k(rewards=ones(4), group_size=2, mask=bmask(6)), "mask"),
    "dynamic_sampling_mask_mask": (
        lambda: ra.dynamic_sampling_mask(rewards=ones(4), group_size=2, mask=bmask(6)),
        "mask",
    ),
    "gdpo_mask": (
        lambda: ra.gdpo(rewards=ones(4, 2), group_size=2, mask=bmask(6)),
        "mask",
    ),
    "opo_lengths": (
        lambda: ra.opo(rewards=ones(4), lengths=torch.ones(6, dtype=torch.long), group_size=2),
        "lengths",
    ),
    "discounted_returns_bootstrap": (
        lambda: ra.discounted_returns(
            rewards=ones(3, 4), mask=bmask(3, 4), gamma=1.0, bootstrap=ones(6)
        ),
        "bootstrap",
    ),
    "gae_bootstrap": (
        lambda: ra.gae(
            rewards=ones(3, 4),
            values=ones(3, 4),
            mask=bmask(3, 4),
            gamma=1.0,
            lmbda=1.0,
            bootstrap=ones(6),
        ),
        "bootstrap",
    ),
    "remax_baselines": (
        lambda: ra.remax(token_rewards=ones(3, 4), mask=bmask(3, 4), baselines=ones(6)),
        "baselines",
    ),
    "kl_in_reward_scores": (
        lambda: ra.kl_in_reward(scores=ones(6), mask=bmask(3, 4)),
        "scores|mask",
    ),
    "group_relative_per_turn_fallback": (
        lambda: ra.group_relative_per_turn(
            rewards=ones(4, 2), turn_mask=bmask(4, 2), group_size=2, fallback=ones(6)
        ),
        "fallback",
    ),
    "broadcast_to_tokens_rows": (
        lambda: ra.broadcast_to_tokens(
            turn_values=ones(6, 2), turn_ids=torch.zeros(3, 4, dtype=torch.long)
        ),
        "turn_values|turn_ids",
    ),
}


@pytest.mark.parametrize("case", sorted(LENGTH_MISMATCHES))
def test_length_mismatch_names_argument(case: str) -> None:
    call, names = LENGTH_MISMATCHES[case]
    with pytest.raises(ValueError, match=names) as info:
        call()
    assert re.search(r"\b6\b", str(info.value)), str(info.value)


# --------------------------------------------------------------------------- group sizes


def _group_calls(n: int, g: int) -> dict[str, Callable[[], Any]]:
    r = torch.arange(n, dtype=F64)
    return {
        "group_relative": lambda: ra.group_relative(rewards=r, group_size=g),
        "group_relative_batch": lambda: ra.group_relative(rewards=r, group_size=g, scale="batch"),
        "rloo": lambda: ra.rloo(rewards=r, group_size=g),
        "gpg": lambda: ra.gpg(rewards=r, group_size=g),
        "opo": lambda: ra.opo(rewards=r, lengths=torch.ones(n, dtype=torch.long), group_size=g),
        "pass_at_k": lambda: ra.pass_at_k(rewards=r, group_size=g),
        "dynamic_sampling_mask": lambda: ra.dynamic_sampling_mask(rewards=r, group_size=g),
        "group_relative_per_turn": lambda: ra.group_relative_per_turn(
            rewards=r.reshape(n, 1), turn_mask=torch.ones(n, 1, dtype=torch.bool), group_size=g
        ),
        "reinforce_plus_plus_baseline": lambda: ra.reinforce_plus_plus_baseline(
            scores=r, mask=torch.ones(n, 3, dtype=torch.bool), group_size=g
        ),
    }


GROUP_FUNCTIONS = sorted(_group_calls(4, 2))


@pytest.mark.parametrize("name", GROUP_FUNCTIONS)
@pytest.mark.parametrize("group_size", [1, 0, -2])
def test_group_size_below_two(name: str, group_size: int) -> None:
    with pytest.raises(ValueError, match="group_size"):
        _group_calls(4, group_size)[name]()


@pytest.mark.parametrize("name", GROUP_FUNCTIONS)
def test_n_not_divisible_by_group_size(name: str) -> None:
    # N = 6, G = 4; the message may blame group_size or the rewards/scores
    with pytest.raises(ValueError, match=r"group_size|rewards|scores"):
        _group_calls(6, 4)[name]()


@pytest.mark.parametrize("name", GROUP_FUNCTIONS)
def test_empty_batch_raises(name: str) -> None:
    with pytest.raises(ValueError, match=r"rewards|scores|group_size|empty"):
        _group_calls(0, 2)[name]()


# --------------------------------------------------------------------------- turn ids


@pytest.mark.parametrize("bad", [-2, 3])
def test_pool_to_turns_ids_out_of_range(bad: int) -> None:
    ids = torch.tensor([[0, 1, bad], [0, 2, -1]])
    with pytest.raises(ValueError, match="turn_ids"):
        ra.pool_to_turns(values=ones(2, 3), turn_ids=ids, num_turns=3)


def test_pool_to_turns_below_minus_one_without_num_turns() -> None:
    with pytest.raises(ValueError, match="turn_ids"):
        ra.pool_to_turns(values=ones(1, 3), turn_ids=torch.tensor([[0, -5, 1]]))


@pytest.mark.parametrize("bad", [-2, 2, 7])
def test_broadcast_to_tokens_ids_out_of_range(bad: int) -> None:
    ids = torch.tensor([[0, 1, bad]])
    with pytest.raises(ValueError, match="turn_ids"):
        ra.broadcast_to_tokens(turn_values=ones(1, 2), turn_ids=ids)


# --------------------------------------------------------------------------- other bad values


def test_opo_nonpositive_length_of_valid_sample() -> None:
    with pytest.raises(ValueError, match="lengths"):
        ra.opo(rewards=ones(4), lengths=torch.tensor([3, 0, 2, 2]), group_size=2)
    with pytest.raises(ValueError, match="lengths"):
        ra.opo(rewards=ones(4), lengths=torch.tensor([3, 1, -2, 2]), group_size=2)


def test_opo_nonpositive_length_of_invalid_sample_is_fine() -> None:
    mask = torch.tensor([True, False, True, True])
    out = ra.opo(
        rewards=t([1.0, 5.0, 2.0, 0.0]), lengths=torch.tensor([1, 0, 1, 1]), group_size=2, mask=mask
    )
    assert torch.isfinite(out).all()


OPTION_ERRORS: dict[str, tuple[Callable[[], Any], str]] = {
    "group_relative_scale": (
        lambda: ra.group_relative(rewards=ones(4), group_size=2, scale="bogus"),
        "scale",
    ),
    "group_relative_per_turn_scale": (
        lambda: ra.group_relative_per_turn(
            rewards=ones(4, 2), turn_mask=bmask(4, 2), group_size=2, scale="bogus"
        ),
        "scale",
    ),
    "pass_at_k_scale": (
        lambda: ra.pass_at_k(rewards=ones(4), group_size=2, scale="bogus"),
        "scale",
    ),
    "gpg_alpha": (lambda: ra.gpg(rewards=ones(4), group_size=2, alpha="bogus"), "alpha"),
    "pool_to_turns_reduction": (
        lambda: ra.pool_to_turns(
            values=ones(1, 2), turn_ids=torch.tensor([[0, 0]]), reduction="bogus"
        ),
        "reduction",
    ),
    "broadcast_to_tokens_placement": (
        lambda: ra.broadcast_to_tokens(
            turn_values=ones(1, 1), turn_ids=torch.tensor([[0, 0]]), placement="bogus"
        ),
        "placement",
    ),
    "group_relative_nonfinite": (
        lambda: ra.group_relative(rewards=ones(4), group_size=2, nonfinite="bogus"),
        "nonfinite",
    ),
    "discounted_returns_nonfinite": (
        lambda: ra.discounted_returns(
            rewards=ones(2, 2), mask=bmask(2, 2), gamma=1.0, nonfinite="ignore"
        ),
        "nonfinite",
    ),
    "discounted_returns_gap": (
        lambda: ra.discounted_returns(rewards=ones(2, 2), mask=bmask(2, 2), gamma=1.0, gap="zero"),
        "gap",
    ),
    "gae_gap": (
        lambda: ra.gae(
            rewards=ones(2, 2), values=ones(2, 2), mask=bmask(2, 2), gamma=1.0, lmbda=1.0, gap=""
        ),
        "gap",
    ),
    "reinforce_plus_plus_gap": (
        lambda: ra.reinforce_plus_plus(token_rewards=ones(2, 2), mask=bmask(2, 2), gap="Reset"),
        "gap",
    ),
}


@pytest.mark.parametrize("case", sorted(OPTION_ERRORS))
def test_unknown_option_names_argument(case: str) -> None:
    call, name = OPTION_ERRORS[case]
    with pytest.raises(ValueError, match=name):
        call()


# --------------------------------------------------------------------------- non-finite rewards
# Each case: the function, the name of its rewards-like argument, kwargs with a non-finite value
# at a VALID position, and an equivalent call with that position masked out explicitly (the
# non-finite value replaced by 0) -- nonfinite="mask" must give the explicit call's result.

N4 = torch.tensor([True, True, True, True])


def _tok(bad: float) -> torch.Tensor:
    x = t([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    x[0, 1] = bad
    return x


TOK_MASK = torch.tensor([[True, True, True], [True, False, True]])
TOK_MASK_FIXED = torch.tensor([[True, False, True], [True, False, True]])


def _grp(bad: float) -> torch.Tensor:
    return t([1.0, bad, 0.0, 2.0, 3.0, 1.0])


GRP_MASK_FIXED = torch.tensor([True, False, True, True, True, True])


def _nonfinite_cases(bad: float) -> dict[str, tuple[Callable[..., Any], str, dict, dict]]:
    tok_fixed = torch.where(TOK_MASK_FIXED, _tok(0.0), 0.0)
    grp_fixed = torch.where(GRP_MASK_FIXED, _grp(0.0), 0.0)
    values = t([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    lengths = torch.tensor([1, 2, 3, 4, 5, 6])
    turn_mask = torch.tensor([[True, True], [True, True], [True, False], [True, True]])
    tr = t([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    tr_bad = tr.clone()
    tr_bad[1, 1] = bad
    tr_fixed_mask = turn_mask.clone()
    tr_fixed_mask[1, 1] = False
    return {
        "discounted_returns": (
            ra.discounted_returns,
            "rewards",
            {"rewards": _tok(bad), "mask": TOK_MASK, "gamma": 0.9},
            {"rewards": tok_fixed, "mask": TOK_MASK_FIXED, "gamma": 0.9},
        ),
        "gae": (
            ra.gae,
            "rewards",
            {"rewards": _tok(bad), "values": values, "mask": TOK_MASK, "gamma": 0.9, "lmbda": 0.8},
            {
                "rewards": tok_fixed,
                "values": values,
                "mask": TOK_MASK_FIXED,
                "gamma": 0.9,
                "lmbda": 0.8,
            },
        ),
        "remax": (
            ra.remax,
            "token_rewards",
            {"token_rewards": _tok(bad), "mask": TOK_MASK, "baselines": t([1.0, 2.0])},
            {"token_rewards": tok_fixed, "mask": TOK_MASK_FIXED, "baselines": t([1.0, 2.0])},
        ),
        "reinforce_plus_plus": (
            ra.reinforce_plus_plus,
            "token_rewards",
            {"token_rewards": _tok(bad), "mask": TOK_MASK},
            {"token_rewards": tok_fixed, "mask": TOK_MASK_FIXED},
        ),
        "group_relative": (
            ra.group_relative,
            "rewards",
            {"rewards": _grp(bad), "group_size": 3},
            {"rewards": grp_fixed, "group_size": 3, "mask": GRP_MASK_FIXED},
        ),
        "group_relative_batch": (
            ra.group_relative,
            "rewards",
            {"rewards": _grp(bad), "group_size": 3, "scale": "batch"},
            {"rewards": grp_fixed, "group_size": 3, "scale": "batch", "mask": GRP_MASK_FIXED},
        ),
        "rloo": (
            ra.rloo,
            "rewards",
            {"rewards": _grp(bad), "group_size": 3},
            {"rewards": grp_fixed, "group_size": 3, "mask": GRP_MASK_FIXED},
        ),
        "gpg": (
            ra.gpg,
            "rewards",
            {"rewards": _grp(bad), "group_size": 3},
            {"rewards": grp_fixed, "group_size": 3, "mask": GRP_MASK_FIXED},
        ),
        "opo": (
            ra.opo,
            "rewards",
            {"rewards": _grp(bad), "lengths": lengths, "group_size": 3},
            {"rewards": grp_fixed, "lengths": lengths, "group_size": 3, "mask": GRP_MASK_FIXED},
        ),
        "pass_at_k": (
            ra.pass_at_k,
            "rewards",
            {"rewards": _grp(bad), "group_size": 3},
            {"rewards": grp_fixed, "group_size": 3, "mask": GRP_MASK_FIXED},
        ),
        "dynamic_sampling_mask": (
            ra.dynamic_sampling_mask,
            "rewards",
            {"rewards": _grp(bad), "group_size": 3},
            {"rewards": grp_fixed, "group_size": 3, "mask": GRP_MASK_FIXED},
        ),
        "group_relative_per_turn": (
            ra.group_relative_per_turn,
            "rewards",
            {"rewards": tr_bad, "turn_mask": turn_mask, "group_size": 2},
            {
                "rewards": torch.where(tr_fixed_mask, tr, 0.0),
                "turn_mask": tr_fixed_mask,
                "group_size": 2,
            },
        ),
    }


NONFINITE_NAMES = sorted(_nonfinite_cases(NAN))


@pytest.mark.parametrize("name", NONFINITE_NAMES)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_rewards_raise(name: str, bad: float) -> None:
    fn, arg, kwargs, _ = _nonfinite_cases(bad)[name]
    with pytest.raises(ValueError, match=arg):
        fn(**kwargs)
    with pytest.raises(ValueError, match=arg):
        fn(**kwargs, nonfinite="raise")


@pytest.mark.parametrize("name", NONFINITE_NAMES)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_mask_equals_explicit_mask(name: str, bad: float) -> None:
    fn, _, kwargs, explicit = _nonfinite_cases(bad)[name]
    got = fn(**kwargs, nonfinite="mask")
    expected = fn(**explicit)
    got_t = tuple(got) if isinstance(got, tuple | list) else (got,)
    exp_t = tuple(expected) if isinstance(expected, tuple | list) else (expected,)
    for g, e in zip(got_t, exp_t, strict=True):
        if not g.is_floating_point():
            assert torch.equal(g, e)  # bit-exact: integer / bool outputs
            continue
        assert torch.isfinite(g).all()
        # another mask route: at most 8 inputs, up to 4 chained reductions (the group mean, the
        # scan, the batch mean and std), terms as large as the rewards (up to 8)
        tolerance.assert_close(g, e, reduction=8, stages=4, scale=8.0, msg=name)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_scores_kl_in_reward(bad: float) -> None:
    scores = t([1.0, bad, 2.0])
    mask = torch.ones(3, 4, dtype=torch.bool)
    kl = torch.full((3, 4), 0.5, dtype=F64)
    with pytest.raises(ValueError, match="scores"):
        ra.kl_in_reward(scores=scores, mask=mask, kl=kl, beta=0.1)
    out = ra.kl_in_reward(scores=scores, mask=mask, kl=kl, beta=0.1, nonfinite="mask")
    assert torch.isfinite(out).all()
    # The masked score contributes nothing. Whether its row's KL penalty stays (only the score is
    # masked) or the whole row is dropped (the sample is invalid) is not pinned down: accept both.
    kl_only = torch.full((4,), -0.05, dtype=F64)
    r = tolerance.rtol(F64)  # elementwise: -beta * kl
    assert bool((out[1] == 0).all()) or torch.allclose(out[1], kl_only, rtol=r, atol=r * 0.05)
    expected_rows = ra.kl_in_reward(
        scores=scores[[0, 2]], mask=mask[[0, 2]], kl=kl[[0, 2]], beta=0.1
    )
    # the other rows alone: sums over their 4 tokens
    tolerance.assert_close(out[[0, 2]], expected_rows, reduction=4, scale=2.0)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_scores_reinforce_plus_plus_baseline(bad: float) -> None:
    scores = t([1.0, bad, 2.0, 0.0])
    mask = torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="scores"):
        ra.reinforce_plus_plus_baseline(scores=scores, mask=mask, group_size=2)
    adv, ret = ra.reinforce_plus_plus_baseline(
        scores=scores, mask=mask, group_size=2, nonfinite="mask"
    )
    assert torch.isfinite(adv).all()
    assert torch.isfinite(ret).all()
    # reading: the sample with the non-finite score is invalid -> its row is 0
    assert bool((adv[1] == 0).all())
    assert bool((ret[1] == 0).all())


# --------------------------------------------------------------------------- registry

REGISTERED = [
    "gae",
    "grpo",
    "dr_grpo",
    "lite_ppo",
    "rloo",
    "gpg",
    "opo",
    "pass_at_k",
    "remax",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rebn",
    "group_relative_per_turn",
]
SAME_NAME = [n for n in REGISTERED if n not in {"grpo", "dr_grpo", "lite_ppo"}]


@pytest.mark.parametrize("name", REGISTERED)
def test_every_estimator_is_registered(name: str) -> None:
    assert callable(ra.get_estimator(name))


@pytest.mark.parametrize("name", SAME_NAME)
def test_get_estimator_returns_the_function(name: str) -> None:
    assert ra.get_estimator(name) is getattr(ra, name)


@pytest.mark.parametrize(
    ("name", "scale"), [("grpo", "group"), ("dr_grpo", "none"), ("lite_ppo", "batch")]
)
def test_group_relative_aliases(name: str, scale: str) -> None:
    # the three group-relative estimators are group_relative with their scale
    r = t([1.0, 0.0, 0.5, 3.0, 2.0, 2.5])
    got = ra.get_estimator(name)(r, 3)
    # bit-exact: the alias runs group_relative itself on the same inputs
    assert torch.equal(got, ra.group_relative(r, 3, scale=scale))


def test_unknown_estimator_lists_known_names() -> None:
    with pytest.raises(KeyError) as info:
        ra.get_estimator("no_such_estimator")
    message = str(info.value)
    assert "gae" in message
    assert "rloo" in message


def test_register_new_estimator_and_duplicate() -> None:
    name = f"test_estimator_{uuid.uuid4().hex}"

    def my_estimator(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return rewards

    decorated = ra.register_estimator(name)(my_estimator)
    assert decorated is my_estimator
    assert ra.get_estimator(name) is my_estimator
    with pytest.raises(ValueError):  # noqa: PT011 (the spec fixes no message here)
        ra.register_estimator(name)(lambda rewards, group_size: rewards)
    assert ra.get_estimator(name) is my_estimator


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo"])
def test_registering_a_builtin_name_again_raises(name: str) -> None:
    before = ra.get_estimator(name)
    with pytest.raises(ValueError):  # noqa: PT011 (the spec fixes no message here)
        ra.register_estimator(name)(lambda *args, **kwargs: None)
    assert ra.get_estimator(name) is before
