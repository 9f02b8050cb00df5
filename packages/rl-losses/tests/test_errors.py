"""Bad input -> ValueError naming the argument (both shapes for shape mismatches); non-finite
log-probs at valid positions; the policy-loss registry."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import rl_losses as rl
import torch

F64 = torch.float64
NAN = float("nan")
INF = float("inf")


def ones(*shape: int) -> torch.Tensor:
    return torch.ones(shape, dtype=F64)


def lps(*shape: int) -> torch.Tensor:
    return torch.full(shape, -0.5, dtype=F64)


def bmask(*shape: int) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.bool)


def _shape_pattern(*dims: int) -> str:
    # accepts "(3, 4)", "[3, 4]", "torch.Size([3, 4])", "(3,4)"
    return r"\D" + r",\s*".join(str(d) for d in dims) + r"\D"


def _names(message: str, names: str) -> bool:
    return any(
        re.search(rf"(?<![A-Za-z0-9_]){n}(?![A-Za-z0-9_])", message) for n in names.split("|")
    )


def raises_naming(call: Callable[[], Any], names: str) -> str:
    with pytest.raises(ValueError) as info:  # noqa: PT011 (message checked below)
        call()
    message = str(info.value)
    assert _names(message, names), f"{message!r} does not name {names}"
    return message


POLICY = [
    "clipped_surrogate",
    "reinforce_loss",
    "gspo_loss",
    "cispo_loss",
    "sapo_loss",
    "gmpo_loss",
    "clip_cov_loss",
    "kl_cov_loss",
]
LEVELED = ["clipped_surrogate", "reinforce_loss", "cispo_loss", "sapo_loss"]


def policy(name: str, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "logprobs": lps(3, 4),
        "old_logprobs": lps(3, 4),
        "advantages": ones(3),
        "mask": bmask(3, 4),
    }
    args |= kw
    return getattr(rl, name)(**args)


# --------------------------------------------------------------------------- shapes

# (call, names one of which the message must name); shapes [3, 4] vs [3, 5]
SHAPE_MISMATCHES: dict[str, tuple[Callable[[], Any], str]] = {
    **{
        f"{name}_old": (
            (lambda name=name: policy(name, old_logprobs=lps(3, 5))),
            "old_logprobs|logprobs",
        )
        for name in POLICY
    },
    **{
        f"{name}_mask": ((lambda name=name: policy(name, mask=bmask(3, 5))), "mask|logprobs")
        for name in POLICY
    },
    **{
        f"{name}_adv": (
            (lambda name=name: policy(name, advantages=ones(3, 5))),
            "advantages|logprobs",
        )
        for name in POLICY
    },
    "is_weights": (
        lambda: policy("clipped_surrogate", is_weights=ones(3, 5)),
        "is_weights|logprobs",
    ),
    "turn_ids": (
        lambda: policy(
            "clipped_surrogate", level="turn", turn_ids=torch.zeros(3, 5, dtype=torch.int64)
        ),
        "turn_ids|logprobs|mask",
    ),
    "aggregate": (lambda: rl.aggregate(ones(3, 4), bmask(3, 5)), "loss|mask"),
    "to_units": (lambda: rl.to_units(ones(3, 4), bmask(3, 5), "token"), "x|mask"),
    "value_returns": (
        lambda: rl.value_loss(ones(3, 4), ones(3, 4), ones(3, 5), bmask(3, 4)),
        "returns|values",
    ),
    "value_old": (
        lambda: rl.value_loss(ones(3, 4), ones(3, 5), ones(3, 4), bmask(3, 4)),
        "old_values|values",
    ),
    "value_mask": (
        lambda: rl.value_loss(ones(3, 4), ones(3, 4), ones(3, 4), bmask(3, 5)),
        "mask|values",
    ),
    "kl_estimate": (lambda: rl.kl_estimate(lps(3, 4), lps(3, 5)), "ref_logprobs|logprobs"),
    "kl_penalty_ref": (
        lambda: rl.kl_penalty(lps(3, 4), lps(3, 5), bmask(3, 4)),
        "ref_logprobs|logprobs",
    ),
    "kl_penalty_mask": (
        lambda: rl.kl_penalty(lps(3, 4), lps(3, 4), bmask(3, 5)),
        "mask|logprobs",
    ),
    "entropy_bonus": (lambda: rl.entropy_bonus(ones(3, 4), bmask(3, 5)), "mask|entropies"),
    "high_entropy_mask": (
        lambda: rl.high_entropy_mask(ones(3, 4), bmask(3, 5)),
        "mask|entropies",
    ),
    "rollout_sampling": (
        lambda: rl.rollout_correction(lps(3, 4), lps(3, 5), bmask(3, 4)),
        "sampling_logprobs|old_logprobs",
    ),
    "rollout_mask": (
        lambda: rl.rollout_correction(lps(3, 4), lps(3, 4), bmask(3, 5)),
        "mask|old_logprobs",
    ),
    "rollout_weights": (
        lambda: rl.rollout_weights(lps(3, 4), lps(3, 5), bmask(3, 4)),
        "sampling_logprobs|old_logprobs",
    ),
}


@pytest.mark.parametrize("case", sorted(SHAPE_MISMATCHES))
def test_shape_mismatch_names_both_shapes(case: str) -> None:
    call, names = SHAPE_MISMATCHES[case]
    message = raises_naming(call, names)
    assert re.search(_shape_pattern(3, 4), message), message
    assert re.search(_shape_pattern(3, 5), message), message


@pytest.mark.parametrize("name", POLICY)
def test_per_sequence_advantages_of_wrong_length(name: str) -> None:
    raises_naming(lambda: policy(name, advantages=ones(4)), "advantages")


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("name", LEVELED)
def test_turn_level_needs_turn_ids(name: str) -> None:
    raises_naming(lambda: policy(name, level="turn"), "turn_ids")


def test_to_units_turn_level_needs_turn_ids() -> None:
    raises_naming(lambda: rl.to_units(ones(3, 4), bmask(3, 4), "turn"), "turn_ids")


@pytest.mark.parametrize("name", LEVELED)
@pytest.mark.parametrize("all_minus_one", [False, True], ids=["one_token", "every_token"])
def test_turn_id_minus_one_at_a_valid_token(name: str, all_minus_one: bool) -> None:
    """A valid token outside every turn would be dropped from the loss without a word."""
    turn_ids = torch.full((3, 4), -1) if all_minus_one else torch.zeros(3, 4, dtype=torch.int64)
    turn_ids[1, 2] = -1
    message = raises_naming(lambda: policy(name, level="turn", turn_ids=turn_ids), "turn_ids")
    assert "mask" in message
    raises_naming(lambda: rl.to_units(ones(3, 4), bmask(3, 4), "turn", turn_ids), "turn_ids")


def test_turn_id_minus_one_at_a_masked_token_is_fine() -> None:
    turn_ids = torch.zeros(3, 4, dtype=torch.int64)
    turn_ids[1, 2] = -1
    mask = bmask(3, 4)
    mask[1, 2] = False
    out = policy("clipped_surrogate", level="turn", turn_ids=turn_ids, mask=mask)
    assert bool(torch.isfinite(out.loss))


@pytest.mark.parametrize("bounds", [(1.2, 0.8), (1.0, 1.0), (0.9, 0.9)])
def test_ratio_bounds_low_not_below_high(bounds: tuple[float, float]) -> None:
    raises_naming(lambda: policy("clipped_surrogate", ratio_bounds=bounds), "ratio_bounds")


@pytest.mark.parametrize("bounds", [(-1.0, 2.0), (1.1, 1.5), (0.5, 0.9), (NAN, 2.0), (0.8, NAN)])
def test_ratio_bounds_must_hold_ratio_one_and_be_non_negative(
    bounds: tuple[float, float],
) -> None:
    raises_naming(lambda: policy("clipped_surrogate", ratio_bounds=bounds), "ratio_bounds")


@pytest.mark.parametrize("bounds", [(0.0, INF), (0.8, 1.0), (1.0, 1.2), (0.5, 2.0)])
def test_ratio_bounds_around_one_are_accepted(bounds: tuple[float, float]) -> None:
    # (0, inf) is the registered `importance_sampling` (Tinker); lo = 1 or hi = 1 is Tinker's
    # `0 < clip_low_threshold <= 1 <= clip_high_threshold`
    assert bool(torch.isfinite(policy("clipped_surrogate", ratio_bounds=bounds).loss))


@pytest.mark.parametrize("clip_low", [-0.1, 1.0, 1.5])
def test_clip_low_outside_unit_interval(clip_low: float) -> None:
    raises_naming(lambda: policy("clipped_surrogate", clip_low=clip_low), "clip_low")


def test_clip_high_negative() -> None:
    raises_naming(lambda: policy("clipped_surrogate", clip_high=-0.1), "clip_high")


@pytest.mark.parametrize("dual_clip", [1.0, 0.5, -2.0])
def test_dual_clip_not_above_one(dual_clip: float) -> None:
    raises_naming(lambda: policy("clipped_surrogate", dual_clip=dual_clip), "dual_clip")


@pytest.mark.parametrize(("kw", "delta"), [({}, 1.2), ({}, 1.1), ({"clip_high": 0.5}, 1.4)])
def test_delta_not_above_high(kw: dict[str, float], delta: float) -> None:
    # hi = 1 + clip_high (clip_high defaults to clip_low = 0.2)
    raises_naming(lambda: policy("clipped_surrogate", delta=delta, **kw), "delta")


def test_delta_above_high_is_accepted() -> None:
    policy("clipped_surrogate", delta=1.25)


@pytest.mark.parametrize("name", POLICY)
def test_unknown_aggregation(name: str) -> None:
    raises_naming(lambda: policy(name, aggregation="token_sum"), "aggregation")


def test_aggregate_unknown_mode() -> None:
    raises_naming(lambda: rl.aggregate(ones(2, 3), bmask(2, 3), "sequence_mean"), "mode")


@pytest.mark.parametrize(
    "call",
    [
        lambda: rl.value_loss(ones(2, 3), ones(2, 3), ones(2, 3), bmask(2, 3), aggregation="x"),
        lambda: rl.kl_penalty(lps(2, 3), lps(2, 3), bmask(2, 3), aggregation="x"),
        lambda: rl.entropy_bonus(ones(2, 3), bmask(2, 3), aggregation="x"),
    ],
    ids=["value_loss", "kl_penalty", "entropy_bonus"],
)
def test_unknown_aggregation_elsewhere(call: Callable[[], Any]) -> None:
    raises_naming(call, "aggregation")


@pytest.mark.parametrize("name", LEVELED)
def test_unknown_level(name: str) -> None:
    raises_naming(lambda: policy(name, level="sentence"), "level")


@pytest.mark.parametrize("name", LEVELED)
def test_unknown_pooling(name: str) -> None:
    raises_naming(lambda: policy(name, pooling="max", level="trajectory"), "pooling")


def test_to_units_unknown_level_and_pooling() -> None:
    raises_naming(lambda: rl.to_units(ones(2, 3), bmask(2, 3), "sentence"), "level")
    raises_naming(
        lambda: rl.to_units(ones(2, 3), bmask(2, 3), "trajectory", pooling="max"), "pooling"
    )


def test_unknown_specific_options() -> None:
    raises_naming(lambda: policy("reinforce_loss", form="advantage"), "form")
    raises_naming(lambda: policy("cispo_loss", clamp="lower"), "clamp")
    raises_naming(lambda: policy("gspo_loss", gradient="turn"), "gradient")


def test_unknown_kl_kind() -> None:
    raises_naming(lambda: rl.kl_estimate(lps(2, 3), lps(2, 3), "k4"), "kind")
    raises_naming(lambda: rl.kl_penalty(lps(2, 3), lps(2, 3), bmask(2, 3), kind="k4"), "kind")
    raises_naming(lambda: rl.kl_estimate(lps(2, 3), lps(2, 3), "k3", grad_kind="k5"), "grad_kind")


def test_rollout_unknown_level_and_mode() -> None:
    raises_naming(
        lambda: rl.rollout_correction(lps(2, 3), lps(2, 3), bmask(2, 3), level="turn"), "level"
    )
    raises_naming(
        lambda: rl.rollout_correction(lps(2, 3), lps(2, 3), bmask(2, 3), mode="clip"), "mode"
    )


@pytest.mark.parametrize("top_quantile", [0.0, -0.1, 1.5])
def test_top_quantile_outside_unit_interval(top_quantile: float) -> None:
    raises_naming(
        lambda: rl.high_entropy_mask(ones(2, 3), bmask(2, 3), top_quantile), "top_quantile"
    )


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_cap_not_positive(cap: float) -> None:
    raises_naming(lambda: rl.rollout_correction(lps(2, 3), lps(2, 3), bmask(2, 3), cap=cap), "cap")


@pytest.mark.parametrize("lower", [2.0, 3.0])
def test_lower_not_below_cap(lower: float) -> None:
    raises_naming(
        lambda: rl.rollout_correction(
            lps(2, 3), lps(2, 3), bmask(2, 3), mode="mask", cap=2.0, lower=lower
        ),
        "lower|cap",
    )


@pytest.mark.parametrize("normalizer", [0.0, -2.0, INF, NAN])
@pytest.mark.parametrize("as_tensor", [False, True], ids=["float", "tensor"])
def test_normalizer_not_positive(normalizer: float, as_tensor: bool) -> None:
    # spec: "normalizer (float or 0-dim tensor, > 0)"; a tensor is checked as a float is
    value = torch.tensor(normalizer, dtype=F64) if as_tensor else normalizer
    raises_naming(lambda: rl.aggregate(ones(2, 3), bmask(2, 3), normalizer=value), "normalizer")
    raises_naming(lambda: policy("clipped_surrogate", normalizer=value), "normalizer")


def test_tensor_normalizer_is_accepted() -> None:
    got = rl.aggregate(ones(2, 3), bmask(2, 3), normalizer=torch.tensor(4.0))
    assert float(got) == 6 / 4


@pytest.mark.parametrize("max_length", [0, -1, 2.5, True])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum_norm"])
def test_max_length_not_a_positive_int(max_length: Any, mode: str) -> None:
    raises_naming(
        lambda: rl.aggregate(ones(2, 3), bmask(2, 3), mode, max_length=max_length), "max_length"
    )


# --------------------------------------------------------------------------- dtypes and masks

INT_INPUTS: dict[str, tuple[Callable[[torch.Tensor], Any], str]] = {
    **{
        f"{name}_{arg}": (
            (lambda x, name=name, arg=arg: policy(name, **{arg: x})),
            arg,
        )
        for name in POLICY
        for arg in ("logprobs", "old_logprobs")
    },
    "clipped_surrogate_advantages": (
        lambda x: policy("clipped_surrogate", advantages=x),
        "advantages",
    ),
    "kl_estimate": (lambda x: rl.kl_estimate(lps(3, 4), x), "ref_logprobs"),
    "kl_penalty_logprobs": (lambda x: rl.kl_penalty(x, lps(3, 4), bmask(3, 4)), "logprobs"),
    "kl_penalty_ref": (lambda x: rl.kl_penalty(lps(3, 4), x, bmask(3, 4)), "ref_logprobs"),
    "value_loss_values": (
        lambda x: rl.value_loss(x, ones(3, 4), ones(3, 4), bmask(3, 4)),
        "values",
    ),
    "value_loss_returns": (
        lambda x: rl.value_loss(ones(3, 4), ones(3, 4), x, bmask(3, 4)),
        "returns",
    ),
    "entropy_bonus": (lambda x: rl.entropy_bonus(x, bmask(3, 4), coef=0.1), "entropies"),
    "aggregate": (lambda x: rl.aggregate(x, bmask(3, 4)), "loss"),
    "rollout_correction": (
        lambda x: rl.rollout_correction(lps(3, 4), x, bmask(3, 4)),
        "sampling_logprobs",
    ),
    "off_policy_mask": (
        lambda x: rl.off_policy_mask(x, lps(3, 4), ones(3), bmask(3, 4)),
        "logprobs",
    ),
    "awac_loss": (lambda x: rl.awac_loss(lps(3, 4), x, bmask(3, 4)), "advantages"),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
@pytest.mark.parametrize("case", sorted(INT_INPUTS))
def test_integer_or_bool_inputs_are_refused(case: str, dtype: torch.dtype) -> None:
    """Refused at entry, naming the argument: an int64 log-prob tensor would otherwise give a
    loss of 0, and an int tensor elsewhere a TypeError from torch.finfo naming nothing."""
    call, arg = INT_INPUTS[case]
    shape = (3,) if case == "clipped_surrogate_advantages" else (3, 4)
    message = raises_naming(lambda: call(torch.zeros(shape, dtype=dtype)), arg)
    assert "floating-point" in message
    assert ".float()" in message


FRACTIONAL_MASKS: dict[str, tuple[Callable[[torch.Tensor], Any], str | None]] = {
    **{name: ((lambda m, name=name: policy(name, mask=m)), "is_weights") for name in POLICY},
    "kl_penalty": (lambda m: rl.kl_penalty(lps(3, 4), lps(3, 4), m), "is_weights"),
    "aggregate": (lambda m: rl.aggregate(ones(3, 4), m), None),
    "entropy_bonus": (lambda m: rl.entropy_bonus(ones(3, 4), m), None),
    "value_loss": (lambda m: rl.value_loss(ones(3, 4), ones(3, 4), ones(3, 4), m), None),
    "rollout_correction": (lambda m: rl.rollout_correction(lps(3, 4), lps(3, 4), m), None),
}


@pytest.mark.parametrize("value", [0.5, 2.0, -1.0, NAN])
@pytest.mark.parametrize("case", sorted(FRACTIONAL_MASKS))
def test_mask_other_than_zero_one_is_refused(case: str, value: float) -> None:
    """A weight passed as the mask would otherwise count as a whole token (mask != 0)."""
    call, weights = FRACTIONAL_MASKS[case]
    mask = torch.ones(3, 4, dtype=F64)
    mask[1, 1] = value
    message = raises_naming(lambda: call(mask), "mask")
    if weights is not None:
        assert f"`{weights}`" in message, message
    if value == 2.0:
        raises_naming(lambda: call(mask.long()), "mask")


@pytest.mark.parametrize("name", POLICY)
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.int64, torch.uint8])
def test_zero_one_masks_of_any_dtype_equal_the_bool_mask(name: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(3, 4, generator=g) < 0.6
    lp = lps(3, 4) + 0.1 * torch.randn(3, 4, generator=g, dtype=F64)
    expected = policy(name, logprobs=lp, mask=mask).loss
    got = policy(name, logprobs=lp, mask=mask.to(dtype)).loss
    assert torch.equal(got, expected)  # bit-exact: the same bool mask after the 0/1 check


# --------------------------------------------------------------------------- non-finite inputs


@pytest.mark.parametrize("name", POLICY)
@pytest.mark.parametrize("arg", ["logprobs", "old_logprobs"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_non_finite_log_probs_at_valid_positions(name: str, arg: str, value: float) -> None:
    bad = lps(3, 4)
    bad[1, 2] = value
    mask = bmask(3, 4)
    mask[0, 0] = False
    raises_naming(lambda: policy(name, mask=mask, **{arg: bad}), arg)


@pytest.mark.parametrize("arg", ["logprobs", "ref_logprobs"])
@pytest.mark.parametrize("value", [NAN, INF])
def test_kl_penalty_non_finite(arg: str, value: float) -> None:
    bad = lps(2, 3)
    bad[0, 1] = value
    args = {"logprobs": lps(2, 3), "ref_logprobs": lps(2, 3), "mask": bmask(2, 3)} | {arg: bad}
    raises_naming(lambda: rl.kl_penalty(**args), arg)


def test_rollout_correction_non_finite_old_logprobs() -> None:
    bad = lps(2, 3)
    bad[1, 1] = NAN
    raises_naming(lambda: rl.rollout_correction(bad, lps(2, 3), bmask(2, 3)), "old_logprobs")


@pytest.mark.parametrize("name", POLICY)
def test_non_finite_at_invalid_positions_is_fine(name: str) -> None:
    lp = lps(3, 4)
    old = lps(3, 4)
    mask = bmask(3, 4)
    mask[1, 2] = False
    lp[1, 2] = NAN
    old[1, 2] = -INF
    out = policy(name, logprobs=lp, old_logprobs=old, mask=mask)
    assert bool(torch.isfinite(out.loss))


# --------------------------------------------------------------------------- registry

BUILTIN = {
    "ppo": "clipped_surrogate",
    "reinforce": "reinforce_loss",
    "gspo": "gspo_loss",
    "cispo": "cispo_loss",
    "sapo": "sapo_loss",
    "gmpo": "gmpo_loss",
    "clip_cov": "clip_cov_loss",
    "kl_cov": "kl_cov_loss",
}


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_get_policy_loss_returns_the_function(name: str) -> None:
    assert rl.get_policy_loss(name) is getattr(rl, BUILTIN[name])
    assert name in rl.available_policy_losses()


def test_unknown_policy_loss_lists_known_names() -> None:
    with pytest.raises(KeyError) as info:
        rl.get_policy_loss("no_such_loss")
    message = str(info.value)
    assert "ppo" in message
    assert "cispo" in message


def test_unpublished_peer_loss_is_refused_by_name_with_the_reason() -> None:
    """Tinker's ``stable_reinforce``: documented without a formula, so not registered; the
    error says why and how to register one (the name stays free for that)."""
    assert "stable_reinforce" not in rl.available_policy_losses()
    with pytest.raises(KeyError) as info:
        rl.get_policy_loss("stable_reinforce")
    message = str(info.value)
    assert "'stable_reinforce' is not available" in message
    assert "formula is not published" in message
    assert "register_policy_loss('stable_reinforce')" in message


def test_register_new_policy_loss_and_duplicate() -> None:
    name = f"test_loss_{uuid.uuid4().hex}"

    def my_loss(*args: Any, **kwargs: Any) -> Any:
        return None

    decorated = rl.register_policy_loss(name)(my_loss)
    assert decorated is my_loss
    assert rl.get_policy_loss(name) is my_loss
    assert name in rl.available_policy_losses()
    with pytest.raises(ValueError):  # noqa: PT011 (the spec fixes no message here)
        rl.register_policy_loss(name)(lambda *a, **k: None)
    assert rl.get_policy_loss(name) is my_loss


@pytest.mark.parametrize("name", ["ppo", "gspo"])
def test_registering_a_builtin_name_again_raises(name: str) -> None:
    before = rl.get_policy_loss(name)
    with pytest.raises(ValueError):  # noqa: PT011 (the spec fixes no message here)
        rl.register_policy_loss(name)(lambda *a, **k: None)
    assert rl.get_policy_loss(name) is before
