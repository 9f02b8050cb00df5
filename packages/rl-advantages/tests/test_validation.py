"""Argument validation not covered by test_errors.py: every bad value names its argument; the
dtype rule (integer and bool inputs promoted to the default float dtype, mixed float dtypes to
their ``torch.promote_types``) and what a mask may hold."""

import math
from collections.abc import Callable
from typing import Any

import pytest
import rl_advantages as ra
import torch
from rl_testing import tolerance

NAN = float("nan")
F64 = torch.float64


def _ok_rows(n: int = 2, t: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(n, t, dtype=torch.float64), torch.ones(n, t, dtype=torch.bool)


def test_non_tensor_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"`rewards` must be a torch\.Tensor"):
        ra.group_relative([1.0, 0.0], group_size=2)  # type: ignore[arg-type]


def test_group_size_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="`group_size` must be an int"):
        ra.rloo(torch.zeros(4), group_size=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`group_size` must be an int"):
        ra.rloo(torch.zeros(4), group_size=True)


def test_unknown_nonfinite_policy() -> None:
    with pytest.raises(ValueError, match="`nonfinite` must be 'raise' or 'mask'"):
        ra.group_relative(torch.zeros(4), 2, nonfinite="ignore")  # type: ignore[arg-type]


def test_integer_rewards_pass_the_finite_check() -> None:
    adv = ra.rloo(torch.tensor([1, 0, 2, 2]).double(), group_size=2)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64))
    # masks may be given as 0/1 integers too
    r, _ = _ok_rows()
    out = ra.discounted_returns(r + 1, torch.ones(2, 3, dtype=torch.long), gamma=1.0)
    torch.testing.assert_close(out[0], torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize(("name", "value"), [("gamma", 1.5), ("gamma", -0.1), ("lmbda", 2.0)])
def test_discount_parameters_in_unit_interval(name: str, value: float) -> None:
    r, m = _ok_rows()
    kwargs = {"gamma": 0.9, "lmbda": 0.9, name: value}
    with pytest.raises(ValueError, match=f"`{name}` must be in \\[0, 1\\]"):
        ra.gae(r, r, m, **kwargs)


def test_non_finite_bootstrap_values_and_returns() -> None:
    r, m = _ok_rows()
    with pytest.raises(ValueError, match="`bootstrap` holds non-finite"):
        ra.discounted_returns(r, m, 0.9, bootstrap=torch.tensor([0.0, NAN], dtype=torch.float64))
    with pytest.raises(ValueError, match="`values` holds non-finite"):
        ra.gae(r, torch.full_like(r, NAN), m, 0.9, 0.9)
    with pytest.raises(ValueError, match="`returns` holds non-finite"):
        ra.rebn(torch.full_like(r, NAN), m)
    with pytest.raises(ValueError, match="`eps` must be >= 0"):
        ra.rebn(r, m, eps=-1.0)


def test_remax_and_kl_validation() -> None:
    r, m = _ok_rows()
    with pytest.raises(ValueError, match="`baselines` holds non-finite"):
        ra.remax(r, m, torch.tensor([0.0, NAN], dtype=torch.float64))
    with pytest.raises(ValueError, match="`kl` holds non-finite"):
        ra.kl_in_reward(torch.zeros(2), m, kl=torch.full((2, 3), NAN), beta=0.1)
    with pytest.raises(ValueError, match="`beta` must be >= 0"):
        ra.kl_in_reward(torch.zeros(2), m, beta=-0.1)


def test_gpg_and_opo_arguments() -> None:
    with pytest.raises(ValueError, match="`f_norm` must be > 0"):
        ra.gpg(torch.tensor([1.0, 0.0]), 2, f_norm=0.0)
    with pytest.raises(ValueError, match="`alpha` must be"):
        ra.gpg(torch.tensor([1.0, 0.0]), 2, alpha="paper")  # type: ignore[arg-type]
    # a constant alpha scales the centred rewards: (1, 0) -> (0.5, -0.5) * 3
    torch.testing.assert_close(
        ra.gpg(torch.tensor([1.0, 0.0]), 2, alpha=3.0), torch.tensor([1.5, -1.5])
    )


def test_overlong_penalty_arguments() -> None:
    lengths = torch.tensor([5, 9])
    with pytest.raises(ValueError, match="`buffer_length` must be in"):
        ra.overlong_penalty(lengths, max_length=10, buffer_length=0)
    with pytest.raises(ValueError, match="`buffer_length` must be in"):
        ra.overlong_penalty(lengths, max_length=10, buffer_length=11)
    with pytest.raises(ValueError, match="`penalty_factor` must be >= 0"):
        ra.overlong_penalty(lengths, max_length=10, buffer_length=4, penalty_factor=-1.0)
    # float lengths keep their dtype: 9 is 3 tokens into a 4-token buffer -> -3/4
    out = ra.overlong_penalty(lengths.double(), max_length=10, buffer_length=4)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.tensor([0.0, -0.75], dtype=torch.float64))


