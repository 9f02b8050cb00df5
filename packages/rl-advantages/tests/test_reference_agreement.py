"""Implementation vs the float64 loop references in ``reference.py`` on seeded random inputs.

Shapes: N = B * G with B in 1..7 and G in {2, 3, 4}; T / K in {1, 2, 5, 17}. Masks mix rows with no
valid step, a single valid step, a valid prefix, holes (non-prefix) and all valid; group masks mix
groups with all, none, one, all-but-one and random valid members. Values at invalid positions are
random finite garbage (the NaN / 1e9 masking property lives in test_properties.py).

Results must agree to rl_testing.tolerance's bound (the longest sum: at most every element of the
largest input; the chained statistics, scans and whitenings of each function: STAGES); float32
inputs must give float32 outputs; every output is exactly 0 at invalid positions.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import pytest
import ref_advantages as reference
import rl_advantages as ra
import torch
from rl_testing.tolerance import assert_close

F64 = torch.float64
# The chained reductions behind one output (statistics, scans, whitening), per function.
STAGES: dict[str, int] = {
    "masked_sum": 1,
    "masked_mean": 1,
    "masked_var": 2,  # the mean, then the sum of squares
    "whiten": 2,
    "rebn": 2,
    "pool_to_turns": 1,
    "broadcast_to_tokens": 1,
    "discounted_returns": 1,  # one scan
    "gae": 1,
    "group_relative": 2,  # the group mean, then the std
    "group_relative_per_turn": 2,
    "rloo": 1,
    "gpg": 2,  # the group mean, then the count of valid groups
    "opo": 1,
    "pass_at_k": 2,
    "remax": 1,
    "kl_in_reward": 1,
    "reinforce_plus_plus": 3,  # the scan, then the batch mean and std
    "reinforce_plus_plus_baseline": 4,  # the group mean, the scan, the batch mean and std
}
GAMMAS = [0.0, 0.5, 0.99, 1.0]
LMBDAS = [0.0, 0.5, 0.95, 1.0]
LENGTHS = [1, 2, 5, 17]
GROUP_SIZES = [2, 3, 4]
REWARD_KINDS = ["normal", "binary", "ties"]
ROW_KINDS = ("empty", "single", "prefix", "holes", "full")
GROUP_KINDS = ("all", "none", "single", "all_but_one", "random")
GAPS = ["skip", "reset", "carry"]  # what a gap between valid steps means (returns, GAE)

Kwargs = dict[str, Any]
Case = tuple[Kwargs, torch.Tensor | None]  # (kwargs, validity mask of the outputs)


# --------------------------------------------------------------------------- input generators


def _gen(*key: object) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform integer in [low, high)."""
    return int(torch.randint(low, high, (1,), generator=gen).item())


def make_rewards(
    gen: torch.Generator, shape: tuple[int, ...], kind: str = "normal"
) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(shape, generator=gen, dtype=F64) * 2.0 + 0.5
    if kind == "binary":  # 0/1 rewards: ties and zero-variance groups are common
        return torch.randint(0, 2, shape, generator=gen).to(F64)
    if kind == "ties":  # a few dyadic values: ties, exact group means
        table = torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=F64)
        return table[torch.randint(0, 4, shape, generator=gen)]
    raise AssertionError(kind)


def make_mask(gen: torch.Generator, n: int, t: int) -> torch.Tensor:
    """[n, t] bool; consecutive rows cycle through empty / single / prefix / holes / full."""
    offset = _randint(gen, 0, len(ROW_KINDS))
    rows = []
    for i in range(n):
        kind = ROW_KINDS[(i + offset) % len(ROW_KINDS)]
        if kind == "empty":
            row = [False] * t
        elif kind == "single":
            p = _randint(gen, 0, t)
            row = [s == p for s in range(t)]
        elif kind == "prefix":
            length = _randint(gen, 1, t + 1)
            row = [s < length for s in range(t)]
        elif kind == "holes":
            row = [bool(b) for b in (torch.rand(t, generator=gen) < 0.6).tolist()]
            if t >= 3:  # make sure there is a hole between two valid steps
                row[0], row[1], row[-1] = True, False, True
        else:
            row = [True] * t
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(n, t)


