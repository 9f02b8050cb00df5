"""Argument validation not covered by test_errors.py: every bad value names its argument."""

import pytest
import rl_advantages as ra
import torch

NAN = float("nan")


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