def test_turn_id_validation() -> None:
    values = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="`turn_ids` must be an integer tensor"):
        ra.pool_to_turns(values, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="`num_turns` must be >= 0"):
        ra.pool_to_turns(values, torch.zeros(1, 3, dtype=torch.long), num_turns=-1)
    with pytest.raises(ValueError, match="`reduction` must be"):
        ra.pool_to_turns(values, torch.zeros(1, 3, dtype=torch.long), reduction="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`placement` must be"):
        ra.broadcast_to_tokens(torch.zeros(1, 1), torch.zeros(1, 3, dtype=torch.long), "first")  # type: ignore[arg-type]
    # no turn played anywhere: K = 0 turns, and broadcasting 0 turns gives zeros
    none = torch.full((2, 3), -1)
    assert ra.turn_mask_from_ids(none).shape == (2, 0)
    torch.testing.assert_close(ra.broadcast_to_tokens(torch.zeros(2, 0), none), torch.zeros(2, 3))


def test_registry_names() -> None:
    with pytest.raises(ValueError, match="`name` must be a non-empty string"):
        ra.register_estimator("")
    names = ra.available_estimators()
    assert names == sorted(names)
    assert {"gae", "grpo", "dr_grpo", "rebn", "rloo"} <= set(names)


def test_non_finite_fallback_is_refused() -> None:
    r = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [1.0, 1.0]], dtype=F64)
    played = torch.tensor([[True, True], [True, False], [True, True], [True, True]])
    for bad in (NAN, float("inf")):
        fallback = torch.tensor([0.5, bad, 0.0, 0.0], dtype=F64)
        with pytest.raises(ValueError, match="`fallback` holds non-finite"):
            ra.group_relative_per_turn(r, played, 2, fallback=fallback)


# --------------------------------------------------------------------------- dtypes


def _default(x: list[Any]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.get_default_dtype())


def test_integer_rewards_are_not_truncated() -> None:
    """0/1 integer rewards compute in the default float dtype, not in int64."""
    dt = torch.get_default_dtype()
    m = torch.ones(2, 3, dtype=torch.bool)
    r = torch.tensor([[0, 0, 1], [0, 1, 0]])
    # gamma .9: row 0 [.9^2, .9, 1]; row 1 [.9, 1, 0]
    want = torch.tensor([[0.81, 0.9, 1.0], [0.9, 1.0, 0.0]], dtype=F64)
    got = ra.discounted_returns(r, m, 0.9)
    assert got.dtype == dt
    tolerance.assert_close(got, want, reduction=3, stages=1)
    adv, ret = ra.reinforce_plus_plus(r, m, 0.9)
    assert adv.dtype == ret.dtype == dt
    tolerance.assert_close(ret, want, reduction=3)
    # gamma = lambda = 1, V = .5 everywhere: returns [1, 1, 1], advantages 1 - .5
    adv, ret = ra.gae(r[:1], torch.full((1, 3), 0.5), m[:1], 1.0, 1.0)
    tolerance.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5]], dtype=F64), reduction=3)
    tolerance.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]], dtype=F64), reduction=3)
    # a float baseline against integer rewards: 1 - .5, not 1 - int(.5)
    adv, ret = ra.remax(r[:1], m[:1], torch.tensor([0.5]))
    tolerance.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5]], dtype=F64), reduction=3)
    # integer scores with a float KL: -.5 * .3 = -.15 per token, + 1 on row 0's last token
    out = ra.kl_in_reward(torch.tensor([1, 0]), m, kl=torch.full((2, 3), 0.3), beta=0.5)
    want = torch.tensor([[-0.15, -0.15, 0.85], [-0.15, -0.15, -0.15]], dtype=F64)
    tolerance.assert_close(out, want, reduction=2)
    # integer returns for ReBN: [1, 2, 3, 4], mean 2.5, unbiased std sqrt(5/3)
    z = 1.5 / (math.sqrt(5 / 3) + 1e-8)
    got = ra.rebn(torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 2, dtype=torch.bool))
    tolerance.assert_close(
        got, torch.tensor([[-z, -z / 3], [z / 3, z]], dtype=F64), reduction=4, stages=2
    )


def test_integer_weights_and_rewards_in_gdpo() -> None:
    """Float weights against integer rewards are not truncated to 0."""
    r = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0]])
    # each column of each pair is [1, 0] or [0, 1]: +-.5 / (std sqrt(1/2) + 1e-6)
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    got = ra.gdpo(r, 2, weights=[0.5, 0.25])
    want = torch.tensor([0.25 * z, -0.25 * z, 0.75 * z, -0.75 * z], dtype=F64)
    assert got.dtype == torch.get_default_dtype()
    tolerance.assert_close(got, want, reduction=2, stages=2)