def make_group_mask(gen: torch.Generator, n: int, group_size: int) -> torch.Tensor:
    """[n] bool; consecutive groups cycle through all / none / single / all-but-one / random."""
    offset = _randint(gen, 0, len(GROUP_KINDS))
    out: list[bool] = []
    for g in range(n // group_size):
        kind = GROUP_KINDS[(g + offset) % len(GROUP_KINDS)]
        p = _randint(gen, 0, group_size)
        if kind == "all":
            out += [True] * group_size
        elif kind == "none":
            out += [False] * group_size
        elif kind == "single":
            out += [i == p for i in range(group_size)]
        elif kind == "all_but_one":
            out += [i != p for i in range(group_size)]
        else:
            out += [bool(b) for b in (torch.rand(group_size, generator=gen) < 0.5).tolist()]
    return torch.tensor(out, dtype=torch.bool)


def make_turn_ids(gen: torch.Generator, n: int, t: int, kind: str) -> torch.Tensor:
    """[n, t] int64 turn ids in [-1, K-1].

    "ordered": multi-turn layout (each run of valid tokens starts a turn, runs are sometimes cut);
    "arbitrary": any id anywhere (turns need not be contiguous or ordered; the spec defines
    sum/mean/final and "last token" for any layout).
    """
    if kind == "arbitrary":
        k_max = _randint(gen, 1, 5)
        return torch.randint(-1, k_max, (n, t), generator=gen)
    mask = make_mask(gen, n, t)
    ids = torch.full((n, t), -1, dtype=torch.int64)
    for i in range(n):
        turn = -1
        for s in range(t):
            if not mask[i, s]:
                continue
            new_run = s == 0 or not mask[i, s - 1]
            if new_run or float(torch.rand(1, generator=gen)) < 0.3:
                turn += 1
            ids[i, s] = turn
    return ids


def _layout(gen: torch.Generator, group_size: int | None = None) -> tuple[int, int]:
    g = group_size if group_size is not None else GROUP_SIZES[_randint(gen, 0, 3)]
    return _randint(gen, 1, 8) * g, g


# --------------------------------------------------------------------------- checking


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, tuple | list) else (x,)


def _assert_zero_at_invalid(outs: tuple[torch.Tensor, ...], valid: torch.Tensor | None) -> None:
    if valid is None:
        return
    for out in outs:
        assert out.shape == valid.shape, (out.shape, valid.shape)
        bad = out[~valid]
        assert bool((bad == 0).all()), f"non-zero output at invalid positions: {bad}"


def _reduction(kwargs: Kwargs) -> int:
    """The longest sum behind one output: at most every element of the largest float input."""
    sizes = [v.numel() for v in kwargs.values() if isinstance(v, torch.Tensor)]
    return max([1, *sizes])


