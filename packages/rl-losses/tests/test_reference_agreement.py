"""Implementation vs the float64 loop references in ``ref_losses.py`` on seeded random inputs.

Shapes N in {1, 2, 5}, T in {1, 3, 8}; masks cycle through empty rows, a single valid token, a
valid prefix, holes and full rows; turn ids have several turns per row, cuts inside runs and
skipped ids. Log-ratios are moderate (old = lp + 0.3 * noise) so some units are clipped and some
not. Invalid positions hold finite garbage (NaN / 1e9 masking lives in test_properties.py).

Loss values AND gradients w.r.t. ``logprobs`` (``values`` for value_loss, ``loss`` for aggregate,
``entropies`` for entropy_bonus) must agree to rtol = atol = 1e-10, as must the diagnostics the
spec defines (compared when at least one token is valid).
"""

from __future__ import annotations

from typing import Any

import losses_testlib as lib
import pytest
import ref_losses as ref
import rl_losses as rl
import torch
from losses_testlib import AGGREGATIONS, DIAG, F64, RATIO_DIAG, close, grad_of
from rl_testing import tolerance

SHAPES = [(n, t) for n in (1, 2, 5) for t in (1, 3, 8)]
LEVELS = ("token", "turn", "trajectory")
POOLINGS = ("sum", "mean")


# --------------------------------------------------------------------------- checking


def check_policy(
    name: str,
    kwargs: dict[str, Any],
    diag_keys: tuple[str, ...],
    ref_extra: dict[str, Any] | None = None,
) -> Any:
    lp = kwargs["logprobs"]
    got = getattr(rl, name)(**kwargs)
    expected = getattr(ref, f"ref_{name}")(**kwargs, **(ref_extra or {}))
    where = f"{name} { ({k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}) }"
    lib.check_scalar_output(got.loss, "loss")
    close(got.loss, expected.loss, f"loss of {where}")
    close(grad_of(got.loss, lp), grad_of(expected.loss, lp), f"d loss / d logprobs of {where}")
    lib.check_diag_detached(got, DIAG)
    if bool(kwargs["mask"].any()):
        for key in diag_keys:
            close(getattr(got, key), getattr(expected, key), f"{key} of {where}")
    metrics = got.metrics()
    assert isinstance(metrics, dict)
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items()), metrics
    return got


def _shapes(*key: object) -> list[tuple[int, int]]:
    """All 9 shapes, in a seeded order."""
    g = lib.gen("shapes", *key)
    order = torch.randperm(len(SHAPES), generator=g).tolist()
    return [SHAPES[i] for i in order]


# --------------------------------------------------------------------------- policy losses with levels

# (function, specific hyperparameters, diagnostics defined by the spec)
POLICY_VARIANTS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("clipped_surrogate", {}, DIAG),
    ("clipped_surrogate", {"clip_low": 0.1, "clip_high": 0.28}, DIAG),
    ("clipped_surrogate", {"ratio_bounds": (0.75, 1.4)}, DIAG),
    ("clipped_surrogate", {"dual_clip": 1.5}, DIAG),
    ("clipped_surrogate", {"clip_low": 0.15, "delta": 1.4}, DIAG),
    ("clipped_surrogate", {"clip_high": 0.1, "dual_clip": 1.6, "delta": 1.3}, DIAG),
    ("reinforce_loss", {"form": "logprob"}, DIAG),
    ("reinforce_loss", {"form": "ratio"}, DIAG),
    ("cispo_loss", {}, DIAG),
    ("cispo_loss", {"clamp": "upper", "eps_high": 0.3}, DIAG),
    ("cispo_loss", {"clamp": "two_sided", "eps_low": 0.2, "eps_high": 0.3}, DIAG),
    # clip fractions of SAPO are not defined by the spec (no clipping): not compared
    ("sapo_loss", {}, RATIO_DIAG),
    ("sapo_loss", {"tau_pos": 0.5, "tau_neg": 2.0}, RATIO_DIAG),
]


