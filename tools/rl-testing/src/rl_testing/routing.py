"""Check recorded mixture-of-experts routes against a model's own top-k (torch only).

Two forwards of the same tokens in different layouts (padded or packed rows, a cached decode
step or a full sequence) round the router's logits differently, so a token whose ``k``-th and
``(k+1)``-th expert nearly tie may be routed either way by either; every other token must be
routed alike. :func:`assert_own_top_k` checks that, and that the near ties are rare (so the
check cannot pass by excluding everything).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_testing.tolerance import rtol


def tie_gap(hidden_size: int, layers: int) -> float:
    """The router-probability gap under which two experts count as tied: float32 rounding of
    the ``layers`` decoder layers' chained reductions over ``hidden_size`` (four per layer:
    attention, its output, the experts' up and down projections) before the router's logits,
    by :func:`rl_testing.tolerance.rtol`. The probabilities lie in [0, 1], so the relative
    tolerance bounds their absolute difference.
    """  # noqa: D205
    return rtol(torch.float32, reduction=hidden_size, stages=4 * max(layers, 1))


def assert_own_top_k(
    routes: torch.Tensor,
    router_logits: Sequence[torch.Tensor],
    *,
    gap: float,
    coverage: float = 0.9,
) -> tuple[int, int]:
    """Assert that ``routes`` are the top-k of ``router_logits`` wherever the choice is clear.

    Args:
        routes: ``[..., Y, k]`` integer expert indices of ``Y`` layers, ``-1`` at positions no
            forward ran on (not checked).
        router_logits: ``Y`` tensors ``[S, E]`` (one per layer, as transformers returns them
            with ``output_router_logits=True``), ``S`` the number of positions of ``routes``'s
            leading shape.
        gap: a position whose ``k``-th and ``(k+1)``-th router probability differ by at most
            ``gap`` is a near tie and not checked (:func:`tie_gap`).
        coverage: the least fraction of the positions that ran which must be checked.

    Returns:
        ``(checked, ran)``: positions times layers compared, and those that ran.
    """
    *lead, layers, k = routes.shape
    if len(router_logits) != layers:
        raise ValueError(f"routes has {layers} layers, router_logits {len(router_logits)}")
    checked = ran_total = 0
    for y, logits in enumerate(router_logits):
        probs = torch.softmax(logits.float(), dim=-1).reshape(*lead, -1)
        top = probs.sort(dim=-1, descending=True).values
        clear = (top[..., k - 1] - top[..., k]) > gap
        theirs = torch.topk(probs, k, dim=-1).indices.sort(dim=-1).values
        ours = routes[..., y, :].long().sort(dim=-1).values
        ran = (routes[..., y, :] >= 0).all(dim=-1)
        wrong = ~(ours == theirs).all(dim=-1) & clear & ran
        if bool(wrong.any()):
            where = wrong.nonzero()[0].tolist()
            raise AssertionError(
                f"layer {y}, position {where}: recorded experts {ours[tuple(where)].tolist()}, "
                f"the model's own top-{k} {theirs[tuple(where)].tolist()} "
                f"(probabilities {top[tuple(where)][: k + 1].tolist()})"
            )
        checked += int((clear & ran).sum())
        ran_total += int(ran.sum())
    if ran_total == 0 or checked < coverage * ran_total:
        raise AssertionError(
            f"only {checked} of {ran_total} routed positions had a clear top-{k} "
            f"(gap > {gap:.2e}); at least {coverage:.0%} must, or the check checks nothing"
        )
    return checked, ran_total
