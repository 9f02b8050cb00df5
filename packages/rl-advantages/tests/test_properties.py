"""Hypothesis properties of the estimators (run on the implementation and on the references)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import ref_advantages as reference
import rl_advantages
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rl_testing.strategies import group_layouts, mask_batches, rewards, turn_batches
from rl_testing.tolerance import assert_close

F64 = torch.float64
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GAMMA = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]) | st.floats(0.0, 1.0)
LMBDA = st.sampled_from([0.0, 0.5, 0.95, 1.0]) | st.floats(0.0, 1.0)
# dyadic grids: exact sums / scalings, ties and zero-variance groups are common
GRID = (-2.0, -1.0, -0.5, 0.0, 0.25, 1.0, 3.0)
SHIFTS = st.sampled_from([-8.0, -3.0, -0.5, 0.0, 1.5, 4.0, 100.0])


class _Impl:
    def __getattr__(self, name: str) -> Any:
        return getattr(rl_advantages, name)


class _Ref:
    def __getattr__(self, name: str) -> Any:
        return getattr(reference, f"ref_{name}")


API = pytest.mark.parametrize("api", [_Impl(), _Ref()], ids=["impl", "ref"])


@st.composite
def token_batches(
    draw: st.DrawFn, max_n: int = 6, max_t: int = 8, right_padded: bool | None = None
) -> dict[str, Any]:
    """mask [N, T] (empty rows, holes), rewards, values, optional bootstrap [N]."""
    if right_padded is None:
        right_padded = draw(st.booleans())
    mask = draw(mask_batches(max_n, max_t, allow_empty_rows=True, right_padded=right_padded))
    n, t = mask.shape
    out: dict[str, Any] = {
        "mask": mask,
        "rewards": draw(rewards((n, t))),
        "values": draw(rewards((n, t))),
        "bootstrap": draw(st.none() | rewards(n)),
    }
    return out


@st.composite
def grouped(draw: st.DrawFn, *, grid: bool = True, masked: bool | None = None) -> dict[str, Any]:
    """B, G >= 2, rewards [N] (from GRID or continuous), optional mask [N]."""
    b, g = draw(group_layouts(4, 4, min_g=2))
    n = b * g
    r = draw(rewards(n, values=GRID) if grid else rewards(n))
    use_mask = draw(st.booleans()) if masked is None else masked
    mask = None
    if use_mask:
        mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    return {"b": b, "g": g, "rewards": r, "mask": mask}


# --------------------------------------------------------------------------- GAE / returns


def _scan_scale(*xs: torch.Tensor | None) -> float:
    """The largest partial sum a scan over a row can reach: the row sums of |x|, added up."""
    return max(1.0, sum(float(x.abs().sum(-1).max()) for x in xs if x is not None and x.numel()))


@API
@SETTINGS
@given(batch=token_batches(), gamma=GAMMA)
def test_gae_lambda_one_is_returns_minus_values(api: Any, batch: dict[str, Any], gamma: float):
    mask, r, v, boot = batch["mask"], batch["rewards"], batch["values"], batch["bootstrap"]
    adv, ret = api.gae(rewards=r, values=v, mask=mask, gamma=gamma, lmbda=1.0, bootstrap=boot)
    disc = api.discounted_returns(rewards=r, mask=mask, gamma=gamma, bootstrap=boot)
    # lmbda = 1 telescopes: A_j = sum_k gamma^k r_{j+k} + gamma^L V_end - V_j = G_j - V_j
    # (two scans over T steps; the values cancel, so the terms set the scale)
    tol = {
        "reduction": max(1, mask.shape[-1]),
        "scale": _scan_scale(r, v, v, None if boot is None else boot[:, None]),
    }
    assert_close(adv, torch.where(mask, disc - v, 0.0), **tol, msg="advantages")
    assert_close(ret, disc, **tol, msg="returns")


@API
@SETTINGS
@given(batch=token_batches(), lmbda=LMBDA)
def test_gae_gamma_zero_is_one_step_td_error(api: Any, batch: dict[str, Any], lmbda: float):
    mask, r, v, boot = batch["mask"], batch["rewards"], batch["values"], batch["bootstrap"]
    adv, ret = api.gae(rewards=r, values=v, mask=mask, gamma=0.0, lmbda=lmbda, bootstrap=boot)
    scale = _scan_scale(r[..., None], v[..., None])  # elementwise: |r| + |v|
    assert_close(adv, torch.where(mask, r - v, 0.0), scale=scale, msg="advantages")
    assert_close(ret, torch.where(mask, r, 0.0), scale=scale, msg="returns")


@API
@SETTINGS
@given(batch=token_batches(), gamma=GAMMA, lmbda=LMBDA)
def test_gae_no_bootstrap_is_zero_bootstrap(
    api: Any, batch: dict[str, Any], gamma: float, lmbda: float
):
    mask, r, v = batch["mask"], batch["rewards"], batch["values"]
    zeros = torch.zeros(mask.shape[0], dtype=F64)
    a0, r0 = api.gae(rewards=r, values=v, mask=mask, gamma=gamma, lmbda=lmbda)
    a1, r1 = api.gae(rewards=r, values=v, mask=mask, gamma=gamma, lmbda=lmbda, bootstrap=zeros)
    tol = {"reduction": max(1, mask.shape[-1]), "scale": _scan_scale(r, v, v)}
    assert_close(a0, a1, **tol, msg="advantages")
    assert_close(r0, r1, **tol, msg="returns")


@API
@SETTINGS
@given(batch=token_batches(), gamma=GAMMA)
def test_discounted_returns_skip_holes(api: Any, batch: dict[str, Any], gamma: float) -> None:
    # invalid steps are skipped: each row equals the return of its compacted valid steps
    mask, r, boot = batch["mask"], batch["rewards"], batch["bootstrap"]
    out = api.discounted_returns(rewards=r, mask=mask, gamma=gamma, bootstrap=boot)
    n, t = mask.shape
    for i in range(n):
        valid = mask[i]
        k = int(valid.sum())
        compact_r = torch.zeros(1, t, dtype=F64)
        compact_r[0, :k] = r[i][valid]
        compact_m = torch.zeros(1, t, dtype=torch.bool)
        compact_m[0, :k] = True
        b = None if boot is None else boot[i : i + 1]
        compact = api.discounted_returns(
            rewards=compact_r, mask=compact_m, gamma=gamma, bootstrap=b
        )
        tol = {
            "reduction": max(1, t),
            "scale": _scan_scale(r[i], None if boot is None else boot[i : i + 1]),
        }
        assert_close(out[i][valid], compact[0, :k], **tol)  # holes vs the compacted row
        assert bool((out[i][~valid] == 0).all())


# --------------------------------------------------------------------------- gaps (issue 44)

GAPS = st.sampled_from(["skip", "reset", "carry"])


def _runs(row: torch.Tensor) -> list[list[int]]:
    """The runs of consecutive valid steps of one mask row, in order."""
    out: list[list[int]] = []
    for s in row.nonzero().flatten().tolist():
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def _gap_outputs(api: Any, batch: dict[str, Any], gamma: float, lmbda: float, **kw: Any):
    """(returns, advantages, value targets) of ``batch`` under the keyword arguments."""
    common = {"mask": batch["mask"], "gamma": gamma, "bootstrap": batch["bootstrap"]}
    g = api.discounted_returns(rewards=batch["rewards"], **common, **kw)
    adv, ret = api.gae(
        rewards=batch["rewards"], values=batch["values"], lmbda=lmbda, **common, **kw
    )
    return g, adv, ret


@API
@SETTINGS
@given(batch=token_batches(right_padded=False), gamma=GAMMA, lmbda=LMBDA)
def test_gap_reset_runs_each_segment_as_a_terminal_episode(
    api: Any, batch: dict[str, Any], gamma: float, lmbda: float
) -> None:
    # AgileRL's token paths: gap="reset" equals the default on a batch with one row per run of
    # consecutive valid steps, the bootstrap going to each row's last run only
    mask, boot = batch["mask"], batch["bootstrap"]
    rows, seg_masks, seg_boot = [], [], []
    for i in range(mask.shape[0]):
        runs = _runs(mask[i])
        for k, run in enumerate(runs):
            seg = torch.zeros_like(mask[i])
            seg[run] = True
            rows.append(i)
            seg_masks.append(seg)
            last = k == len(runs) - 1
            seg_boot.append(float(boot[i]) if boot is not None and last else 0.0)
    got = _gap_outputs(api, batch, gamma, lmbda, gap="reset")
    tol = {
        "reduction": max(1, mask.shape[-1]),
        "scale": _scan_scale(batch["rewards"], batch["values"]),
    }
    if not rows:
        for out in got:
            assert bool((out == 0).all())
        return
    idx = torch.tensor(rows)
    seg_batch = {
        "mask": torch.stack(seg_masks),
        "rewards": batch["rewards"][idx],
        "values": batch["values"][idx],
        "bootstrap": torch.tensor(seg_boot, dtype=F64) if boot is not None else None,
    }
    for out, seg_out in zip(got, _gap_outputs(api, seg_batch, gamma, lmbda), strict=True):
        expected = torch.zeros_like(out).index_add_(0, idx, seg_out)  # runs do not overlap
        assert_close(out, expected, **tol)


@API
@SETTINGS
@given(batch=token_batches(right_padded=False), gamma=GAMMA, lmbda=LMBDA)
def test_gap_carry_is_a_step_with_reward_and_value_zero(
    api: Any, batch: dict[str, Any], gamma: float, lmbda: float
) -> None:
    # OpenRLHF: gap="carry" equals the default with every gap step made valid, reward 0, value 0
    mask = batch["mask"]
    before = mask.cumsum(-1) > 0
    after = mask.flip(-1).cumsum(-1).flip(-1) > 0
    filled = mask | (before & after)
    zero = torch.zeros((), dtype=F64)
    filled_batch = {
        "mask": filled,
        "rewards": torch.where(mask, batch["rewards"], zero),
        "values": torch.where(mask, batch["values"], zero),
        "bootstrap": batch["bootstrap"],
    }
    got = _gap_outputs(api, batch, gamma, lmbda, gap="carry")
    boot = batch["bootstrap"]
    tol = {
        "reduction": max(1, mask.shape[-1]),
        "scale": _scan_scale(
            batch["rewards"], batch["values"], None if boot is None else boot[:, None]
        ),
    }
    for out, ref in zip(got, _gap_outputs(api, filled_batch, gamma, lmbda), strict=True):
        assert_close(out, torch.where(mask, ref, zero), **tol)


@API
@SETTINGS
@given(batch=token_batches(), gamma=GAMMA, lmbda=LMBDA, gap=GAPS)
def test_gap_options_agree_on_rows_without_a_gap(
    api: Any, batch: dict[str, Any], gamma: float, lmbda: float, gap: str
) -> None:
    mask = batch["mask"]
    no_gap = torch.tensor([len(_runs(row)) <= 1 for row in mask], dtype=torch.bool)
    got = _gap_outputs(api, batch, gamma, lmbda, gap=gap)
    default = _gap_outputs(api, batch, gamma, lmbda)
    for out, ref in zip(got, default, strict=True):
        assert torch.equal(out[no_gap], ref[no_gap])  # bit-exact: one recursion, same operations
    if gamma == 1.0 and gap == "carry":  # reward 0 at no discount: the returns agree everywhere
        boot = batch["bootstrap"]
        scale = _scan_scale(batch["rewards"], None if boot is None else boot[:, None])
        assert_close(got[0], default[0], reduction=max(1, mask.shape[-1]), scale=scale)


# --------------------------------------------------------------------------- ReBN


@API
@SETTINGS
@given(batch=token_batches(), unbiased=st.booleans())
def test_rebn_zero_mean_unit_std(api: Any, batch: dict[str, Any], unbiased: bool) -> None:
    mask, x = batch["mask"], batch["rewards"]
    out = api.rebn(returns=x, mask=mask, unbiased=unbiased)
    assert bool((out[~mask] == 0).all())
    count = int(mask.sum())
    if count < 2:
        assert bool((out == 0).all())
        return
    valid_in = x[mask]
    valid_out = out[mask]
    s = float(valid_in.std(correction=1 if unbiased else 0))
    assert abs(float(valid_out.mean())) <= 1e-9
    out_std = float(valid_out.std(correction=1 if unbiased else 0))
    # (x - mean) / (std + eps) has std s / (s + eps): 1 for any non-constant batch up to eps
    assert math.isclose(out_std, s / (s + 1e-8), rel_tol=1e-7, abs_tol=1e-7)
    if s > 1e-3:
        assert math.isclose(out_std, 1.0, rel_tol=1e-4)


# --------------------------------------------------------------------------- group-relative


def _per_group(values: list[float], b: int, g: int) -> torch.Tensor:
    return torch.tensor(values, dtype=F64).repeat_interleave(g)[: b * g]


@API
@SETTINGS
@given(
    case=grouped(), scale=st.sampled_from(["group", "none"]), unbiased=st.booleans(), data=st.data()
)
def test_group_relative_invariant_to_per_group_shift(
    api: Any, case: dict[str, Any], scale: str, unbiased: bool, data: st.DataObject
) -> None:
    b, g, r, mask = case["b"], case["g"], case["rewards"], case["mask"]
    shifts = data.draw(st.lists(SHIFTS, min_size=b, max_size=b))
    kw = {"group_size": g, "scale": scale, "unbiased": unbiased, "mask": mask}
    base = api.group_relative(rewards=r, **kw)
    moved = r + _per_group(shifts, b, g)
    shifted = api.group_relative(rewards=moved, **kw)
    # the group mean over g rewards, then the std; the terms are the shifted rewards, divided by
    # the std for "group" (GRID keeps every non-zero group std >= 0.1)
    terms = float(moved.abs().max()) / (0.1 if scale == "group" else 1.0)
    assert_close(shifted, base, reduction=g, stages=2, scale=terms)


@API
@SETTINGS
@given(case=grouped(), shift=SHIFTS, unbiased=st.booleans())
def test_group_relative_batch_invariant_to_global_shift(
    api: Any, case: dict[str, Any], shift: float, unbiased: bool
) -> None:
    # "batch" divides by the std of the RAW rewards: invariant to one constant for the batch
    g, r, mask = case["g"], case["rewards"], case["mask"]
    kw = {"group_size": g, "scale": "batch", "unbiased": unbiased, "mask": mask}
    base = api.group_relative(rewards=r, **kw)
    # the batch std over every reward; the terms are the shifted rewards over that std (a
    # non-zero std of at most 16 GRID rewards is >= 0.05)
    terms = float((r + shift).abs().max()) / 0.05
    assert_close(api.group_relative(rewards=r + shift, **kw), base, reduction=r.numel(),
                 stages=2, scale=terms)  # fmt: skip


@API
@SETTINGS
@given(
    case=grouped(),
    factor=st.sampled_from([0.25, 0.5, 2.0, 3.0, 10.0]),
    scale=st.sampled_from(["group", "batch"]),
    unbiased=st.booleans(),
)
def test_group_relative_invariant_to_positive_scaling(
    api: Any, case: dict[str, Any], factor: float, scale: str, unbiased: bool
) -> None:
    # c / (std + eps) with eps = 1e-12: scaling r scales c and std alike (GRID keeps std >= .1)
    g, r, mask = case["g"], case["rewards"], case["mask"]
    kw = {"group_size": g, "scale": scale, "unbiased": unbiased, "eps": 1e-12, "mask": mask}
    base = api.group_relative(rewards=r, **kw)
    scaled = api.group_relative(rewards=r * factor, **kw)
    torch.testing.assert_close(scaled, base, rtol=1e-9, atol=1e-9)


@API
@SETTINGS
@given(case=grouped(), factor=st.sampled_from([0.25, 0.5, 2.0, 3.0, 10.0]))
def test_dr_grpo_is_scale_equivariant(api: Any, case: dict[str, Any], factor: float) -> None:
    g, r, mask = case["g"], case["rewards"], case["mask"]
    kw = {"group_size": g, "scale": "none", "mask": mask}
    base = api.group_relative(rewards=r, **kw)
    scaled = api.group_relative(rewards=r * factor, **kw)
    # r - mean over g rewards, scaled: the scaled rewards are the terms
    assert_close(scaled, base * factor, reduction=g, scale=float((r * factor).abs().max()))


@API
@SETTINGS
@given(case=grouped(grid=False))
def test_rloo_sums_to_zero_per_group(api: Any, case: dict[str, Any]) -> None:
    b, g, r, mask = case["b"], case["g"], case["rewards"], case["mask"]
    out = api.rloo(rewards=r, group_size=g, mask=mask)
    # sum_i (r_i - (S - r_i) / (n - 1)) = S - (n S - S) / (n - 1) = 0 over the valid members
    # the leave-one-out means (g terms), then the group sum: terms as large as the rewards
    scale = 2 * g * max(1.0, float(r.abs().max()))
    assert_close(
        out.view(b, g).sum(1), torch.zeros(b, dtype=F64), reduction=g, stages=2, scale=scale
    )
    if mask is not None:
        assert bool((out[~mask] == 0).all())


@API
@SETTINGS
@given(case=grouped(grid=False, masked=False))
def test_rloo_is_rescaled_dr_grpo(api: Any, case: dict[str, Any]) -> None:
    # all valid: r_i - mean_{-i} = G / (G - 1) * (r_i - mean)
    g, r = case["g"], case["rewards"]
    dr = api.group_relative(rewards=r, group_size=g, scale="none")
    out = api.rloo(rewards=r, group_size=g)
    # two routes to r_i minus a group mean (g terms); it cancels, the rewards set the scale
    scale = max(1.0, float(r.abs().max()))
    assert_close(out, dr * g / (g - 1), reduction=g, stages=2, scale=scale)


@API
@SETTINGS
@given(case=grouped())
def test_dynamic_sampling_mask_matches_nonzero_group_std(api: Any, case: dict[str, Any]) -> None:
    # a group is kept iff its GRPO advantages are not all zero (rewards on a grid: std >= .1)
    g, r, mask = case["g"], case["rewards"], case["mask"]
    keep = api.dynamic_sampling_mask(rewards=r, group_size=g, mask=mask)
    adv = api.group_relative(rewards=r, group_size=g, scale="none", mask=mask)
    nonzero_group = (adv.view(-1, g) != 0).any(1).repeat_interleave(g)
    valid = torch.ones_like(keep) if mask is None else mask
    # valid positions only (an invalid member of a kept group is not pinned down by the spec)
    assert torch.equal(keep[valid], nonzero_group[valid])  # bit-exact: bool masks


# --------------------------------------------------------------------------- masking property

NAN_LIKE = [float("nan"), float("inf"), float("-inf"), 1e9, -1e9]
INT_FILLS = [0, -7, 10**9]


Fills = list[tuple[str, torch.Tensor]]
MaskedCase = tuple[dict[str, Any], Fills]


def _stats_case(draw: st.DrawFn, name: str) -> MaskedCase:
    mask = draw(mask_batches(5, 7, allow_empty_rows=True, right_padded=False))
    x = draw(rewards(tuple(mask.shape)))
    arg = "returns" if name == "rebn" else "x"
    kwargs: dict[str, Any] = {arg: torch.where(mask, x, 0.0), "mask": mask}
    if name.startswith("masked_"):
        kwargs["dim"] = draw(st.sampled_from([None, 0, 1]))
    if name in {"masked_var", "whiten", "rebn"}:
        kwargs["unbiased"] = draw(st.booleans())
    if name == "whiten":
        kwargs["shift_mean"] = draw(st.booleans())
    return kwargs, [(arg, ~mask)]


def _token_case(draw: st.DrawFn, name: str) -> MaskedCase:
    batch = draw(token_batches())
    mask = batch["mask"]
    r = torch.where(mask, batch["rewards"], 0.0)
    if name == "discounted_returns":
        kwargs = {"rewards": r, "mask": mask, "gamma": draw(GAMMA), "bootstrap": batch["bootstrap"]}
        kwargs["gap"] = draw(GAPS)
        return kwargs, [("rewards", ~mask)]
    if name == "gae":
        v = torch.where(mask, batch["values"], 0.0)
        kwargs = {"rewards": r, "values": v, "mask": mask, "gamma": draw(GAMMA)}
        kwargs.update(lmbda=draw(LMBDA), bootstrap=batch["bootstrap"], gap=draw(GAPS))
        return kwargs, [("rewards", ~mask), ("values", ~mask)]
    if name == "remax":
        kwargs = {"token_rewards": r, "mask": mask, "baselines": draw(rewards(mask.shape[0]))}
        return kwargs, [("token_rewards", ~mask)]
    kwargs = {"token_rewards": r, "mask": mask, "gamma": draw(GAMMA), "gap": draw(GAPS)}
    return kwargs, [("token_rewards", ~mask)]


def _score_case(draw: st.DrawFn, name: str) -> MaskedCase:
    b, g = draw(group_layouts(4, 3, min_g=2))
    n = b * g
    mask = draw(mask_batches(n, 6, min_n=n, allow_empty_rows=True, right_padded=False))
    kl = torch.where(mask, draw(rewards(tuple(mask.shape), min_value=0.0)), 0.0)
    kwargs: dict[str, Any] = {"scores": draw(rewards(n)), "mask": mask, "kl": kl}
    kwargs["beta"] = draw(st.sampled_from([0.0, 0.1]))
    if name == "reinforce_plus_plus_baseline":
        kwargs.update(group_size=g, gamma=draw(GAMMA))
    return kwargs, [("kl", ~mask)]


def _turn_case(draw: st.DrawFn, name: str) -> MaskedCase:
    if name == "pool_to_turns":
        mask, turn_ids = draw(turn_batches(allow_empty_rows=True))
        values = torch.where(mask, draw(rewards(tuple(mask.shape))), 0.0)
        kwargs = {
            "values": values,
            "turn_ids": turn_ids,
            "reduction": draw(st.sampled_from(["sum", "mean", "final"])),
        }
        return kwargs, [("values", turn_ids < 0)]
    b, g = draw(group_layouts(4, 4, min_g=2))
    n = b * g
    turn_mask = draw(mask_batches(n, 4, min_n=n, allow_empty_rows=True, right_padded=False))
    r = torch.where(turn_mask, draw(rewards(tuple(turn_mask.shape), values=GRID)), 0.0)
    kwargs = {
        "rewards": r,
        "turn_mask": turn_mask,
        "group_size": g,
        "scale": draw(st.sampled_from(["group", "none"])),
        "fallback": draw(st.none() | rewards(n)),
    }
    return kwargs, [("rewards", ~turn_mask)]


def _group_case(draw: st.DrawFn, name: str) -> MaskedCase:
    b, g = draw(group_layouts(4, 4, min_g=2))
    n = b * g
    r = draw(rewards(n) | rewards(n, values=(0.0, 1.0)))
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    kwargs: dict[str, Any] = {"rewards": torch.where(mask, r, 0.0), "group_size": g, "mask": mask}
    fills: Fills = [("rewards", ~mask)]
    if name == "group_relative":
        kwargs["scale"] = draw(st.sampled_from(["group", "batch", "none"]))
    elif name == "gpg":
        kwargs["alpha"] = draw(st.sampled_from(["valid_groups", "nonzero_rewards", 0.7]))
    elif name == "pass_at_k":
        kwargs["scale"] = draw(st.sampled_from(["group", "none"]))
    elif name == "opo":
        lengths = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
        kwargs["lengths"] = torch.where(mask, torch.tensor(lengths), 1)
        fills.append(("lengths", ~mask))
    return kwargs, fills


_CASE_FAMILIES = {
    "masked_sum": _stats_case,
    "masked_mean": _stats_case,
    "masked_var": _stats_case,
    "whiten": _stats_case,
    "rebn": _stats_case,
    "discounted_returns": _token_case,
    "gae": _token_case,
    "remax": _token_case,
    "reinforce_plus_plus": _token_case,
    "kl_in_reward": _score_case,
    "reinforce_plus_plus_baseline": _score_case,
    "group_relative_per_turn": _turn_case,
    "pool_to_turns": _turn_case,
    "group_relative": _group_case,
    "rloo": _group_case,
    "gpg": _group_case,
    "opo": _group_case,
    "pass_at_k": _group_case,
    "dynamic_sampling_mask": _group_case,
}


@st.composite
def masked_cases(draw: st.DrawFn, name: str) -> MaskedCase:
    """(kwargs with zeros at invalid positions, [(argument, its invalid positions)])."""
    return _CASE_FAMILIES[name](draw, name)


MASKED_FUNCTIONS = sorted(_CASE_FAMILIES)


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, tuple | list) else (x,)


@API
@pytest.mark.parametrize("name", MASKED_FUNCTIONS)
@SETTINGS
@given(data=st.data())
def test_invalid_positions_never_matter(api: Any, name: str, data: st.DataObject) -> None:
    """Filling every input's invalid positions with NaN / inf / 1e9 changes no output."""
    kwargs, fills = data.draw(masked_cases(name))
    fill = data.draw(st.sampled_from(NAN_LIKE))
    int_fill = data.draw(st.sampled_from(INT_FILLS))
    dirty = dict(kwargs)
    for arg, invalid in fills:
        x = kwargs[arg].clone()
        x[invalid] = fill if x.is_floating_point() else int_fill
        dirty[arg] = x
    fn = getattr(api, name)
    clean_out = _as_tuple(fn(**kwargs))
    dirty_out = _as_tuple(fn(**dirty))
    for c, d in zip(clean_out, dirty_out, strict=True):
        if c.dtype == torch.bool:
            assert torch.equal(c, d)  # bit-exact: bool masks
        else:
            torch.testing.assert_close(d, c, rtol=1e-12, atol=1e-12)
