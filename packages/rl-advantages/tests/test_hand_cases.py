"""Small cases worked out by hand (arithmetic in the comments).

Every case runs against both the implementation ("impl") and the loop reference ("ref"), which
checks the references themselves as well. Numbers are dyadic where possible so that exact
equality holds; otherwise the expected value is written as the formula.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import ref_advantages as reference
import rl_advantages
import torch
from rl_testing.tolerance import assert_close

F64 = torch.float64
T = True
F = False
# The hand-worked values against two routes (the implementation, the loop reference): at most 12
# inputs per case, at most 4 chained reductions (a group mean, a scan, a batch mean and std).
HAND: dict[str, int] = {"reduction": 12, "stages": 4}


class _Impl:
    def __getattr__(self, name: str) -> Any:
        return getattr(rl_advantages, name)


class _Ref:
    def __getattr__(self, name: str) -> Any:
        return getattr(reference, f"ref_{name}")


API = pytest.mark.parametrize("api", [_Impl(), _Ref()], ids=["impl", "ref"])


def t(data: Any) -> torch.Tensor:
    return torch.tensor(data, dtype=F64)


def b(data: Any) -> torch.Tensor:
    return torch.tensor(data, dtype=torch.bool)


def close(got: torch.Tensor, expected: Any) -> None:
    assert_close(got, t(expected), **HAND)


# --------------------------------------------------------------------------- stats


@API
def test_masked_stats_by_hand(api: Any) -> None:
    x = t([[1.0, 2.0, float("nan")], [4.0, 0.0, 8.0]])
    m = b([[T, T, F], [T, F, T]])
    # valid: 1, 2, 4, 8 -> sum 15, mean 3.75
    close(api.masked_sum(x=x, mask=m), 15.0)
    close(api.masked_mean(x=x, mask=m), 3.75)
    # deviations -2.75, -1.75, 0.25, 4.25 -> squares 7.5625 + 3.0625 + 0.0625 + 18.0625 = 28.75
    close(api.masked_var(x=x, mask=m), 28.75 / 3)
    close(api.masked_var(x=x, mask=m, unbiased=False), 28.75 / 4)
    # per row: row 0 -> sum 3, mean 1.5, var ((.5)^2 * 2) / 1 = .5; row 1 -> 12, 6, (4 + 4) / 1 = 8
    close(api.masked_sum(x=x, mask=m, dim=1), [3.0, 12.0])
    close(api.masked_mean(x=x, mask=m, dim=-1), [1.5, 6.0])
    close(api.masked_var(x=x, mask=m, dim=1), [0.5, 8.0])
    close(api.masked_mean(x=x, mask=m, dim=1, keepdim=True), [[1.5], [6.0]])
    # per column: col 0 -> 1, 4 (mean 2.5, var 4.5); col 1 -> 2 only (var 0: count < 2);
    # col 2 -> 8 only (biased var 0: a single value)
    close(api.masked_mean(x=x, mask=m, dim=0), [2.5, 2.0, 8.0])
    close(api.masked_var(x=x, mask=m, dim=0), [4.5, 0.0, 0.0])
    close(api.masked_var(x=x, mask=m, dim=0, unbiased=False), [2.25, 0.0, 0.0])


@API
def test_masked_mean_of_empty_slice_is_zero(api: Any) -> None:
    x = t([[1.0, float("nan")], [float("inf"), 3.0]])
    m = b([[F, F], [F, T]])
    close(api.masked_mean(x=x, mask=m, dim=1), [0.0, 3.0])
    close(api.masked_sum(x=x, mask=m, dim=0), [0.0, 3.0])
    close(api.masked_var(x=x, mask=m, dim=1, unbiased=False), [0.0, 0.0])


@API
def test_whiten_by_hand(api: Any) -> None:
    x = t([[1.0, 2.0, 3.0], [4.0, 99.0, 0.0]])
    m = b([[T, T, T], [T, F, F]])
    # valid 1, 2, 3, 4: mean 2.5, unbiased var (2.25 + .25 + .25 + 2.25) / 3 = 5/3
    s = math.sqrt(5 / 3 + 1e-8)
    close(api.whiten(x=x, mask=m), [[-1.5 / s, -0.5 / s, 0.5 / s], [1.5 / s, 0.0, 0.0]])
    # biased var 5/4; shift_mean=False adds the mean (2.5) back
    s = math.sqrt(5 / 4 + 1e-8)
    expected = [[-1.5 / s + 2.5, -0.5 / s + 2.5, 0.5 / s + 2.5], [1.5 / s + 2.5, 0.0, 0.0]]
    close(api.whiten(x=x, mask=m, shift_mean=False, unbiased=False), expected)


@API
def test_whiten_with_one_valid_entry_returns_x(api: Any) -> None:
    x = t([[5.0, -3.0], [7.0, 1.0]])
    m = b([[F, T], [F, F]])
    close(api.whiten(x=x, mask=m), [[0.0, -3.0], [0.0, 0.0]])
    close(api.whiten(x=x, mask=m, unbiased=False), [[0.0, -3.0], [0.0, 0.0]])


# --------------------------------------------------------------------------- turns


@API
def test_pool_to_turns_by_hand(api: Any) -> None:
    values = t([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]])
    ids = torch.tensor([[-1, 0, 0, 1, 1], [0, -1, -1, 0, -1]])
    # row 0: turn 0 = tokens 1,2 (values 2, 3); turn 1 = tokens 3,4 (values 4, 5)
    # row 1: turn 0 = tokens 0,3 (values 6, 9); no turn 1
    v, mk = api.pool_to_turns(values=values, turn_ids=ids, reduction="sum")
    close(v, [[5.0, 9.0], [15.0, 0.0]])
    assert mk.tolist() == [[T, T], [T, F]]  # bit-exact: bool masks
    v, _ = api.pool_to_turns(values=values, turn_ids=ids, reduction="mean")
    close(v, [[2.5, 4.5], [7.5, 0.0]])
    # final: value at the largest t of the turn
    v, _ = api.pool_to_turns(values=values, turn_ids=ids, reduction="final")
    close(v, [[3.0, 5.0], [9.0, 0.0]])
    # num_turns=3 adds an all-unplayed column
    v, mk = api.pool_to_turns(values=values, turn_ids=ids, num_turns=3)
    close(v, [[5.0, 9.0, 0.0], [15.0, 0.0, 0.0]])
    assert mk.tolist() == [[T, T, F], [T, F, F]]  # bit-exact: bool masks


@API
def test_broadcast_to_tokens_by_hand(api: Any) -> None:
    tv = t([[10.0, 20.0], [30.0, 40.0]])
    ids = torch.tensor([[-1, 0, 0, 1, 1], [1, -1, 0, 0, -1]])
    close(
        api.broadcast_to_tokens(turn_values=tv, turn_ids=ids, placement="all"),
        [[0.0, 10.0, 10.0, 20.0, 20.0], [40.0, 0.0, 30.0, 30.0, 0.0]],
    )
    # "last": only the last token of each turn
    close(
        api.broadcast_to_tokens(turn_values=tv, turn_ids=ids, placement="last"),
        [[0.0, 0.0, 10.0, 0.0, 20.0], [40.0, 0.0, 0.0, 30.0, 0.0]],
    )


# --------------------------------------------------------------------------- returns


@API
def test_discounted_returns_by_hand(api: Any) -> None:
    r = t([[1.0, 0.0, 2.0]])
    m = b([[T, T, T]])
    # G2 = 2; G1 = 0 + .5 * 2 = 1; G0 = 1 + .5 * 1 = 1.5
    close(api.discounted_returns(rewards=r, mask=m, gamma=0.5), [[1.5, 1.0, 2.0]])
    # bootstrap 4: G2 = 2 + .5 * 4 = 4; G1 = 0 + .5 * 4 = 2; G0 = 1 + .5 * 2 = 2
    close(
        api.discounted_returns(rewards=r, mask=m, gamma=0.5, bootstrap=t([4.0])),
        [[2.0, 2.0, 4.0]],
    )
    # gamma = 1: suffix sums 3, 2, 2; gamma = 0: the rewards themselves
    close(api.discounted_returns(rewards=r, mask=m, gamma=1.0), [[3.0, 2.0, 2.0]])
    close(api.discounted_returns(rewards=r, mask=m, gamma=0.0), [[1.0, 0.0, 2.0]])


@API
def test_discounted_returns_skip_invalid_steps(api: Any) -> None:
    # the hole at step 1 is skipped, not terminal: G2 = 2, G0 = 1 + .5 * G2 = 2
    r = t([[1.0, 100.0, 2.0, 7.0], [3.0, 5.0, 1.0, 1.0]])
    m = b([[T, F, T, F], [F, F, F, F]])
    close(
        api.discounted_returns(rewards=r, mask=m, gamma=0.5, bootstrap=t([0.0, 9.0])),
        [[2.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]],  # a row with no valid step is all 0
    )
    # with bootstrap 8 on row 0: G2 = 2 + .5 * 8 = 6, G0 = 1 + .5 * 6 = 4
    close(
        api.discounted_returns(rewards=r, mask=m, gamma=0.5, bootstrap=t([8.0, 9.0])),
        [[4.0, 0.0, 6.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
    )


@API
def test_discounted_returns_gap_options(api: Any) -> None:
    # row 0: a gap at step 2 between valid steps 1 and 3; row 1: only padding around its valid
    # steps (not a gap), so every option gives the same row; gamma = .5
    r = t([[1.0, 2.0, 100.0, 4.0], [7.0, 1.0, 2.0, 7.0]])
    m = b([[T, T, F, T], [F, T, T, F]])
    row1 = [0.0, 2.0, 2.0, 0.0]  # G2 = 2, G1 = 1 + .5 * 2 = 2

    def returns(gap: str, boot: float = 0.0) -> torch.Tensor:
        return api.discounted_returns(
            rewards=r, mask=m, gamma=0.5, bootstrap=t([boot, 0.0]), gap=gap
        )

    # skip: G3 = 4, G1 = 2 + .5 * 4 = 4, G0 = 1 + .5 * 4 = 3
    close(returns("skip"), [[3.0, 4.0, 0.0, 4.0], row1])
    # reset (AgileRL's token path): steps 0-1 are a terminal episode: G1 = 2, G0 = 1 + 1 = 2
    close(returns("reset"), [[2.0, 2.0, 0.0, 4.0], row1])
    # carry (OpenRLHF): the gap is a step with reward 0: G2 = .5 * 4 = 2, G1 = 2 + 1 = 3,
    # G0 = 1 + 1.5 = 2.5
    close(returns("carry"), [[2.5, 3.0, 0.0, 4.0], row1])
    # bootstrap 8 goes after the last valid step only: G3 = 4 + 4 = 8 in every option
    close(returns("skip", 8.0), [[4.0, 6.0, 0.0, 8.0], row1])  # G1 = 2 + 4, G0 = 1 + 3
    close(returns("reset", 8.0), [[2.0, 2.0, 0.0, 8.0], row1])  # the first episode is unchanged
    close(returns("carry", 8.0), [[3.0, 4.0, 0.0, 8.0], row1])  # G2 = 4, G1 = 4, G0 = 3
    # gamma = 1: a carried gap step adds reward 0 and costs no discount, so carry = skip
    for gap in ("skip", "carry"):
        close(
            api.discounted_returns(rewards=r, mask=m, gamma=1.0, gap=gap),
            [[7.0, 6.0, 0.0, 4.0], [0.0, 3.0, 2.0, 0.0]],
        )


@API
def test_reset_is_each_segment_as_its_own_episode(api: Any) -> None:
    # AgileRL 2.58's token GAE: a gap ends the episode, so the row equals its two segments run
    # as two terminal rows
    r = t([[1.0, 2.0, 9.0, 9.0, 3.0, 4.0]])
    v = t([[0.5, -1.0, 9.0, 9.0, 2.0, 0.25]])
    m = b([[T, T, F, F, T, T]])
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5, gap="reset")
    seg_m = b([[T, T, F, F, F, F], [F, F, F, F, T, T]])
    seg_adv, seg_ret = api.gae(
        rewards=r.expand(2, 6), values=v.expand(2, 6), mask=seg_m, gamma=0.5, lmbda=0.5
    )
    assert_close(adv, seg_adv.sum(0, keepdim=True), **HAND)
    assert_close(ret, seg_ret.sum(0, keepdim=True), **HAND)


@API
def test_scalar_reward_on_last_token_gives_constant_returns(api: Any) -> None:
    # The AgileRL pitfall: the sequence reward R sits on the LAST token only, so with gamma = 1
    # every token's return is R ([R, R, R, R]), not a count-down [4, 3, 2, 1] * something.
    R = 3.0
    m = b([[T, T, T, T]])
    token_rewards = api.kl_in_reward(scores=t([R]), mask=m)
    close(token_rewards, [[0.0, 0.0, 0.0, R]])
    close(api.discounted_returns(rewards=token_rewards, mask=m, gamma=1.0), [[R, R, R, R]])
    _, returns = api.reinforce_plus_plus(token_rewards=token_rewards, mask=m, gamma=1.0)
    close(returns, [[R, R, R, R]])
    # with gamma = .5 the return decays backwards from the last token: R/8, R/4, R/2, R
    close(
        api.discounted_returns(rewards=token_rewards, mask=m, gamma=0.5),
        [[R / 8, R / 4, R / 2, R]],
    )


@API
def test_rebn_two_cells(api: Any) -> None:
    returns = t([[1.0, 7.0, 3.0]])
    m = b([[T, F, T]])
    # cells 1, 3: mean 2, unbiased std sqrt((1 + 1) / 1) = sqrt(2) -> -+1 / (sqrt(2) + eps)
    e = 1.0 / (math.sqrt(2.0) + 1e-8)
    close(api.rebn(returns=returns, mask=m), [[-e, 0.0, e]])
    # biased std sqrt((1 + 1) / 2) = 1 -> -+1 / (1 + eps)
    e = 1.0 / (1.0 + 1e-8)
    close(api.rebn(returns=returns, mask=m, unbiased=False), [[-e, 0.0, e]])


@API
def test_rebn_fewer_than_two_cells_is_zero(api: Any) -> None:
    returns = t([[1.0, 7.0], [5.0, 2.0]])
    close(api.rebn(returns=returns, mask=b([[F, T], [F, F]])), [[0.0, 0.0], [0.0, 0.0]])
    close(api.rebn(returns=returns, mask=b([[F, F], [F, F]])), [[0.0, 0.0], [0.0, 0.0]])


@API
def test_rebn_over_whole_batch(api: Any) -> None:
    returns = t([[1.0, 2.0], [3.0, 4.0]])
    m = b([[T, T], [T, T]])
    # mean 2.5, unbiased std sqrt(5/3)
    s = math.sqrt(5 / 3) + 1e-8
    close(api.rebn(returns=returns, mask=m), [[-1.5 / s, -0.5 / s], [0.5 / s, 1.5 / s]])


# --------------------------------------------------------------------------- GAE


@API
def test_gae_three_steps(api: Any) -> None:
    r = t([[1.0, 0.0, 2.0]])
    v = t([[0.5, 1.0, 1.5]])
    m = b([[T, T, T]])
    # gamma = lmbda = .5 (gamma * lmbda = .25), no bootstrap (V_end = 0):
    # delta2 = 2 + 0 - 1.5 = .5                 A2 = .5
    # delta1 = 0 + .5 * 1.5 - 1 = -.25          A1 = -.25 + .25 * .5 = -.125
    # delta0 = 1 + .5 * 1 - .5 = 1              A0 = 1 + .25 * -.125 = .96875
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5)
    close(adv, [[0.96875, -0.125, 0.5]])
    close(ret, [[1.46875, 0.875, 2.0]])  # A + V
    # bootstrap 2: delta2 = 2 + .5 * 2 - 1.5 = 1.5, A2 = 1.5; A1 = -.25 + .25 * 1.5 = .125;
    # A0 = 1 + .25 * .125 = 1.03125
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5, bootstrap=t([2.0]))
    close(adv, [[1.03125, 0.125, 1.5]])
    close(ret, [[1.53125, 1.125, 3.0]])


@API
def test_gae_skips_holes(api: Any) -> None:
    r = t([[1.0, 99.0, 2.0]])
    v = t([[0.5, -99.0, 1.5]])
    m = b([[T, F, T]])
    # steps 0 and 2 are consecutive: delta2 = 2 - 1.5 = .5, A2 = .5;
    # delta0 = 1 + .5 * 1.5 - .5 = 1.25, A0 = 1.25 + .25 * .5 = 1.375
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5)
    close(adv, [[1.375, 0.0, 0.5]])
    close(ret, [[1.875, 0.0, 2.0]])


@API
def test_gae_gap_options(api: Any) -> None:
    r = t([[1.0, 99.0, 2.0]])
    v = t([[0.5, -99.0, 1.5]])
    m = b([[T, F, T]])
    # gamma = lmbda = .5; step 2 in every option: delta2 = 2 - 1.5 = .5, A2 = .5
    # skip (verl): as test_gae_skips_holes
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5, gap="skip")
    close(adv, [[1.375, 0.0, 0.5]])
    close(ret, [[1.875, 0.0, 2.0]])
    # reset (AgileRL's token path): step 0 is terminal: delta0 = 1 + 0 - .5 = .5, A0 = .5
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5, gap="reset")
    close(adv, [[0.5, 0.0, 0.5]])
    close(ret, [[1.0, 0.0, 2.0]])
    # carry (OpenRLHF): the gap step has r = V = 0: delta1 = 0 + .5 * 1.5 - 0 = .75,
    # A1 = .75 + .25 * .5 = .875; delta0 = 1 + .5 * 0 - .5 = .5, A0 = .5 + .25 * .875 = .71875
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.5, gap="carry")
    close(adv, [[0.71875, 0.0, 0.5]])
    close(ret, [[1.21875, 0.0, 2.0]])


@API
def test_gae_lambda_zero_and_one(api: Any) -> None:
    r = t([[1.0, 0.0, 2.0]])
    v = t([[0.5, 1.0, 1.5]])
    m = b([[T, T, T]])
    # lmbda = 0: A = delta = [1, -.25, .5]
    adv, _ = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=0.0)
    close(adv, [[1.0, -0.25, 0.5]])
    # lmbda = 1: A = G - V = [1.5 - .5, 1 - 1, 2 - 1.5] = [1, 0, .5]
    adv, ret = api.gae(rewards=r, values=v, mask=m, gamma=0.5, lmbda=1.0)
    close(adv, [[1.0, 0.0, 0.5]])
    close(ret, [[1.5, 1.0, 2.0]])


# --------------------------------------------------------------------------- group-relative


@API
def test_grpo_two_groups(api: Any) -> None:
    r = t([1.0, 0.0, 0.0, 1.0])
    # groups [1, 0], [0, 1]: mean .5, c = +-.5, unbiased std sqrt((.25 + .25) / 1) = sqrt(.5)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(api.group_relative(rewards=r, group_size=2), [a, -a, -a, a])
    # biased std = .5 -> .5 / (.5 + eps)
    a = 0.5 / (0.5 + 1e-6)
    close(api.group_relative(rewards=r, group_size=2, unbiased=False), [a, -a, -a, a])
    # Dr. GRPO: centred only
    close(api.group_relative(rewards=r, group_size=2, scale="none"), [0.5, -0.5, -0.5, 0.5])
    # Lite-PPO: batch std of [1, 0, 0, 1] = sqrt(1 / 3) (unbiased)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(api.group_relative(rewards=r, group_size=2, scale="batch"), [a, -a, -a, a])


@API
def test_group_relative_degenerate_and_masked(api: Any) -> None:
    r = t([1.0, 1.0, 5.0, 3.0, 2.0, 7.0])
    m = b([T, T, T, F, T, F])
    # group 0 [1, 1]: zero variance -> 0; group 1 [5, (3)]: one valid member -> 0;
    # group 2 [2, (7)]: one valid member -> 0
    for scale in ("group", "batch", "none"):
        close(api.group_relative(rewards=r, group_size=2, scale=scale, mask=m), [0.0] * 6)
    # G = 3: group 0 [1, 1, 5] (mean 7/3); group 1 [(3), 2, (7)] -> one valid -> 0
    out = api.group_relative(rewards=r, group_size=3, scale="none", mask=m)
    close(out, [1 - 7 / 3, 1 - 7 / 3, 5 - 7 / 3, 0.0, 0.0, 0.0])


@API
def test_group_relative_eps(api: Any) -> None:
    r = t([3.0, 1.0])
    # mean 2, c = +-1, unbiased std sqrt(2); eps = .5 -> 1 / (sqrt(2) + .5)
    a = 1.0 / (math.sqrt(2.0) + 0.5)
    close(api.group_relative(rewards=r, group_size=2, eps=0.5), [a, -a])


@API
def test_group_relative_per_turn_by_hand(api: Any) -> None:
    r = t([[1.0, 5.0], [3.0, 7.0]])
    tm = b([[T, T], [T, F]])
    # turn 0: both play, mean 2 -> c = [-1, 1]; turn 1: only row 0 plays (< 2) -> fallback / 0;
    # cell (1, 1) is unplayed -> 0
    out = api.group_relative_per_turn(rewards=r, turn_mask=tm, group_size=2, scale="none")
    close(out, [[-1.0, 0.0], [1.0, 0.0]])
    out = api.group_relative_per_turn(
        rewards=r, turn_mask=tm, group_size=2, scale="none", fallback=t([10.0, 20.0])
    )
    close(out, [[-1.0, 10.0], [1.0, 0.0]])
    # scale="group": std of [1, 3] = sqrt(2)
    a = 1.0 / (math.sqrt(2.0) + 1e-6)
    out = api.group_relative_per_turn(rewards=r, turn_mask=tm, group_size=2)
    close(out, [[-a, 0.0], [a, 0.0]])


@API
def test_rloo_by_hand(api: Any) -> None:
    # [1, 2, 3]: leave-one-out means 2.5, 2, 1.5
    close(api.rloo(rewards=t([1.0, 2.0, 3.0]), group_size=3), [1 - 2.5, 2 - 2.0, 3 - 1.5])
    # with a masked member (its 100 is ignored) and a group with one valid member
    r = t([1.0, 2.0, 100.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    m = b([T, T, F, T, F, F, T, F])
    close(api.rloo(rewards=r, group_size=4, mask=m), [-1.5, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0])


@API
def test_gpg_by_hand(api: Any) -> None:
    r = t([1.0, 0.0, 1.0, 1.0])
    # group 0 [1, 0] (mean .5) is non-degenerate; group 1 [1, 1] is degenerate (M = 2)
    # valid_groups: alpha = B / (B - M) = 4 / 2 = 2 -> [2 * .5, 2 * -.5, 0, 0]
    close(api.gpg(rewards=r, group_size=2), [1.0, -1.0, 0.0, 0.0])
    # nonzero_rewards: alpha = N / #nonzero = 4 / 3
    close(api.gpg(rewards=r, group_size=2, alpha="nonzero_rewards"), [2 / 3, -2 / 3, 0.0, 0.0])
    # float alpha and f_norm: .5 * (+-.5) / 2
    close(api.gpg(rewards=r, group_size=2, alpha=0.5, f_norm=2.0), [0.125, -0.125, 0.0, 0.0])
    # all groups degenerate -> all 0
    close(api.gpg(rewards=t([1.0, 1.0, 0.0, 0.0]), group_size=2), [0.0] * 4)


@API
def test_gpg_with_mask(api: Any) -> None:
    r = t([1.0, 0.0, 9.0, 3.0, 3.0, 2.0])
    m = b([T, T, F, T, T, T])
    # G = 3: group 0 valid [1, 0] (mean .5), group 1 [3, 3, 2] (mean 8/3): both non-degenerate
    # N_valid = 5, valid samples in non-degenerate groups = 5 -> alpha = 1
    close(
        api.gpg(rewards=r, group_size=3, mask=m),
        [0.5, -0.5, 0.0, 3 - 8 / 3, 3 - 8 / 3, 2 - 8 / 3],
    )
    # G = 2: groups [1, 0], [(9), 3] (one valid: degenerate), [3, 2]
    # N_valid = 5, in non-degenerate groups 4 -> alpha = 5/4
    close(
        api.gpg(rewards=r, group_size=2, mask=m),
        [0.625, -0.625, 0.0, 0.0, 0.625, -0.625],
    )


@API
def test_opo_by_hand(api: Any) -> None:
    # lengths 1, 3: baseline (1 * 1 + 3 * 0) / 4 = .25
    close(api.opo(rewards=t([1.0, 0.0]), lengths=torch.tensor([1, 3]), group_size=2), [0.75, -0.25])
    # masked member (length 0 allowed there): group [2, (x), 4] with lengths 2, 6 -> (4 + 24) / 8
    out = api.opo(
        rewards=t([2.0, 50.0, 4.0]),
        lengths=torch.tensor([2, 0, 6]),
        group_size=3,
        mask=b([T, F, T]),
    )
    close(out, [2 - 3.5, 0.0, 4 - 3.5])


@API
def test_pass_at_k_by_hand(api: Any) -> None:
    r = t([0.0, 3.0, 1.0])
    # best 3, second 1 -> A = 2 on the best member only
    close(api.pass_at_k(rewards=r, group_size=3, scale="none"), [0.0, 2.0, 0.0])
    # std of [0, 3, 1]: mean 4/3, squares 16/9 + 25/9 + 1/9 = 42/9, unbiased var 7/3
    a = 2.0 / (math.sqrt(7 / 3) + 1e-6)
    close(api.pass_at_k(rewards=r, group_size=3), [0.0, a, 0.0])
    # tie for the best -> r_second = r_max -> everything 0
    close(api.pass_at_k(rewards=t([1.0, 0.0, 1.0]), group_size=3), [0.0, 0.0, 0.0])
    # masked: the invalid 10 is not the best; group [0, (10), 1] -> best 1, second 0
    out = api.pass_at_k(rewards=t([0.0, 10.0, 1.0]), group_size=3, scale="none", mask=b([T, F, T]))
    close(out, [0.0, 0.0, 1.0])
    # eps = 0: the all-equal group [1, 1, 1] gives 0, not 0 / 0; [0, 2, 1] has std 1 -> A = 1
    out = api.pass_at_k(rewards=t([1.0, 1.0, 1.0, 0.0, 2.0, 1.0]), group_size=3, eps=0.0)
    close(out, [0.0, 0.0, 0.0, 0.0, 1.0, 0.0])


@API
def test_remax_by_hand(api: Any) -> None:
    r = t([[0.0, 1.0, 5.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    m = b([[T, T, F, T], [F, F, F, F]])
    # row 0 valid rewards 0, 1, 2 (the 5 is masked): suffix sums 3, 3, -, 2; baseline 1.5
    adv, ret = api.remax(token_rewards=r, mask=m, baselines=t([1.5, 4.0]))
    close(ret, [[3.0, 3.0, 0.0, 2.0], [0.0] * 4])
    close(adv, [[1.5, 1.5, 0.0, 0.5], [0.0] * 4])


# --------------------------------------------------------------------------- REINFORCE++


@API
def test_kl_in_reward_placement(api: Any) -> None:
    scores = t([2.0, -1.0, 5.0])
    m = b([[T, T, T, F], [T, F, T, F], [F, F, F, F]])
    kl = t([[0.5, 0.25, 1.0, 9.0], [2.0, 9.0, 0.5, 9.0], [1.0, 1.0, 1.0, 1.0]])
    # -beta * kl at valid tokens (beta = .5), score added on the LAST valid token
    # row 0: [-.25, -.125, -.5 + 2, 0]; row 1: [-1, 0, -.25 - 1, 0]; row 2: no valid token
    out = api.kl_in_reward(scores=scores, mask=m, kl=kl, beta=0.5)
    close(out, [[-0.25, -0.125, 1.5, 0.0], [-1.0, 0.0, -1.25, 0.0], [0.0] * 4])
    # no kl: only the score
    out = api.kl_in_reward(scores=scores, mask=m)
    close(out, [[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, -1.0, 0.0], [0.0] * 4])


@API
def test_reinforce_plus_plus_by_hand(api: Any) -> None:
    tr = t([[0.0, 1.0], [0.0, 3.0]])
    m = b([[T, T], [F, T]])
    # gamma = 1 returns: row 0 [1, 1], row 1 [0 (invalid), 3]
    # whiten over valid 1, 1, 3: mean 5/3, unbiased var ((2/3)^2 * 2 + (4/3)^2) / 2 = 4/3
    adv, ret = api.reinforce_plus_plus(token_rewards=tr, mask=m)
    close(ret, [[1.0, 1.0], [0.0, 3.0]])
    s = math.sqrt(4 / 3 + 1e-8)
    close(adv, [[(1 - 5 / 3) / s, (1 - 5 / 3) / s], [0.0, (3 - 5 / 3) / s]])
    # OpenRLHF's whitening: biased variance ((2/3)^2 * 2 + (4/3)^2) / 3 = 8/9, no eps
    adv, _ = api.reinforce_plus_plus(token_rewards=tr, mask=m, unbiased=False, eps=0.0)
    s = math.sqrt(8 / 9)
    close(adv, [[(1 - 5 / 3) / s, (1 - 5 / 3) / s], [0.0, (3 - 5 / 3) / s]])


@API
def test_reinforce_plus_plus_baseline_by_hand(api: Any) -> None:
    scores = t([1.0, 3.0, 5.0, 5.0])
    m = b([[T, T], [T, F], [F, T], [T, T]])
    # G = 2: centred [-1, 1, 0, 0] -> token rewards [[0, -1], [1, 0], [0, 0], [0, 0]]
    # gamma = 1 returns: [[-1, -1], [1, 0], [0, 0], [0, 0]] (invalid positions 0)
    # valid returns -1, -1, 1, 0, 0, 0: mean -1/6; squares (5/6)^2 * 2 + (7/6)^2 + (1/6)^2 * 3
    #   = (50 + 49 + 3) / 36 = 102/36; unbiased var = 102 / 36 / 5 = 17/30
    adv, ret = api.reinforce_plus_plus_baseline(scores=scores, mask=m, group_size=2)
    close(ret, [[-1.0, -1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    s = math.sqrt(17 / 30 + 1e-8)
    mu = -1 / 6
    w = [(x - mu) / s for x in (-1.0, 1.0, 0.0)]
    close(adv, [[w[0], w[0]], [w[1], 0.0], [0.0, w[2]], [w[2], w[2]]])


# --------------------------------------------------------------------------- shaping


@API
def test_overlong_penalty_boundaries(api: Any) -> None:
    # L_max = 20, L_c = 5: no penalty up to 15; linear (15 - len) / 5 on (15, 20]; -1 beyond 20
    lengths = torch.tensor([0, 14, 15, 16, 18, 19, 20, 21, 100])
    out = api.overlong_penalty(lengths=lengths, max_length=20, buffer_length=5)
    expected = [0.0, 0.0, 0.0, -0.2, -0.6, -0.8, -1.0, -1.0, -1.0]
    assert_close(out, t(expected))  # elementwise
    # penalty_factor 2 scales every penalty: len 18 -> (15 - 18) / 5 * 2 = -1.2
    out = api.overlong_penalty(lengths=lengths, max_length=20, buffer_length=5, penalty_factor=2.0)
    assert_close(out, t(expected) * 2.0)


@API
def test_dynamic_sampling_mask_by_hand(api: Any) -> None:
    r = t([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.7])
    # groups [1, 1] all equal -> drop; [0, 1] -> keep; [.5, .5] -> drop; [.2, .7] -> keep
    out = api.dynamic_sampling_mask(rewards=r, group_size=2)
    assert out.dtype == torch.bool
    assert out.tolist() == [F, F, T, T, F, F, T, T]  # bit-exact: bool masks
    # G = 4 with a mask: group 0 valid [1, 1, 1] (the 0 is masked) -> drop;
    # group 1 valid [.5, .5, .2] -> keep (its invalid member, the .7, is not checked: the spec
    # says both "every member of the group" and "0 at invalid positions")
    m = b([T, T, F, T, T, T, T, F])
    out = api.dynamic_sampling_mask(rewards=r, group_size=4, mask=m)
    assert out[m].tolist() == [F, F, F, T, T, T]  # bit-exact: bool masks
    m = b([T, F, F, T, T, T, F, F])
    # group 0 valid [1, 1] -> drop; group 1 valid [.5, .5] -> drop
    # bit-exact: bool masks
    assert api.dynamic_sampling_mask(rewards=r, group_size=4, mask=m).tolist() == [F] * 8
    # a group with one valid member -> False
    m = b([T, F, F, F, F, F, F, F])
    # bit-exact: bool masks
    assert api.dynamic_sampling_mask(rewards=r, group_size=4, mask=m).tolist() == [F] * 8
