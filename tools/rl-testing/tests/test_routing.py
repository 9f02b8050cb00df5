"""rl_testing.routing: the routes check fails on a wrong clear route and on too many ties."""

from __future__ import annotations

import pytest
import torch
from rl_testing.routing import assert_own_top_k, tie_gap
from rl_testing.tolerance import rtol


def _logits() -> list[torch.Tensor]:
    # 2 layers, 3 positions, 4 experts; softmax order: layer 0 -> {3, 2}, layer 1 -> {0, 1}
    layer0 = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3)
    layer1 = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    return [layer0, layer1]


def _routes() -> torch.Tensor:
    routes = torch.empty(3, 2, 2, dtype=torch.int16)  # [S, Y, k]
    routes[:, 0] = torch.tensor([2, 3], dtype=torch.int16)  # any order within the k
    routes[:, 1] = torch.tensor([1, 0], dtype=torch.int16)
    return routes


def test_the_own_top_k_passes_and_counts_every_position_that_ran() -> None:
    routes = _routes()
    routes[2, 1] = -1  # no forward ran there: not checked
    assert assert_own_top_k(routes, _logits(), gap=1e-4) == (5, 5)


def test_a_clear_wrong_route_fails_with_its_layer_and_position() -> None:
    routes = _routes()
    routes[1, 1] = torch.tensor([0, 2], dtype=torch.int16)
    with pytest.raises(AssertionError, match=r"layer 1, position \[1\].*\[0, 2\].*\[0, 1\]"):
        assert_own_top_k(routes, _logits(), gap=1e-4)


def test_a_near_tie_may_go_either_way_but_ties_everywhere_check_nothing() -> None:
    logits = _logits()
    logits[1][0] = torch.tensor([3.0, 2.0, 2.0 + 1e-6, 0.0])  # 2nd and 3rd nearly tie
    routes = _routes()
    routes[0, 1] = torch.tensor([0, 2], dtype=torch.int16)
    assert assert_own_top_k(routes, logits, gap=1e-4, coverage=0.8) == (5, 6)
    with pytest.raises(AssertionError, match=r"only 5 of 6 routed positions"):
        assert_own_top_k(routes, logits, gap=1e-4)  # 5/6 < the default 0.9


def test_the_tie_gap_is_the_float32_tolerance_of_the_layers_before_the_router() -> None:
    assert tie_gap(64, 2) == rtol(torch.float32, reduction=64, stages=8)
