"""Property tests of the invariants promised by rl_testing.strategies."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from rl_testing.strategies import (
    group_layouts,
    grouped_rewards,
    mask_batches,
    masks,
    rewards,
    turn_batches,
    turn_ids_for,
)

SETTINGS = settings(max_examples=50, deadline=None)


def _is_prefix(row: list[bool]) -> bool:
    length = sum(row)
    return row == [True] * length + [False] * (len(row) - length)


def draw_one(strategy: st.SearchStrategy[object]) -> object:
    return find(strategy, lambda _: True)


def check_turn_ids(mask: torch.Tensor, ids: torch.Tensor, max_turns: int | None) -> None:
    assert ids.dtype == torch.int64
    assert ids.shape == mask.shape
    assert torch.equal(ids == -1, ~mask)  # bit-exact: bool masks
    for row_mask, row_ids in zip(mask.tolist(), ids.tolist(), strict=True):
        prev_pos, prev_id = -1, -1
        for pos, (valid, turn) in enumerate(zip(row_mask, row_ids, strict=True)):
            if not valid:
                continue
            if prev_pos < 0:
                assert turn == 0  # first counted token opens turn 0
            elif pos > prev_pos + 1:
                assert turn == prev_id + 1  # a gap (masked-out tokens) always ends a turn
            else:
                assert turn in (prev_id, prev_id + 1)  # contiguous: same turn or the next
            prev_pos, prev_id = pos, turn
        if max_turns is not None:
            assert prev_id + 1 <= max_turns


@SETTINGS
@given(group_layouts(max_b=5, max_g=3))
def test_group_layouts_bounds(layout: tuple[int, int]) -> None:
    B, G = layout
    assert 1 <= B <= 5
    assert 1 <= G <= 3


@SETTINGS
@given(group_layouts(max_b=2, max_g=4, min_g=2))
def test_group_layouts_min_g(layout: tuple[int, int]) -> None:
    assert 2 <= layout[1] <= 4


@SETTINGS
@given(st.data(), st.integers(0, 5), st.integers(1, 9), st.booleans())
def test_masks_right_padded(data: st.DataObject, n: int, t: int, allow_empty: bool) -> None:
    mask = data.draw(masks(n, t, allow_empty_rows=allow_empty))
    assert mask.dtype == torch.bool
    assert mask.shape == (n, t)
    for row in mask.tolist():
        assert _is_prefix(row)
        assert allow_empty or any(row)


@SETTINGS
@given(st.data(), st.integers(0, 5), st.integers(1, 9), st.booleans())
def test_masks_arbitrary(data: st.DataObject, n: int, t: int, allow_empty: bool) -> None:
    mask = data.draw(masks(n, t, allow_empty_rows=allow_empty, right_padded=False))
    assert mask.dtype == torch.bool
    assert mask.shape == (n, t)
    if not allow_empty:
        assert bool(mask.any(dim=1).all())


def test_masks_reach_empty_rows_and_holes() -> None:
    empty = find(masks(3, 4, allow_empty_rows=True), lambda m: bool((~m.any(dim=1)).any()))
    assert not bool(empty.any(dim=1).all())
    holes = find(masks(2, 5, right_padded=False), lambda m: not all(map(_is_prefix, m.tolist())))
    assert bool(holes.any(dim=1).all())


def test_mask_batches_shrink_to_minimal_example() -> None:
    # Built from lists, so hypothesis shrinks to the smallest mask with 3 rows: 3 x 1, all True.
    found = find(mask_batches(), lambda m: m.shape[0] >= 3)
    assert torch.equal(found, torch.ones(3, 1, dtype=torch.bool))  # bit-exact: bool masks


@SETTINGS
@given(mask_batches(max_n=4, max_t=7, min_n=2, min_t=3))
def test_mask_batches_bounds(mask: torch.Tensor) -> None:
    n, t = mask.shape
    assert 2 <= n <= 4
    assert 3 <= t <= 7
    assert all(_is_prefix(row) and any(row) for row in mask.tolist())


@SETTINGS
@given(mask_batches(max_n=4, max_t=7, right_padded=False, allow_empty_rows=True))
def test_mask_batches_arbitrary(mask: torch.Tensor) -> None:
    assert mask.dtype == torch.bool
    assert 1 <= mask.shape[0] <= 4


@SETTINGS
@given(
    st.data(),
    st.lists(st.integers(0, 4), min_size=0, max_size=3),
    st.sampled_from([torch.float64, torch.float32, torch.bfloat16]),
)
def test_rewards(data: st.DataObject, shape: list[int], dtype: torch.dtype) -> None:
    r = data.draw(rewards(shape, min_value=-2.5, max_value=7.0, dtype=dtype))
    assert r.shape == tuple(shape)
    assert r.dtype == dtype
    assert bool(torch.isfinite(r).all())
    assert bool((r >= -2.5).all())
    assert bool((r <= 7.0).all())


@SETTINGS
@given(rewards(6))
def test_rewards_defaults(r: torch.Tensor) -> None:
    assert r.shape == (6,)
    assert r.dtype == torch.float64
    assert bool((r.abs() <= 10).all())


@SETTINGS
@given(grouped_rewards(max_b=3, max_g=4, min_g=2, values=(0.0, 1.0)))
def test_grouped_rewards_binary(sample: tuple[int, int, torch.Tensor]) -> None:
    B, G, r = sample
    assert 1 <= B <= 3
    assert 2 <= G <= 4
    assert r.shape == (B * G,)
    assert set(r.tolist()) <= {0.0, 1.0}
    assert r.view(B, G).shape == (B, G)


@SETTINGS
@given(st.data(), mask_batches(max_n=4, max_t=10, right_padded=False, allow_empty_rows=True))
def test_turn_ids_for_unbounded(data: st.DataObject, mask: torch.Tensor) -> None:
    ids = data.draw(turn_ids_for(mask))
    check_turn_ids(mask, ids, None)


@SETTINGS
@given(st.data(), mask_batches(max_n=4, max_t=10))
def test_turn_ids_for_right_padded(data: st.DataObject, mask: torch.Tensor) -> None:
    ids = data.draw(turn_ids_for(mask, max_turns=3))
    check_turn_ids(mask, ids, 3)


@SETTINGS
@given(turn_batches(max_n=5, max_t=12, max_turns=3))
def test_turn_batches(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    mask, ids = batch
    assert mask.dtype == torch.bool
    assert bool(mask.any(dim=1).all())
    check_turn_ids(mask, ids, 3)


@SETTINGS
@given(turn_batches(max_n=3, max_t=8, max_turns=1, allow_empty_rows=True))
def test_turn_batches_single_turn(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    mask, ids = batch
    check_turn_ids(mask, ids, 1)
    assert set(ids.flatten().tolist()) <= {-1, 0}


@SETTINGS
@given(turn_batches(max_n=3, max_t=8, max_turns=4, right_padded=True))
def test_turn_batches_right_padded(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    mask, ids = batch
    assert all(_is_prefix(row) for row in mask.tolist())
    check_turn_ids(mask, ids, 4)


def test_turn_batches_reach_gaps_and_splits() -> None:
    def has_gap_between_turns(batch: tuple[torch.Tensor, torch.Tensor]) -> bool:
        mask, ids = batch
        return any(
            0 in row and 1 in row and not all(m[row.index(0) : row.index(1)])
            for row, m in zip(ids.tolist(), mask.tolist(), strict=True)
        )

    def has_split_run(batch: tuple[torch.Tensor, torch.Tensor]) -> bool:
        _mask, ids = batch
        return any(a >= 0 and b == a + 1 for row in ids.tolist() for a, b in pairwise(row))

    gap = find(turn_batches(), has_gap_between_turns)
    split = find(turn_batches(), has_split_run)
    check_turn_ids(*gap, 3)
    check_turn_ids(*split, 3)


def test_turn_ids_for_too_many_runs_raises() -> None:
    mask = torch.tensor([[True, False, True, False, True]])
    with pytest.raises(InvalidArgument):
        draw_one(turn_ids_for(mask, max_turns=2))


@pytest.mark.parametrize(
    "make",
    [
        lambda: group_layouts(max_b=0),
        lambda: group_layouts(max_g=2, min_g=3),
        lambda: masks(2, 0),
        lambda: masks(-1, 3),
        lambda: mask_batches(min_t=0),
        lambda: rewards(3, min_value=1.0, max_value=0.0),
        lambda: rewards(3, dtype=torch.int64),
        lambda: rewards(3, values=()),
        lambda: turn_ids_for(torch.ones(2, 3), max_turns=2),
        lambda: turn_batches(max_turns=0),
    ],
)
def test_invalid_arguments(make: Callable[[], st.SearchStrategy[object]]) -> None:
    with pytest.raises(InvalidArgument):
        draw_one(make())
