"""Bad input -> ValueError naming the argument (and both shapes for shape mismatches), for
``fused_logprobs`` and ``fused_policy_loss``; masked positions may hold anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import rl_kernels as rk
import torch
from kernels_testlib import F32, gen, names_argument, shape_pattern

M, H, V = 5, 8, 11
N, T = 2, 3


def _lm(m: int = M, h: int = H, v: int = V) -> dict[str, torch.Tensor]:
    g = gen("errors", m, h, v)
    return {
        "hidden": torch.randn(m, h, generator=g),
        "weight": torch.randn(v, h, generator=g),
        "targets": torch.randint(0, v, (m,), generator=g),
    }


def _raises(fn: Callable[[], Any], name: str) -> str:
    with pytest.raises(ValueError, match=re.escape(name)) as info:
        fn()
    message = str(info.value)
    assert names_argument(message, name), f"message does not name `{name}`: {message!r}"
    return message


# --------------------------------------------------------------------------- fused_logprobs


def test_logprobs_valid_call() -> None:
    x = _lm()
    assert rk.fused_logprobs(**x).shape == (M,)


def test_logprobs_hidden_not_2d() -> None:
    x = _lm()
    x["hidden"] = x["hidden"].reshape(1, M, H)
    _raises(lambda: rk.fused_logprobs(**x), "hidden")


def test_logprobs_weight_not_2d() -> None:
    x = _lm()
    x["weight"] = x["weight"].reshape(-1)
    _raises(lambda: rk.fused_logprobs(**x), "weight")


def test_logprobs_hidden_size_mismatch() -> None:
    x = _lm()
    x["weight"] = torch.randn(V, H + 1)
    with pytest.raises(ValueError, match=r"hidden|weight") as info:
        rk.fused_logprobs(**x)
    message = str(info.value)
    assert names_argument(message, "hidden") or names_argument(message, "weight"), message
    assert re.search(shape_pattern(M, H), message), message
    assert re.search(shape_pattern(V, H + 1), message), message


@pytest.mark.parametrize("shape", [(M - 1,), (M, 1), ()], ids=["short", "2d", "scalar"])
def test_logprobs_targets_shape(shape: tuple[int, ...]) -> None:
    x = _lm()
    x["targets"] = torch.zeros(shape, dtype=torch.int64)
    _raises(lambda: rk.fused_logprobs(**x), "targets")


@pytest.mark.parametrize("bad", [-1, V, V + 7, -100])
def test_logprobs_targets_out_of_range(bad: int) -> None:
    x = _lm()
    x["targets"] = x["targets"].clone()
    x["targets"][2] = bad
    _raises(lambda: rk.fused_logprobs(**x), "targets")


@pytest.mark.parametrize("shape", [(V + 1,), (V - 1,), (V, 1), (1, V)])
def test_logprobs_bias_shape(shape: tuple[int, ...]) -> None:
    x = _lm()
    _raises(lambda: rk.fused_logprobs(**x, bias=torch.zeros(shape)), "bias")


@pytest.mark.parametrize("temperature", [0.0, -0.5, -1.0])
def test_logprobs_temperature(temperature: float) -> None:
    x = _lm()
    _raises(lambda: rk.fused_logprobs(**x, temperature=temperature), "temperature")


@pytest.mark.parametrize("chunk_rows", [0, -1, -64, 4.5, 2.0, True])
def test_logprobs_chunk_rows(chunk_rows: Any) -> None:
    x = _lm()
    _raises(lambda: rk.fused_logprobs(**x, chunk_rows=chunk_rows), "chunk_rows")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("row", [0, M - 1])
def test_logprobs_non_finite_hidden(value: float, row: int) -> None:
    x = _lm()
    x["hidden"] = x["hidden"].clone()
    x["hidden"][row, 3] = value
    _raises(lambda: rk.fused_logprobs(**x), "hidden")
    _raises(lambda: rk.fused_logprobs(**x, chunk_rows=2, with_entropy=True), "hidden")


def test_logprobs_non_finite_hidden_bf16() -> None:
    x = _lm()
    hidden = x["hidden"].bfloat16()
    hidden[1, 0] = float("nan")
    _raises(lambda: rk.fused_logprobs(hidden, x["weight"].bfloat16(), x["targets"]), "hidden")


# --------------------------------------------------------------------------- fused_policy_loss


def _policy(**over: Any) -> dict[str, Any]:
    g = gen("errors-policy")
    args: dict[str, Any] = {
        "hidden": torch.randn(N, T, H, generator=g),
        "weight": torch.randn(V, H, generator=g),
        "targets": torch.randint(0, V, (N, T), generator=g),
        "mask": torch.tensor([[True, True, False], [True, False, False]]),
        "advantages": torch.tensor([1.0, -0.5]),
    }
    args.update(over)
    return args


def test_policy_valid_call() -> None:
    out = rk.fused_policy_loss(**_policy())
    assert out.loss.dtype == F32
    assert torch.isfinite(out.loss)


def test_policy_hidden_not_3d() -> None:
    _raises(lambda: rk.fused_policy_loss(**_policy(hidden=torch.randn(N * T, H))), "hidden")


def test_policy_hidden_size_mismatch() -> None:
    with pytest.raises(ValueError, match=r"hidden|weight") as info:
        rk.fused_policy_loss(**_policy(weight=torch.randn(V, H + 2)))
    message = str(info.value)
    assert names_argument(message, "hidden") or names_argument(message, "weight"), message
    assert re.search(shape_pattern(V, H + 2), message), message
    assert re.search(shape_pattern(H), message), message


def test_policy_targets_shape() -> None:
    with pytest.raises(ValueError, match="targets") as info:
        rk.fused_policy_loss(**_policy(targets=torch.zeros(N, T + 1, dtype=torch.int64)))
    message = str(info.value)
    assert names_argument(message, "targets"), message
    assert re.search(shape_pattern(N, T + 1), message), message


def test_policy_mask_shape() -> None:
    with pytest.raises(ValueError, match="mask") as info:
        rk.fused_policy_loss(**_policy(mask=torch.ones(N + 1, T, dtype=torch.bool)))
    message = str(info.value)
    assert names_argument(message, "mask"), message
    assert re.search(shape_pattern(N + 1, T), message), message


@pytest.mark.parametrize("bad", [-1, V, -100])
def test_policy_targets_out_of_range_at_valid_position(bad: int) -> None:
    targets = _policy()["targets"].clone()
    targets[0, 1] = bad  # valid position
    _raises(lambda: rk.fused_policy_loss(**_policy(targets=targets)), "targets")


@pytest.mark.parametrize("bad", [-1, V, -100])
def test_policy_targets_out_of_range_at_masked_position_is_fine(bad: int) -> None:
    targets = _policy()["targets"].clone()
    targets[0, 2] = bad  # masked position
    targets[1, 1:] = bad
    out = rk.fused_policy_loss(**_policy(targets=targets))
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_policy_non_finite_hidden_at_valid_position(value: float) -> None:
    hidden = _policy()["hidden"].clone()
    hidden[1, 0, 4] = value  # valid position
    _raises(lambda: rk.fused_policy_loss(**_policy(hidden=hidden)), "hidden")


def test_policy_non_finite_hidden_at_masked_position_is_fine() -> None:
    hidden = _policy()["hidden"].clone()
    hidden[0, 2] = float("nan")
    hidden[1, 1:, :3] = float("inf")
    out = rk.fused_policy_loss(**_policy(hidden=hidden))
    assert torch.isfinite(out.loss)


def test_policy_bias_shape() -> None:
    _raises(lambda: rk.fused_policy_loss(**_policy(), bias=torch.zeros(V + 1)), "bias")


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_policy_temperature(temperature: float) -> None:
    _raises(lambda: rk.fused_policy_loss(**_policy(), temperature=temperature), "temperature")


@pytest.mark.parametrize("chunk_rows", [0, -2, 4.5, True])
def test_policy_chunk_rows(chunk_rows: Any) -> None:
    _raises(lambda: rk.fused_policy_loss(**_policy(), chunk_rows=chunk_rows), "chunk_rows")


@pytest.mark.parametrize("objective", ["nope", "", "PPO"])
def test_policy_unknown_objective(objective: str) -> None:
    _raises(lambda: rk.fused_policy_loss(**_policy(), objective=objective), "objective")


@pytest.mark.parametrize("objective", ["gspo", "gmpo"])
def test_policy_sequence_level_objective_rejected(objective: str) -> None:
    """Outside the spec's {ppo, cispo, reinforce, sapo}: these rl_losses objectives take no
    ``level`` (sequence-level units), so the spec's naive call cannot express them."""
    _raises(lambda: rk.fused_policy_loss(**_policy(), objective=objective), "objective")