def _scale(kwargs: Kwargs, expected: torch.Tensor) -> float:
    """The size of the summed terms: the inputs (rewards, values) or the outputs, the larger.

    An advantage is a difference of terms as large as the rewards (r - mean, G - V) that may
    cancel to near zero, so ``max|expected|`` alone understates the rounding it carries.
    """
    floats = [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    sizes = [float(v.abs().max()) for v in (*floats, expected) if v.numel()]
    return max([1e-300, *sizes])


def assert_agree(name: str, kwargs: Kwargs, valid: torch.Tensor | None) -> None:
    got = _as_tuple(getattr(ra, name)(**kwargs))
    expected = _as_tuple(getattr(reference, f"ref_{name}")(**kwargs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if not g.is_floating_point():
            assert torch.equal(g, e), name  # bit-exact: integer / bool outputs (masks)
            continue
        tol = {"reduction": _reduction(kwargs), "stages": STAGES[name]}
        assert_close(g, e, **tol, scale=_scale(kwargs, e), msg=name)
    _assert_zero_at_invalid(got, valid)


def _with_gap(kwargs: Kwargs, gap: str) -> Kwargs:
    """``gap`` passed unless it is the default ("skip" then runs the default path)."""
    return kwargs if gap == "skip" else {**kwargs, "gap": gap}


# --------------------------------------------------------------------------- case builders
# Each builder returns (kwargs, validity mask of the outputs or None).


def case_masked_stat(
    gen: torch.Generator, name: str, shape: tuple[int, ...], dim: int | None, keepdim: bool
) -> Case:
    x = torch.randn(shape, generator=gen, dtype=F64) * 3.0 + 1.0
    flat = make_mask(gen, x.numel() // shape[-1], shape[-1])
    if shape[-1] > 1 and flat.shape[0] > 1:  # an all-invalid and a single-valid column
        flat[:, 0] = False
        flat[:, 1] = False
        flat[0, 1] = True
    kwargs: Kwargs = {"x": x, "mask": flat.reshape(shape)}
    if dim is not None:
        kwargs["dim"] = dim
    if keepdim:
        kwargs["keepdim"] = True
    if name == "masked_var":
        kwargs["unbiased"] = bool(_randint(gen, 0, 2))
    return kwargs, None


def _whiten_like_mask(gen: torch.Generator, n: int, t: int, mask_kind: str) -> torch.Tensor:
    if mask_kind == "mixed":
        return make_mask(gen, n, t)
    mask = torch.zeros(n, t, dtype=torch.bool)
    if mask_kind == "one_valid":
        mask[_randint(gen, 0, n), _randint(gen, 0, t)] = True
    elif mask_kind == "all_valid":
        mask[:] = True
    return mask


def case_whiten(
    gen: torch.Generator, t: int, shift_mean: bool, unbiased: bool, mask_kind: str
) -> Case:
    n, _ = _layout(gen)
    x = torch.randn(n, t, generator=gen, dtype=F64) * 2.0 + 3.0
    mask = _whiten_like_mask(gen, n, t, mask_kind)
    kwargs = {"x": x, "mask": mask, "shift_mean": shift_mean, "unbiased": unbiased}
    if _randint(gen, 0, 2):
        kwargs["eps"] = 0.25
    return kwargs, mask


def case_rebn(gen: torch.Generator, k: int, unbiased: bool, mask_kind: str, eps: float) -> Case:
    n, _ = _layout(gen)
    returns = torch.randn(n, k, generator=gen, dtype=F64) * 2.0 - 1.0
    mask = _whiten_like_mask(gen, n, k, mask_kind)
    return {"returns": returns, "mask": mask, "eps": eps, "unbiased": unbiased}, mask


def case_discounted_returns(
    gen: torch.Generator, k: int, gamma: float, bootstrap: bool, kind: str = "normal"
) -> Case:
    n, _ = _layout(gen)
    mask = make_mask(gen, n, k)
    kwargs: Kwargs = {"rewards": make_rewards(gen, (n, k), kind), "mask": mask, "gamma": gamma}
    if bootstrap:
        kwargs["bootstrap"] = torch.randn(n, generator=gen, dtype=F64)
    return kwargs, mask


def case_gae(gen: torch.Generator, k: int, gamma: float, lmbda: float, bootstrap: bool) -> Case:
    n, _ = _layout(gen)
    mask = make_mask(gen, n, k)
    kwargs: Kwargs = {
        "rewards": make_rewards(gen, (n, k)),
        "values": torch.randn(n, k, generator=gen, dtype=F64),
        "mask": mask,
        "gamma": gamma,
        "lmbda": lmbda,
    }
    if bootstrap:
        kwargs["bootstrap"] = torch.randn(n, generator=gen, dtype=F64)
    return kwargs, mask


def _group_mask_or_none(gen: torch.Generator, n: int, g: int, masked: bool) -> torch.Tensor | None:
    return make_group_mask(gen, n, g) if masked else None


def _valid(mask: torch.Tensor | None, n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bool) if mask is None else mask


def case_group_relative(
    gen: torch.Generator, g: int, scale: str, unbiased: bool, masked: bool, kind: str
) -> Case:
    n, g = _layout(gen, g)
    mask = _group_mask_or_none(gen, n, g, masked)
    kwargs: Kwargs = {
        "rewards": make_rewards(gen, (n,), kind),
        "group_size": g,
        "scale": scale,
        "unbiased": unbiased,
    }
    if mask is not None:
        kwargs["mask"] = mask
    if _randint(gen, 0, 3) == 0:
        kwargs["eps"] = 0.1
    return kwargs, _valid(mask, n)


def case_group_relative_per_turn(
    gen: torch.Generator, g: int, k: int, scale: str, unbiased: bool, fallback: bool, kind: str
) -> Case:
    n, g = _layout(gen, g)
    turn_mask = make_mask(gen, n, k)
    kwargs: Kwargs = {
        "rewards": make_rewards(gen, (n, k), kind),
        "turn_mask": turn_mask,
        "group_size": g,
        "scale": scale,
        "unbiased": unbiased,
    }
    if fallback:
        kwargs["fallback"] = torch.randn(n, generator=gen, dtype=F64)
    if _randint(gen, 0, 3) == 0:
        kwargs["eps"] = 0.1
    return kwargs, turn_mask


def case_rloo(gen: torch.Generator, g: int, masked: bool, kind: str) -> Case:
    n, g = _layout(gen, g)
    mask = _group_mask_or_none(gen, n, g, masked)
    kwargs: Kwargs = {"rewards": make_rewards(gen, (n,), kind), "group_size": g}
    if mask is not None:
        kwargs["mask"] = mask
    return kwargs, _valid(mask, n)


def case_gpg(
    gen: torch.Generator, g: int, alpha: str | float, f_norm: float, masked: bool, kind: str
) -> Case:
    n, g = _layout(gen, g)
    mask = _group_mask_or_none(gen, n, g, masked)
    kwargs: Kwargs = {
        "rewards": make_rewards(gen, (n,), kind),
        "group_size": g,
        "alpha": alpha,
        "f_norm": f_norm,
    }
    if mask is not None:
        kwargs["mask"] = mask
    return kwargs, _valid(mask, n)


def case_opo(gen: torch.Generator, g: int, masked: bool, kind: str) -> Case:
    n, g = _layout(gen, g)
    mask = _group_mask_or_none(gen, n, g, masked)
    lengths = torch.randint(1, 50, (n,), generator=gen)
    kwargs: Kwargs = {"rewards": make_rewards(gen, (n,), kind), "lengths": lengths, "group_size": g}
    if mask is not None:
        kwargs["mask"] = mask
        # lengths must be > 0 only for valid samples
        kwargs["lengths"] = torch.where(mask, lengths, torch.zeros_like(lengths))
    return kwargs, _valid(mask, n)


def case_pass_at_k(
    gen: torch.Generator, g: int, scale: str, unbiased: bool, masked: bool, kind: str
) -> Case:
    n, g = _layout(gen, g)
    mask = _group_mask_or_none(gen, n, g, masked)
    kwargs: Kwargs = {
        "rewards": make_rewards(gen, (n,), kind),
        "group_size": g,
        "scale": scale,
        "unbiased": unbiased,
    }
    if mask is not None:
        kwargs["mask"] = mask
    if _randint(gen, 0, 3) == 0:
        kwargs["eps"] = 0.1
    return kwargs, _valid(mask, n)


def case_remax(gen: torch.Generator, t: int, kind: str) -> Case:
    n, _ = _layout(gen)
    mask = make_mask(gen, n, t)
    kwargs = {
        "token_rewards": make_rewards(gen, (n, t), kind),
        "mask": mask,
        "baselines": torch.randn(n, generator=gen, dtype=F64),
    }
    return kwargs, mask


def case_kl_in_reward(gen: torch.Generator, t: int, with_kl: bool, beta: float) -> Case:
    n, _ = _layout(gen)
    mask = make_mask(gen, n, t)
    kwargs: Kwargs = {"scores": make_rewards(gen, (n,)), "mask": mask, "beta": beta}
    if with_kl:
        kwargs["kl"] = torch.randn(n, t, generator=gen, dtype=F64).abs()
    return kwargs, mask


def case_reinforce_plus_plus(gen: torch.Generator, t: int, gamma: float) -> Case:
    n, _ = _layout(gen)
    mask = make_mask(gen, n, t)
    return {"token_rewards": make_rewards(gen, (n, t)), "mask": mask, "gamma": gamma}, mask


def case_reinforce_plus_plus_baseline(
    gen: torch.Generator, g: int, t: int, with_kl: bool, gamma: float, kind: str
) -> Case:
    n, g = _layout(gen, g)
    mask = make_mask(gen, n, t)
    kwargs: Kwargs = {
        "scores": make_rewards(gen, (n,), kind),
        "mask": mask,
        "group_size": g,
        "gamma": gamma,
    }
    if with_kl:
        kwargs["kl"] = torch.randn(n, t, generator=gen, dtype=F64).abs()
        kwargs["beta"] = 0.05
    return kwargs, mask


def case_dynamic_sampling_mask(gen: torch.Generator, g: int, masked: bool, kind: str) -> Case:
    n, g = _layout(gen, g)
    mask = _group_mask_or_none(gen, n, g, masked)
    kwargs: Kwargs = {"rewards": make_rewards(gen, (n,), kind), "group_size": g}
    if mask is not None:
        kwargs["mask"] = mask
    return kwargs, _valid(mask, n)


# --------------------------------------------------------------------------- stats

_STAT_SHAPES_DIMS = [
    ((7,), None),
    ((7,), 0),
    ((7,), -1),
    ((4, 5), None),
    ((4, 5), 0),
    ((4, 5), 1),
    ((4, 5), -1),
    ((3, 4, 5), None),
    ((3, 4, 5), 0),
    ((3, 4, 5), 1),
    ((3, 4, 5), 2),
    ((3, 4, 5), -2),
    ((6, 1), 1),
]
_STAT_CASES = [
    (shape, dim, keepdim)
    for shape, dim in _STAT_SHAPES_DIMS
    for keepdim in (False, True)
    if not (keepdim and dim is None)  # keepdim with dim=None is not specified
]


@pytest.mark.parametrize("name", ["masked_sum", "masked_mean", "masked_var"])
@pytest.mark.parametrize(("shape", "dim", "keepdim"), _STAT_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_masked_stats(
    name: str, shape: tuple[int, ...], dim: int | None, keepdim: bool, seed: int
) -> None:
    gen = _gen(name, shape, dim, keepdim, seed)
    kwargs, _ = case_masked_stat(gen, name, shape, dim, keepdim)
    assert_agree(name, kwargs, None)


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("shift_mean", [True, False])
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("mask_kind", ["mixed", "one_valid", "none_valid", "all_valid"])
def test_whiten(t: int, shift_mean: bool, unbiased: bool, mask_kind: str) -> None:
    gen = _gen("whiten", t, shift_mean, unbiased, mask_kind)
    assert_agree("whiten", *case_whiten(gen, t, shift_mean, unbiased, mask_kind))


# --------------------------------------------------------------------------- turns


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("reduction", ["sum", "mean", "final"])
@pytest.mark.parametrize("given_num_turns", [False, True])
@pytest.mark.parametrize("ids_kind", ["ordered", "arbitrary"])
def test_pool_to_turns(t: int, reduction: str, given_num_turns: bool, ids_kind: str) -> None:
    gen = _gen("pool_to_turns", t, reduction, given_num_turns, ids_kind)
    n, _ = _layout(gen)
    turn_ids = make_turn_ids(gen, n, t, ids_kind)
    values = torch.randn(n, t, generator=gen, dtype=F64)
    kwargs: Kwargs = {"values": values, "turn_ids": turn_ids, "reduction": reduction}
    if given_num_turns:
        kwargs["num_turns"] = int(turn_ids.max().item()) + 1 + _randint(gen, 0, 3)
    got_values, got_mask = ra.pool_to_turns(**kwargs)
    exp_values, exp_mask = reference.ref_pool_to_turns(**kwargs)
    assert got_mask.dtype == torch.bool
    assert torch.equal(got_mask, exp_mask)  # bit-exact: bool turn masks
    tol = {"reduction": t, "stages": STAGES["pool_to_turns"]}
    assert_close(got_values, exp_values, **tol, scale=_scale(kwargs, exp_values))
    _assert_zero_at_invalid((got_values,), exp_mask)


def test_pool_to_turns_without_valid_ids_has_zero_turns() -> None:
    turn_ids = torch.full((3, 4), -1, dtype=torch.int64)
    values = torch.randn(3, 4, dtype=F64)
    for fn in (ra.pool_to_turns, reference.ref_pool_to_turns):
        turn_values, turn_mask = fn(values=values, turn_ids=turn_ids)
        assert turn_values.shape == (3, 0)
        assert turn_mask.shape == (3, 0)


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("placement", ["all", "last"])
@pytest.mark.parametrize("ids_kind", ["ordered", "arbitrary"])
def test_broadcast_to_tokens(t: int, placement: str, ids_kind: str) -> None:
    gen = _gen("broadcast_to_tokens", t, placement, ids_kind)
    n, _ = _layout(gen)
    turn_ids = make_turn_ids(gen, n, t, ids_kind)
    k = max(int(turn_ids.max().item()) + 1, 1) + _randint(gen, 0, 3)
    kwargs = {
        "turn_values": torch.randn(n, k, generator=gen, dtype=F64),
        "turn_ids": turn_ids,
        "placement": placement,
    }
    assert_agree("broadcast_to_tokens", kwargs, turn_ids >= 0)


# --------------------------------------------------------------------------- returns / GAE


@pytest.mark.parametrize("k", LENGTHS)
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("bootstrap", [False, True])
@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize("gap", GAPS)
def test_discounted_returns(k: int, gamma: float, bootstrap: bool, kind: str, gap: str) -> None:
    gen = _gen("discounted_returns", k, gamma, bootstrap, kind)
    kwargs, valid = case_discounted_returns(gen, k, gamma, bootstrap, kind)
    assert_agree("discounted_returns", _with_gap(kwargs, gap), valid)


@pytest.mark.parametrize("k", LENGTHS)
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("mask_kind", ["mixed", "one_valid", "none_valid", "all_valid"])
@pytest.mark.parametrize("eps", [1e-8, 0.5])
def test_rebn(k: int, unbiased: bool, mask_kind: str, eps: float) -> None:
    gen = _gen("rebn", k, unbiased, mask_kind, eps)
    assert_agree("rebn", *case_rebn(gen, k, unbiased, mask_kind, eps))


@pytest.mark.parametrize("k", LENGTHS)
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("lmbda", LMBDAS)
@pytest.mark.parametrize("bootstrap", [False, True])
@pytest.mark.parametrize("gap", GAPS)
def test_gae(k: int, gamma: float, lmbda: float, bootstrap: bool, gap: str) -> None:
    gen = _gen("gae", k, gamma, lmbda, bootstrap)
    kwargs, valid = case_gae(gen, k, gamma, lmbda, bootstrap)
    assert_agree("gae", _with_gap(kwargs, gap), valid)


# --------------------------------------------------------------------------- group-relative


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_group_relative(g: int, scale: str, unbiased: bool, masked: bool, kind: str) -> None:
    gen = _gen("group_relative", g, scale, unbiased, masked, kind)
    assert_agree("group_relative", *case_group_relative(gen, g, scale, unbiased, masked, kind))


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("k", LENGTHS)
@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("fallback", [False, True])
def test_group_relative_per_turn(
    g: int, k: int, scale: str, unbiased: bool, fallback: bool
) -> None:
    kind = REWARD_KINDS[(g + k) % 3]
    gen = _gen("group_relative_per_turn", g, k, scale, unbiased, fallback)
    case = case_group_relative_per_turn(gen, g, k, scale, unbiased, fallback, kind)
    assert_agree("group_relative_per_turn", *case)


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", REWARD_KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_rloo(g: int, masked: bool, kind: str, seed: int) -> None:
    gen = _gen("rloo", g, masked, kind, seed)
    assert_agree("rloo", *case_rloo(gen, g, masked, kind))


_GPG_CONFIGS = [
    (alpha, f_norm, masked)
    for alpha in ("valid_groups", "nonzero_rewards", 0.7)
    for f_norm in (1.0, 3.0)
    for masked in (False, True)
    # with a mask, the N of "nonzero_rewards" (all rows or valid rows?) is not pinned down
    if not (alpha == "nonzero_rewards" and masked)
]


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize(("alpha", "f_norm", "masked"), _GPG_CONFIGS)
@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_gpg(g: int, alpha: str | float, f_norm: float, masked: bool, kind: str) -> None:
    gen = _gen("gpg", g, alpha, f_norm, masked, kind)
    assert_agree("gpg", *case_gpg(gen, g, alpha, f_norm, masked, kind))


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", REWARD_KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_opo(g: int, masked: bool, kind: str, seed: int) -> None:
    gen = _gen("opo", g, masked, kind, seed)
    assert_agree("opo", *case_opo(gen, g, masked, kind))


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_pass_at_k(g: int, scale: str, unbiased: bool, masked: bool, kind: str) -> None:
    gen = _gen("pass_at_k", g, scale, unbiased, masked, kind)
    assert_agree("pass_at_k", *case_pass_at_k(gen, g, scale, unbiased, masked, kind))


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_remax(t: int, kind: str) -> None:
    gen = _gen("remax", t, kind)
    assert_agree("remax", *case_remax(gen, t, kind))


# --------------------------------------------------------------------------- REINFORCE++


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("with_kl", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_kl_in_reward(t: int, with_kl: bool, beta: float) -> None:
    gen = _gen("kl_in_reward", t, with_kl, beta)
    assert_agree("kl_in_reward", *case_kl_in_reward(gen, t, with_kl, beta))


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gap", GAPS)
def test_reinforce_plus_plus(t: int, gamma: float, seed: int, gap: str) -> None:
    gen = _gen("reinforce_plus_plus", t, gamma, seed)
    kwargs, valid = case_reinforce_plus_plus(gen, t, gamma)
    assert_agree("reinforce_plus_plus", _with_gap(kwargs, gap), valid)


@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize(("unbiased", "eps"), [(False, 0.0), (False, 1e-8), (True, 0.0)])
def test_reinforce_plus_plus_whitening(t: int, unbiased: bool, eps: float) -> None:
    gen = _gen("reinforce_plus_plus_whitening", t, unbiased, eps)
    kwargs, mask = case_reinforce_plus_plus(gen, t, 1.0)
    assert_agree("reinforce_plus_plus", {**kwargs, "unbiased": unbiased, "eps": eps}, mask)
    kwargs, mask = case_reinforce_plus_plus_baseline(gen, 4, t, True, 1.0, "binary")
    assert_agree("reinforce_plus_plus_baseline", {**kwargs, "unbiased": unbiased, "eps": eps}, mask)


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("t", LENGTHS)
@pytest.mark.parametrize("with_kl", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_reinforce_plus_plus_baseline(g: int, t: int, with_kl: bool, gamma: float) -> None:
    kind = REWARD_KINDS[(g + t) % 3]
    gen = _gen("reinforce_plus_plus_baseline", g, t, with_kl, gamma)
    case = case_reinforce_plus_plus_baseline(gen, g, t, with_kl, gamma, kind)
    assert_agree("reinforce_plus_plus_baseline", *case)


# --------------------------------------------------------------------------- shaping


@pytest.mark.parametrize(
    ("max_length", "buffer_length", "penalty_factor"),
    [(20, 5, 1.0), (20, 1, 0.5), (20, 20, 2.0), (16, 4, 1.0), (30, 7, 0.3)],
)
def test_overlong_penalty(max_length: int, buffer_length: int, penalty_factor: float) -> None:
    lengths = torch.arange(0, 45, dtype=torch.int64)
    kwargs = {
        "lengths": lengths,
        "max_length": max_length,
        "buffer_length": buffer_length,
        "penalty_factor": penalty_factor,
    }
    got = ra.overlong_penalty(**kwargs)
    assert got.is_floating_point()
    assert got.shape == lengths.shape
    # the output dtype for integer lengths is not pinned down by the spec: compare values only
    assert_close(got, reference.ref_overlong_penalty(**kwargs))  # elementwise


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_dynamic_sampling_mask(g: int, masked: bool, kind: str) -> None:
    gen = _gen("dynamic_sampling_mask", g, masked, kind)
    kwargs, valid = case_dynamic_sampling_mask(gen, g, masked, kind)
    got = ra.dynamic_sampling_mask(**kwargs)
    assert got.dtype == torch.bool
    assert got.shape == valid.shape
    # valid positions only: the spec says both "True for every member of a kept group" and
    # "outputs are 0 at invalid positions", so an invalid member of a kept group is unpinned
    # bit-exact: bool masks
    assert torch.equal(got[valid], reference.ref_dynamic_sampling_mask(**kwargs)[valid])


# --------------------------------------------------------------------------- float32


def _cast(kwargs: Kwargs, dtype: torch.dtype) -> Kwargs:
    return {
        k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in kwargs.items()
    }


_FLOAT32_BUILDERS: dict[str, Callable[[torch.Generator], Case]] = {
    "masked_sum": lambda gen: case_masked_stat(gen, "masked_sum", (4, 5), 1, False),
    "masked_mean": lambda gen: case_masked_stat(gen, "masked_mean", (4, 5), 0, False),
    "masked_var": lambda gen: case_masked_stat(gen, "masked_var", (4, 5), -1, True),
    "whiten": lambda gen: case_whiten(gen, 5, True, True, "mixed"),
    "rebn": lambda gen: case_rebn(gen, 5, True, "mixed", 1e-8),
    "discounted_returns": lambda gen: case_discounted_returns(gen, 5, 0.99, True),
    "gae": lambda gen: case_gae(gen, 5, 0.99, 0.95, True),
    "group_relative": lambda gen: case_group_relative(gen, 4, "group", True, True, "normal"),
    "group_relative_per_turn": lambda gen: case_group_relative_per_turn(
        gen, 3, 5, "group", True, True, "normal"
    ),
    "rloo": lambda gen: case_rloo(gen, 4, True, "normal"),
    "gpg": lambda gen: case_gpg(gen, 4, "valid_groups", 1.0, True, "binary"),
    "opo": lambda gen: case_opo(gen, 3, True, "normal"),
    "pass_at_k": lambda gen: case_pass_at_k(gen, 4, "group", True, True, "normal"),
    "remax": lambda gen: case_remax(gen, 5, "normal"),
    "kl_in_reward": lambda gen: case_kl_in_reward(gen, 5, True, 0.1),
    "reinforce_plus_plus": lambda gen: case_reinforce_plus_plus(gen, 5, 1.0),
    "reinforce_plus_plus_baseline": lambda gen: case_reinforce_plus_plus_baseline(
        gen, 4, 5, True, 1.0, "binary"
    ),
}


@pytest.mark.parametrize("name", sorted(_FLOAT32_BUILDERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_in_float32_out(name: str, seed: int) -> None:
    kwargs64, valid = _FLOAT32_BUILDERS[name](_gen("float32", name, seed))
    kwargs32 = _cast(kwargs64, torch.float32)
    got = _as_tuple(getattr(ra, name)(**kwargs32))
    for out in got:
        assert out.dtype == torch.float32, f"{name}: {out.dtype}"
    _assert_zero_at_invalid(got, valid)
    expected = _as_tuple(getattr(reference, f"ref_{name}")(**_cast(kwargs32, F64)))
    for g, e in zip(got, expected, strict=True):  # float32 against the float64 reference
        tol = {"reduction": _reduction(kwargs32), "stages": STAGES[name]}
        assert_close(g, e, **tol, scale=_scale(kwargs32, e), msg=name)


def test_float32_pool_and_broadcast() -> None:
    gen = _gen("float32 turns")
    turn_ids = make_turn_ids(gen, 6, 9, "ordered")
    values = torch.randn(6, 9, generator=gen)
    for reduction in ("sum", "mean", "final"):
        turn_values, turn_mask = ra.pool_to_turns(
            values=values, turn_ids=turn_ids, reduction=reduction
        )
        assert turn_values.dtype == torch.float32
        assert turn_mask.dtype == torch.bool
        _assert_zero_at_invalid((turn_values,), turn_mask)
    k = int(turn_ids.max().item()) + 1
    for placement in ("all", "last"):
        out = ra.broadcast_to_tokens(
            turn_values=torch.randn(6, k, generator=gen), turn_ids=turn_ids, placement=placement
        )
        assert out.dtype == torch.float32
        _assert_zero_at_invalid((out,), turn_ids >= 0)