def test_bool_rewards_are_promoted() -> None:
    # [1, 0, 0, 1]: mean .5, unbiased std sqrt(1/3)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    got = ra.group_relative(torch.tensor([True, False, False, True]), 4)
    tolerance.assert_close(got, torch.tensor([a, -a, -a, a], dtype=F64), reduction=4, stages=2)


_G = 4
_INT_REWARDS = [1, 0, 0, 1, 1, 1, 1, 0, 2, 0, 3, 1]
_TOKEN_MASK = torch.tensor([[True, True, False]] * 12)
_PER_TOKEN = [[0, 1, 2]] * 12
# every public function that takes rewards, scores or values, on integer input
_INT_CALLS: dict[str, Callable[[Callable[[Any], torch.Tensor]], Any]] = {
    "group_relative": lambda f: ra.group_relative(f(_INT_REWARDS), _G),
    "group_relative_batch": lambda f: ra.group_relative(f(_INT_REWARDS), _G, scale="batch"),
    "rloo": lambda f: ra.rloo(f(_INT_REWARDS), _G),
    "gpg": lambda f: ra.gpg(f(_INT_REWARDS), _G),
    "max_rl": lambda f: ra.max_rl(f(_INT_REWARDS), _G),
    "opo": lambda f: ra.opo(f(_INT_REWARDS), torch.arange(1, 13), _G),
    "pass_at_k": lambda f: ra.pass_at_k(f(_INT_REWARDS), _G),
    "dynamic_sampling_mask": lambda f: ra.dynamic_sampling_mask(f(_INT_REWARDS), _G),
    "gdpo": lambda f: ra.gdpo(f([_INT_REWARDS, _INT_REWARDS[::-1]]).T, _G, weights=[0.5, 0.3]),
    "group_relative_per_turn": lambda f: ra.group_relative_per_turn(
        f(_PER_TOKEN), _TOKEN_MASK, _G, fallback=f(_INT_REWARDS)
    ),
    "discounted_returns": lambda f: ra.discounted_returns(f(_PER_TOKEN), _TOKEN_MASK, 0.9),
    "gae": lambda f: ra.gae(f(_PER_TOKEN), f(_PER_TOKEN[::-1]), _TOKEN_MASK, 0.9, 0.8),
    "rebn": lambda f: ra.rebn(f(_PER_TOKEN), _TOKEN_MASK),
    "remax": lambda f: ra.remax(f(_PER_TOKEN), _TOKEN_MASK, f(_INT_REWARDS)),
    "reinforce_plus_plus": lambda f: ra.reinforce_plus_plus(f(_PER_TOKEN), _TOKEN_MASK, 0.9),
    "kl_in_reward": lambda f: ra.kl_in_reward(f(_INT_REWARDS), _TOKEN_MASK, f(_PER_TOKEN), 0.1),
    "reinforce_plus_plus_baseline": lambda f: ra.reinforce_plus_plus_baseline(
        f(_INT_REWARDS), _TOKEN_MASK, _G, f(_PER_TOKEN), 0.1, 0.9
    ),
    "optimal_token_baseline": lambda f: ra.optimal_token_baseline(
        f(_PER_TOKEN), _TOKEN_MASK, -f(_PER_TOKEN), f(_PER_TOKEN), _G
    ),
    "masked_sum": lambda f: ra.masked_sum(f(_PER_TOKEN), _TOKEN_MASK, dim=1),
    "masked_mean": lambda f: ra.masked_mean(f(_PER_TOKEN), _TOKEN_MASK, dim=1),
    "masked_var": lambda f: ra.masked_var(f(_PER_TOKEN), _TOKEN_MASK, dim=1),
    "whiten": lambda f: ra.whiten(f(_PER_TOKEN), _TOKEN_MASK),
    "pool_to_turns": lambda f: ra.pool_to_turns(
        f(_PER_TOKEN), torch.tensor([[0, 0, -1]] * 12), reduction="mean"
    ),
    "broadcast_to_tokens": lambda f: ra.broadcast_to_tokens(
        f([[1]] * 12), torch.tensor([[0, 0, -1]] * 12)
    ),
    "overlong_penalty": lambda f: ra.overlong_penalty(f(_INT_REWARDS) + 8, 10, 4),
}