def test_policy_unpublished_objective_refused_by_name() -> None:
    """Tinker's ``stable_reinforce`` has no published formula: refused with rl-losses' reason."""
    message = _raises(
        lambda: rk.fused_policy_loss(**_policy(), objective="stable_reinforce"), "objective"
    )
    assert "'stable_reinforce' is not fused" in message
    assert "formula is not published" in message


def test_policy_sampling_logprobs_without_old_logprobs() -> None:
    sampling = torch.full((N, T), -1.0)
    _raises(lambda: rk.fused_policy_loss(**_policy(), sampling_logprobs=sampling), "old_logprobs")


def test_policy_kl_coef_without_ref_logprobs() -> None:
    """The KL term would be dropped without a word (kl_loss 0), as rl_losses.kl_penalty cannot
    run without a reference either."""
    message = _raises(lambda: rk.fused_policy_loss(**_policy(), kl_coef=10.0), "ref_logprobs")
    assert names_argument(message, "kl_coef"), message
    assert torch.isfinite(rk.fused_policy_loss(**_policy(), kl_coef=0.0).loss)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_policy_non_finite_ref_logprobs_at_valid_position(value: float) -> None:
    ref = torch.full((N, T), -1.0)
    ref[1, 0] = value  # valid position
    for kl_coef in (0.1, 0.0):  # kl_mean is reported with kl_coef = 0 as well
        message = _raises(
            lambda kl_coef=kl_coef: rk.fused_policy_loss(
                **_policy(), ref_logprobs=ref, kl_coef=kl_coef
            ),
            "ref_logprobs",
        )
        assert "non-finite" in message