@pytest.mark.parametrize(
    ("name", "hyper", "diag"),
    POLICY_VARIANTS,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(POLICY_VARIANTS)],
)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_policy_loss(
    name: str,
    hyper: dict[str, Any],
    diag: tuple[str, ...],
    level: str,
    pooling: str,
    aggregation: str,
) -> None:
    for n, t in _shapes(name, level, pooling, aggregation):
        g = lib.gen(name, repr(hyper), level, pooling, aggregation, n, t)
        inputs = lib.make_policy_inputs(g, n, t)
        turn_ids = inputs.pop("turn_ids")
        if level == "turn" and int(turn_ids.max()) < 0:
            continue  # U = 0: test_turn_level_without_any_turn
        u = {"token": t, "trajectory": 1}.get(level, int(turn_ids.max()) + 1)
        kwargs = inputs | hyper | lib.agg_kwargs(g, aggregation, u)
        kwargs |= {"level": level, "pooling": pooling}
        if level == "turn":
            kwargs["turn_ids"] = turn_ids
        check_policy(name, kwargs, diag)


# --------------------------------------------------------------------------- sequence-level objectives

GSPO_CLIPS = [{}, {"clip_low": 0.2, "clip_high": 0.3}]


@pytest.mark.parametrize("gradient", ["sequence", "token"])
@pytest.mark.parametrize("clips", GSPO_CLIPS, ids=["default", "wide"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo(gradient: str, clips: dict[str, float], aggregation: str) -> None:
    # token mode: what a "unit" of the diagnostics is, is not defined -> not compared
    diag = DIAG if gradient == "sequence" else ()
    for n, t in SHAPES:
        g = lib.gen("gspo", gradient, repr(clips), aggregation, n, t)
        inputs = lib.make_policy_inputs(g, n, t, noise=0.1)
        inputs.pop("turn_ids")
        u = 1 if gradient == "sequence" else t
        kwargs = inputs | clips | lib.agg_kwargs(g, aggregation, u) | {"gradient": gradient}
        check_policy("gspo_loss", kwargs, diag)


@pytest.mark.parametrize("clips", [{}, {"clip_low": 0.1, "clip_high": 0.2}], ids=["d", "tight"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gmpo(clips: dict[str, float], aggregation: str) -> None:
    # GMPO diagnostics are not defined by the spec -> not compared
    for n, t in SHAPES:
        g = lib.gen("gmpo", repr(clips), aggregation, n, t)
        inputs = lib.make_policy_inputs(g, n, t, noise=0.3)
        inputs.pop("turn_ids")
        kwargs = inputs | clips | lib.agg_kwargs(g, aggregation, 1)
        check_policy("gmpo_loss", kwargs, ())


# --------------------------------------------------------------------------- covariance objectives


@pytest.mark.parametrize("ratio", [2e-3, 0.25, 1.0])
@pytest.mark.parametrize("kl_coef", [1.0, 0.5])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_kl_cov(ratio: float, kl_coef: float, aggregation: str) -> None:
    for n, t in SHAPES:
        g = lib.gen("kl_cov", ratio, kl_coef, aggregation, n, t)
        # per-token advantages: with one advantage per row, a single row has cov = 0 everywhere
        # and the top-k choice is a tie
        inputs = lib.make_policy_inputs(g, n, t, adv_per_seq=False)
        inputs.pop("turn_ids")
        kwargs = inputs | lib.agg_kwargs(g, aggregation, t)
        kwargs |= {"kl_cov_ratio": ratio, "kl_coef": kl_coef}
        check_policy("kl_cov_loss", kwargs, RATIO_DIAG)


CLIP_COV_BOUNDS = [{}, {"clip_cov_lb": 0.1, "clip_cov_ub": 2.0}, {"clip_cov_lb": -0.5}]


def _clip_cov_inputs(g: torch.Generator, n: int, t: int) -> dict[str, Any]:
    inputs = lib.make_policy_inputs(g, n, t, adv_per_seq=False)
    inputs.pop("turn_ids")
    inputs["advantages"] = inputs["advantages"] * 3.0  # spread covariances over (lb, ub)
    return inputs


@pytest.mark.parametrize("bounds", CLIP_COV_BOUNDS, ids=["default", "narrow", "low_lb"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_clip_cov_every_candidate_chosen(bounds: dict[str, float], aggregation: str) -> None:
    """clip_cov_ratio = 1 -> k = n_valid >= #candidates: every candidate is detached
    (deterministic)."""
    n_cands = 0
    for n, t in SHAPES:
        g = lib.gen("clip_cov", repr(bounds), aggregation, n, t)
        inputs = _clip_cov_inputs(g, n, t)
        kwargs = inputs | bounds | lib.agg_kwargs(g, aggregation, t) | {"clip_cov_ratio": 1.0}
        kwargs["generator"] = torch.Generator().manual_seed(0)
        cands, _ = ref.ref_clip_cov_candidates(
            inputs["logprobs"],
            inputs["advantages"],
            inputs["mask"],
            1.0,
            bounds.get("clip_cov_lb", 1.0),
            bounds.get("clip_cov_ub", 5.0),
        )
        n_cands += len(cands)
        ref_kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        got = rl.clip_cov_loss(**kwargs)
        expected = ref.ref_clip_cov_loss(**ref_kwargs)
        lp = inputs["logprobs"]
        close(got.loss, expected.loss)
        close(grad_of(got.loss, lp), grad_of(expected.loss, lp))
        if bool(inputs["mask"].any()):
            for key in RATIO_DIAG:
                close(getattr(got, key), getattr(expected, key), key)
    assert n_cands > 0  # the test exercises detached tokens


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ratio", [0.05, 0.2])
def test_clip_cov_random_choice(seed: int, ratio: float) -> None:
    """k < #candidates: the value is the PPO value; exactly min(k, #cand) candidates lose their
    gradient (where it was non-zero), every other token keeps the PPO gradient; the result is the
    reference with that chosen set; the same generator seed gives the same choice."""
    n, t = 5, 8
    g = lib.gen("clip_cov_random", seed, ratio)
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[0, 5:] = False
    mask[3, :2] = False
    inputs = lib.make_policy_inputs(g, n, t, mask=mask, adv_per_seq=False)
    inputs.pop("turn_ids")
    inputs["advantages"] = inputs["advantages"] * 3.0
    bounds = {"clip_cov_lb": 0.05, "clip_cov_ub": 50.0}
    kwargs = inputs | bounds | {"clip_cov_ratio": ratio}
    lp = inputs["logprobs"]
    cands, k = ref.ref_clip_cov_candidates(
        lp, inputs["advantages"], inputs["mask"], ratio, 0.05, 50.0
    )
    assert k < len(cands), (k, len(cands))
    got = rl.clip_cov_loss(**kwargs, generator=torch.Generator().manual_seed(seed))
    again = rl.clip_cov_loss(**kwargs, generator=torch.Generator().manual_seed(seed))
    ppo = ref.ref_clipped_surrogate(
        **{key: v for key, v in kwargs.items() if not key.startswith("clip_cov")}
    )
    close(got.loss, ppo.loss)
    g_got, g_ppo = grad_of(got.loss, lp), grad_of(ppo.loss, lp)
    close(g_got, grad_of(again.loss, lp))
    zeroed = {(i, s) for (i, s) in cands if g_got[i, s] == 0}
    r = tolerance.rtol(F64, **lib.LOSS_TOL)  # what lib.close allows (scale 1)
    changed = {
        (i, s)
        for i in range(n)
        for s in range(t)
        if not torch.isclose(g_got[i, s], g_ppo[i, s], rtol=r, atol=r)
    }
    assert changed <= zeroed, (changed, zeroed)  # only candidates change, and to exactly 0
    assert len(changed) <= k
    assert len(zeroed) >= k  # at least k candidates are detached
    expected = ref.ref_clip_cov_loss(**kwargs, chosen=zeroed)
    close(g_got, grad_of(expected.loss, lp))


# --------------------------------------------------------------------------- aggregate / units


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("normalizer", [None, 4.0, "tensor"])
@pytest.mark.parametrize("max_length", [None, 11])
def test_aggregate(mode: str, normalizer: Any, max_length: int | None) -> None:
    for n, t in [*SHAPES, (4, 5)]:
        g = lib.gen("aggregate", mode, repr(normalizer), max_length, n, t)
        mask = lib.make_mask(g, n, t)
        if (n, t) == (4, 5):
            mask[:] = False  # nothing valid: 0 with zero gradient
        loss = torch.where(mask, torch.randn(n, t, generator=g, dtype=F64), lib.garbage(g, (n, t)))
        loss.requires_grad_(True)
        kwargs: dict[str, Any] = {"loss": loss, "mask": mask, "mode": mode}
        if normalizer is not None:
            kwargs["normalizer"] = (
                torch.tensor(2.5, dtype=F64) if normalizer == "tensor" else normalizer
            )
        if max_length is not None:
            kwargs["max_length"] = max_length
        got = rl.aggregate(**kwargs)
        expected = ref.ref_aggregate(**kwargs)
        lib.check_scalar_output(got, "aggregate")
        close(got, expected)
        g_got = grad_of(got, loss)
        close(g_got, grad_of(expected, loss))
        assert bool(torch.isfinite(g_got).all())
        if normalizer is None:  # the documented per-element weights
            close(g_got, ref.aggregation_weights(mask, mode, None, max_length))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pooling", POOLINGS)
def test_to_units(level: str, pooling: str) -> None:
    for n, t in SHAPES:
        g = lib.gen("to_units", level, pooling, n, t)
        mask = lib.make_mask(g, n, t)
        turn_ids = lib.make_turn_ids(g, mask)
        x = torch.where(mask, torch.randn(n, t, generator=g, dtype=F64), lib.garbage(g, (n, t)))
        x.requires_grad_(True)
        kwargs: dict[str, Any] = {"x": x, "mask": mask, "level": level, "pooling": pooling}
        if level == "turn":
            kwargs["turn_ids"] = turn_ids
        x_u, m_u = rl.to_units(**kwargs)
        e_u, e_m = ref.ref_to_units(**kwargs)
        assert m_u.dtype == torch.bool
        assert x_u.shape == e_u.shape, (x_u.shape, e_u.shape)
        assert torch.equal(m_u, e_m), (m_u, e_m)  # bit-exact: bool unit masks
        close(torch.where(e_m, x_u, 0.0), e_u)
        # gradient of a random combination of the valid units
        c = torch.randn(e_u.shape, generator=g, dtype=F64)
        close(
            grad_of((torch.where(e_m, x_u, 0.0) * c).sum(), x),
            grad_of((e_u * c).sum(), x),
        )


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_zero_units(mode: str) -> None:
    """U = 0 (e.g. level "turn" with every turn id -1): nothing valid -> 0, never an error."""
    loss = torch.zeros(3, 0, dtype=F64, requires_grad=True)
    out = rl.aggregate(loss, torch.zeros(3, 0, dtype=torch.bool), mode)
    close(out, 0.0)
    close(ref.ref_aggregate(loss, torch.zeros(3, 0, dtype=torch.bool), mode), 0.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_turn_level_without_any_turn(aggregation: str) -> None:
    """Every turn id -1 -> K = 0 units: nothing valid, loss 0 with zero gradient."""
    g = lib.gen("no_turn", aggregation)
    inputs = lib.make_policy_inputs(g, 2, 3)
    inputs["turn_ids"] = torch.full((2, 3), -1, dtype=torch.int64)
    inputs["mask"] = torch.zeros(2, 3, dtype=torch.bool)
    kwargs = inputs | {"level": "turn", "aggregation": aggregation}
    got = rl.clipped_surrogate(**kwargs)
    close(got.loss, 0.0)
    close(grad_of(got.loss, inputs["logprobs"]), torch.zeros(2, 3, dtype=F64))
    close(ref.ref_clipped_surrogate(**kwargs).loss, 0.0)
    # still on the autograd graph: backward runs and leaves zero gradients
    for unit_weight in ("unit", "tokens"):
        lp = inputs["logprobs"].detach().clone().requires_grad_(True)
        out = rl.clipped_surrogate(**(kwargs | {"logprobs": lp, "unit_weight": unit_weight}))
        assert out.loss.requires_grad, unit_weight
        out.loss.backward()
        assert lp.grad is not None
        assert not bool(lp.grad.any()), unit_weight
    x_u, m_u = rl.to_units(lp, inputs["mask"], "turn", inputs["turn_ids"])
    assert x_u.shape == m_u.shape == (2, 0)
    assert x_u.requires_grad


def test_turn_count_reads_every_turn_id() -> None:
    """U = K = max id + 1 over ALL of turn_ids (spec), also ids at invalid positions."""
    mask = torch.tensor([[True, True, False, True]])
    turn_ids = torch.tensor([[0, 0, 4, 1]])
    x = torch.tensor([[1.0, 2.0, 100.0, 4.0]], dtype=F64)
    x_u, m_u = rl.to_units(x, mask, "turn", turn_ids=turn_ids)
    e_u, e_m = ref.ref_to_units(x, mask, "turn", turn_ids=turn_ids)
    assert x_u.shape == (1, 5) == e_u.shape
    assert m_u.tolist() == e_m.tolist() == [[True, True, False, False, False]]  # bit-exact: bool
    close(x_u[m_u], e_u[e_m])


# --------------------------------------------------------------------------- value loss


@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("huber_delta", [None, 0.5])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_value_loss(clip: float | None, huber_delta: float | None, aggregation: str) -> None:
    for n, t in SHAPES:
        g = lib.gen("value", clip, huber_delta, aggregation, n, t)
        mask = lib.make_mask(g, n, t)
        values = torch.randn(n, t, generator=g, dtype=F64)
        old = values + 0.3 * torch.randn(n, t, generator=g, dtype=F64)
        returns = values + torch.randn(n, t, generator=g, dtype=F64)
        values = torch.where(mask, values, lib.garbage(g, (n, t))).requires_grad_(True)
        kwargs: dict[str, Any] = {
            "values": values,
            "old_values": torch.where(mask, old, lib.garbage(g, (n, t))),
            "returns": torch.where(mask, returns, lib.garbage(g, (n, t))),
            "mask": mask,
            "clip": clip,
            "huber_delta": huber_delta,
        } | lib.agg_kwargs(g, aggregation, t)
        got = rl.value_loss(**kwargs)
        expected = ref.ref_value_loss(**kwargs)
        lib.check_scalar_output(got.loss, "loss")
        close(got.loss, expected.loss)
        close(grad_of(got.loss, values), grad_of(expected.loss, values))
        lib.check_diag_detached(got, ("clip_frac", "value_mean", "explained_variance"))
        if bool(mask.any()):
            for key in ("clip_frac", "value_mean", "explained_variance"):
                close(getattr(got, key), getattr(expected, key), key)


# --------------------------------------------------------------------------- KL / entropy

KINDS = ("k1", "k2", "k3", "abs")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "extra",
    [{}, {"clamp": 0.1}, {"grad_kind": "k1"}, {"grad_kind": "k2"}, {"grad_kind": "k3"}],
    ids=["plain", "clamp", "st_k1", "st_k2", "st_k3"],
)
def test_kl_estimate(kind: str, extra: dict[str, Any]) -> None:
    for n, t in SHAPES:
        g = lib.gen("kl_estimate", kind, repr(extra), n, t)
        lp = (-torch.rand(n, t, generator=g, dtype=F64) * 3.0).requires_grad_(True)
        ref_lp = (lp.detach() + 0.5 * torch.randn(n, t, generator=g, dtype=F64)).requires_grad_(
            True
        )
        got = rl.kl_estimate(lp, ref_lp, kind, **extra)
        expected = ref.ref_kl_estimate(lp, ref_lp, kind, **extra)
        assert got.shape == (n, t)
        close(got, expected)
        c = torch.randn(n, t, generator=g, dtype=F64)
        # gradients w.r.t. logprobs only: whether ref_logprobs is differentiable is not specified
        close(grad_of((got * c).sum(), lp), grad_of((expected * c).sum(), lp))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "extra",
    [{}, {"clamp": 0.1, "coef": 0.5}, {"grad_kind": "k2", "coef": 2.0}],
    ids=["plain", "clamp", "st_k2"],
)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_kl_penalty(kind: str, extra: dict[str, Any], aggregation: str) -> None:
    for n, t in SHAPES:
        g = lib.gen("kl_penalty", kind, repr(extra), aggregation, n, t)
        mask = lib.make_mask(g, n, t)
        lp = -torch.rand(n, t, generator=g, dtype=F64) * 3.0
        ref_lp = lp + 0.5 * torch.randn(n, t, generator=g, dtype=F64)
        lp = torch.where(mask, lp, lib.garbage(g, (n, t))).requires_grad_(True)
        ref_lp = torch.where(mask, ref_lp, lib.garbage(g, (n, t))).requires_grad_(True)
        kwargs = {"logprobs": lp, "ref_logprobs": ref_lp, "mask": mask, "kind": kind} | extra
        kwargs |= lib.agg_kwargs(g, aggregation, t)
        got = rl.kl_penalty(**kwargs)
        expected = ref.ref_kl_penalty(**kwargs)
        lib.check_scalar_output(got.loss, "loss")
        close(got.loss, expected.loss)
        # gradients w.r.t. logprobs only: whether ref_logprobs is differentiable is not specified
        close(grad_of(got.loss, lp), grad_of(expected.loss, lp))
        lib.check_diag_detached(got, ("kl_mean", "kl_max"))
        if bool(mask.any()):
            close(got.kl_mean, expected.kl_mean, "kl_mean")
            close(got.kl_max, expected.kl_max, "kl_max")


@pytest.mark.parametrize("coef", [0.0, 0.01, 1.5])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_entropy_bonus(coef: float, aggregation: str) -> None:
    for n, t in SHAPES:
        g = lib.gen("entropy", coef, aggregation, n, t)
        mask = lib.make_mask(g, n, t)
        ent = torch.where(
            mask, torch.rand(n, t, generator=g, dtype=F64) * 4.0, lib.garbage(g, (n, t))
        ).requires_grad_(True)
        kwargs = {"entropies": ent, "mask": mask, "coef": coef} | lib.agg_kwargs(g, aggregation, t)
        got = rl.entropy_bonus(**kwargs)
        expected = ref.ref_entropy_bonus(**kwargs)
        lib.check_scalar_output(got.loss, "loss")
        close(got.loss, expected.loss)
        close(grad_of(got.loss, ent), grad_of(expected.loss, ent))
        lib.check_diag_detached(got, ("entropy_mean",))
        if bool(mask.any()):
            close(got.entropy_mean, expected.entropy_mean)


@pytest.mark.parametrize("top_quantile", [0.05, 0.2, 0.5, 0.9, 1.0])
def test_high_entropy_mask(top_quantile: float) -> None:
    for n, t in [*SHAPES, (6, 7)]:
        g = lib.gen("high_entropy", top_quantile, n, t)
        mask = lib.make_mask(g, n, t)
        ent = torch.where(
            mask, torch.rand(n, t, generator=g, dtype=F64) * 4.0, lib.garbage(g, (n, t))
        )
        got = rl.high_entropy_mask(ent, mask, top_quantile)
        expected = ref.ref_high_entropy_mask(ent, mask, top_quantile)
        assert got.dtype == torch.bool
        # bit-exact: bool masks (a quantile of seeded entropies, no ties)
        assert torch.equal(got, expected), (got, expected, ent, mask)


# --------------------------------------------------------------------------- rollout correction

ROLLOUT_VARIANTS = [
    {"mode": "truncate"},
    {"mode": "truncate", "cap": 1.2},
    {"mode": "mask"},
    {"mode": "mask", "cap": 1.5, "lower": 0.6},
]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("variant", ROLLOUT_VARIANTS, ids=["tis", "tis_cap", "mis", "mis_low"])
def test_rollout_correction(level: str, variant: dict[str, Any]) -> None:
    for n, t in SHAPES:
        g = lib.gen("rollout", level, repr(variant), n, t)
        mask = lib.make_mask(g, n, t)
        old = -torch.rand(n, t, generator=g, dtype=F64) * 3.0
        samp = old + (0.5 if level == "token" else 0.25) * torch.randn(n, t, generator=g, dtype=F64)
        old = torch.where(mask, old, lib.garbage(g, (n, t)))
        samp = torch.where(mask, samp, lib.garbage(g, (n, t)))
        kwargs = {"old_logprobs": old, "sampling_logprobs": samp, "mask": mask, "level": level}
        got = rl.rollout_correction(**kwargs | variant)
        expected = ref.ref_rollout_correction(**kwargs | variant)
        close(got.weights, expected.weights)
        assert got.mask.dtype == torch.bool
        # bit-exact: bool masks (seeded ratios, none on a bound)
        assert torch.equal(got.mask, expected.mask)
        if bool(mask.any()):
            for key in ("ratio_mean", "frac_clamped", "mismatch_kl"):
                close(getattr(got, key), getattr(expected, key), key)
            if float((expected.weights**2).sum()) > 0:  # ess edge cases: test_hand_cases.py
                close(got.ess, expected.ess, "ess")