@pytest.mark.parametrize("name", sorted(_INT_CALLS))
def test_integer_input_is_the_default_float_input(name: str) -> None:
    """Integer input gives what the same values in the default float dtype give."""
    got = _INT_CALLS[name](torch.tensor)
    expected = _INT_CALLS[name](_default)
    got_t = tuple(got) if isinstance(got, tuple) else (got,)
    exp_t = tuple(expected) if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got_t, exp_t, strict=True):
        assert g.dtype == e.dtype, (name, g.dtype, e.dtype)
        # bit-exact: the integers are promoted at entry, then the same ops run on the same values
        assert torch.equal(g, e), name


def test_mixed_float_dtypes_compute_in_the_promoted_dtype() -> None:
    """float32 rewards with float64 values (bootstrap, baselines, fallback) compute in float64;
    bfloat16 scores with a float32 KL in float32."""
    m = torch.ones(1, 3, dtype=torch.bool)
    r32 = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.full((1, 3), 0.1, dtype=F64)
    # gamma = lambda = 1: advantage G - V = 1 - .1 at every step, exact to float64
    adv, ret = ra.gae(r32, v, m, 1.0, 1.0)
    assert adv.dtype == ret.dtype == F64
    tolerance.assert_close(adv, torch.full((1, 3), 0.9, dtype=F64), reduction=3)
    # bootstrap .1 after the last step, gamma 1: returns 1.1
    got = ra.discounted_returns(r32, m, 1.0, bootstrap=torch.tensor([0.1], dtype=F64))
    assert got.dtype == F64
    tolerance.assert_close(got, torch.full((1, 3), 1.1, dtype=F64), reduction=3)
    adv, _ = ra.remax(r32, m, torch.tensor([0.1], dtype=F64))
    tolerance.assert_close(adv, torch.full((1, 3), 0.9, dtype=F64), reduction=3)
    # lone players take the float64 fallback .1 exactly
    lone = torch.tensor([[True], [False]])
    fallback = torch.tensor([0.1, 0.2], dtype=F64)
    out = ra.group_relative_per_turn(torch.tensor([[1.0], [0.0]]), lone, 2, fallback=fallback)
    assert out.dtype == F64
    assert out.tolist() == [[0.1], [0.0]]
    # bfloat16 score 1 with a float32 KL of .001, beta .5: 1 - .0005 (1.0 in bfloat16)
    out = ra.kl_in_reward(
        torch.tensor([1.0], dtype=torch.bfloat16), m, torch.full((1, 3), 0.001), 0.5
    )
    assert out.dtype == torch.float32
    want = torch.tensor([[-0.0005, -0.0005, 0.9995]], dtype=F64)
    tolerance.assert_close(out, want, reduction=2, scale=1.0)


# --------------------------------------------------------------------------- masks


def test_zero_one_integer_and_float_masks_equal_bool_masks() -> None:
    r = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], dtype=F64)
    m = torch.tensor([[True, False, True], [True, True, False]])
    for other in (m.long(), m.float(), m.double()):
        # bit-exact: a 0/1 mask becomes the same bool mask before anything runs
        assert torch.equal(ra.discounted_returns(r, other, 0.9), ra.discounted_returns(r, m, 0.9))
        # bit-exact: as above
        assert torch.equal(ra.whiten(r, other), ra.whiten(r, m))
    g = torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=F64)
    gm = torch.tensor([True, True, False, True])
    # bit-exact: as above
    assert torch.equal(ra.group_relative(g, 2, mask=gm.float()), ra.group_relative(g, 2, mask=gm))


_HALF_MASK_CALLS: dict[str, Callable[[torch.Tensor], Any]] = {
    "discounted_returns": lambda m: ra.discounted_returns(torch.ones(2, 3), m, 0.9),
    "gae": lambda m: ra.gae(torch.ones(2, 3), torch.ones(2, 3), m, 0.9, 0.9),
    "whiten": lambda m: ra.whiten(torch.ones(2, 3), m),
    "kl_in_reward": lambda m: ra.kl_in_reward(torch.ones(2), m),
    "reinforce_plus_plus_baseline": lambda m: ra.reinforce_plus_plus_baseline(torch.ones(2), m, 2),
    "group_relative": lambda m: ra.group_relative(torch.ones(6), 3, mask=m.reshape(-1)),
    "gdpo": lambda m: ra.gdpo(torch.ones(6, 2), 3, mask=m.reshape(-1)),
}


@pytest.mark.parametrize("bad", [0.5, -1.0, 2.0, NAN])
@pytest.mark.parametrize("name", sorted(_HALF_MASK_CALLS))
def test_mask_values_other_than_zero_and_one_are_refused(name: str, bad: float) -> None:
    m = torch.ones(2, 3)
    m[1, 1] = bad
    with pytest.raises(ValueError, match=r"`mask` holds .*masks are bool: True where"):
        _HALF_MASK_CALLS[name](m)