def test_policy_non_finite_ref_logprobs_at_masked_position_is_fine() -> None:
    ref = torch.full((N, T), -1.0)
    ref[0, 2] = float("nan")
    ref[1, 1:] = float("-inf")
    out = rk.fused_policy_loss(**_policy(), ref_logprobs=ref, kl_coef=0.1)
    assert torch.isfinite(out.loss)
    assert float(out.kl_loss) != 0.0


@pytest.mark.parametrize("value", [0.5, 2.0, -1.0])
def test_policy_mask_other_than_zero_one(value: float) -> None:
    """A weight passed as the mask would otherwise count as a whole token."""
    mask = _policy()["mask"].to(F32)
    mask[0, 1] = value
    message = _raises(lambda: rk.fused_policy_loss(**_policy(mask=mask)), "mask")
    assert names_argument(message, "is_weights"), message


@pytest.mark.parametrize("dtype", [F32, torch.int64, torch.uint8])
def test_policy_zero_one_mask_equals_the_bool_mask(dtype: torch.dtype) -> None:
    expected = rk.fused_policy_loss(**_policy()).loss
    got = rk.fused_policy_loss(**_policy(mask=_policy()["mask"].to(dtype))).loss
    assert torch.equal(got, expected)  # bit-exact: the same bool mask after the 0/1 check


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("correction_mode", "bogus"),
        ("correction_level", "turn"),
        ("correction_cap", 0.0),
        ("correction_lower", 3.0),
    ],
)
def test_policy_correction_options_checked_without_sampling_logprobs(
    option: str, value: Any
) -> None:
    _raises(lambda: rk.fused_policy_loss(**_policy(), **{option: value}), option)


@pytest.mark.parametrize("level", ["trajectory", "turn"])
def test_policy_level_other_than_token(level: str) -> None:
    """The objective's `level` collided with the fused path's own `level="token"`."""
    message = _raises(lambda: rk.fused_policy_loss(**_policy(), level=level), "level")
    assert "token level" in message
    assert "fused_logprobs" in message


def test_policy_level_token_is_accepted() -> None:
    expected = rk.fused_policy_loss(**_policy()).loss
    assert torch.equal(  # bit-exact: level="token" is what the fused path runs anyway
        rk.fused_policy_loss(**_policy(), level="token").loss, expected
    )
    # dppo takes no `level`: an explicit "token" is dropped, not passed on
    assert torch.isfinite(
        rk.fused_policy_loss(**_policy(), objective="dppo_tv", level="token").loss
    )


@pytest.mark.parametrize("arg", ["advantages", "old_logprobs", "ref_logprobs", "sampling_logprobs"])
def test_policy_integer_log_probs_and_advantages(arg: str) -> None:
    shape = (N,) if arg == "advantages" else (N, T)
    over: dict[str, Any] = {
        "old_logprobs": torch.full((N, T), -1.0),
        arg: torch.zeros(shape, dtype=torch.int64),
    }
    message = _raises(lambda: rk.fused_policy_loss(**_policy(**over)), arg)
    assert "floating-point" in message
