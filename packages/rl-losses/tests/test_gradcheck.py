"""torch.autograd.gradcheck (float64) of every objective, on the implementation and the reference.

Inputs are tiny (N = 4, T = 4, with an empty row, a single-token row, holes and turn gaps) and are
drawn until every unit / token is at least MARGIN away from every kink (clip bounds, delta, dual
clip, Huber delta, |x| at 0, covariance bounds, ties in top-k), because gradcheck's finite
differences are wrong at non-differentiable points. gradcheck also perturbs invalid positions, so
it checks that they have zero influence.

Stop-gradient objectives are checked where their surrogate gradient is the true gradient of the
value:
* CISPO: w = sg(clip(r)) is constant when lp and old_logprobs move together, so the function
  checked is x -> cispo(lp + x, old + x) (r fixed).
* GSPO gradient="token" with per-sequence advantages and aggregation seq_mean_token_mean (then it
  equals the sequence gradient; spec note in test_properties.py).
* Clip-Cov: every candidate token is clipped (zero gradient in PPO already), so detaching it does
  not change the gradient; the generator is re-seeded on every call.
* REINFORCE form="ratio" (value -A, no true gradient): its gradient must equal the gradcheck-ed
  form="logprob" gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import losses_testlib as lib
import pytest
import ref_losses as ref
import rl_losses
import torch
from losses_testlib import AGGREGATIONS, F64, grad_of

MARGIN = 1e-3
T_, F_ = True, False
MASK = torch.tensor(
    [[T_, T_, F_, T_], [F_, F_, F_, F_], [T_, T_, T_, F_], [F_, T_, F_, F_]], dtype=torch.bool
)
TURN_IDS = torch.tensor([[0, 0, -1, 2], [-1, -1, -1, -1], [0, 1, 1, -1], [-1, 0, -1, -1]])
LEVELS = ("token", "turn", "trajectory")


class _Impl:
    def __getattr__(self, name: str) -> Any:
        return getattr(rl_losses, name)


class _Ref:
    def __getattr__(self, name: str) -> Any:
        return getattr(ref, f"ref_{name}")


API = pytest.mark.parametrize("api", [_Impl(), _Ref()], ids=["impl", "ref"])


def gradcheck(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    inputs = tuple(x.detach().clone().requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def policy_inputs(key: object, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    for attempt in range(200):
        g = lib.gen("gradcheck", key, attempt)
        inputs = lib.make_policy_inputs(g, 4, 4, mask=MASK.clone())
        inputs["turn_ids"] = TURN_IDS
        inputs["logprobs"] = inputs["logprobs"].detach()
        if ok(inputs):
            return inputs
    raise AssertionError(f"no kink-free inputs for {key}")


def unit_log_ratios(inputs: dict[str, Any], level: str, pooling: str) -> list[float]:
    units, _ = ref.unit_tokens(inputs["mask"], level, inputs["turn_ids"])
    ell = (inputs["logprobs"] - inputs["old_logprobs"]).tolist()
    out = []
    for i, row in enumerate(units):
        for toks in row:
            if toks:
                total = sum(ell[i][s] for s in toks)
                out.append(total if pooling == "sum" else total / len(toks))
    return out


def away(values: list[float], kinks: list[float], margin: float = MARGIN) -> bool:
    return all(abs(v - k) > margin for v in values for k in kinks)


def ratios_away(level: str, pooling: str, kinks: list[float]) -> Callable[[dict[str, Any]], bool]:
    def ok(inputs: dict[str, Any]) -> bool:
        rs = [math.exp(x) for x in unit_log_ratios(inputs, level, pooling)]
        return away(rs, kinks)

    return ok


def _call(api: Any, name: str, inputs: dict[str, Any], **kw: Any) -> Callable[..., torch.Tensor]:
    rest = {k: v for k, v in inputs.items() if k not in ("logprobs", "turn_ids")}

    def fn(lp: torch.Tensor) -> torch.Tensor:
        return getattr(api, name)(lp, **rest, **kw).loss

    return fn


# --------------------------------------------------------------------------- level-aware objectives

PPO_VARIANTS: list[dict[str, Any]] = [
    {},
    {"clip_low": 0.1, "clip_high": 0.28},
    {"ratio_bounds": (0.75, 1.4)},
    {"dual_clip": 1.5, "clip_high": 0.1},
    {"delta": 1.4, "clip_low": 0.15},
]


def _ppo_kinks(v: dict[str, Any]) -> list[float]:
    if "ratio_bounds" in v:
        lo, hi = v["ratio_bounds"]
    else:
        cl = v.get("clip_low", 0.2)
        lo, hi = 1 - cl, 1 + v.get("clip_high", cl)
    return [lo, hi, *(v[k] for k in ("dual_clip", "delta") if k in v)]


def _level_kw(level: str, pooling: str, inputs: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {"level": level, "pooling": pooling}
    if level == "turn":
        kw["turn_ids"] = inputs["turn_ids"]
    return kw


@API
@pytest.mark.parametrize("variant", PPO_VARIANTS, ids=["plain", "asym", "bounds", "dual", "delta"])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_clipped_surrogate(api: Any, variant: dict[str, Any], level: str, pooling: str) -> None:
    inputs = policy_inputs(
        ("ppo", repr(variant), level, pooling),
        ratios_away(level, pooling, _ppo_kinks(variant)),
    )
    kw = _level_kw(level, pooling, inputs) | variant | {"aggregation": "seq_mean_token_mean"}
    gradcheck(_call(api, "clipped_surrogate", inputs, **kw), inputs["logprobs"])


@API
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_reinforce(api: Any, level: str, pooling: str) -> None:
    inputs = policy_inputs(("reinforce", level, pooling), lambda _: True)
    kw = _level_kw(level, pooling, inputs) | {"aggregation": "token_mean"}
    gradcheck(_call(api, "reinforce_loss", inputs, form="logprob", **kw), inputs["logprobs"])
    # form="ratio": same gradient as form="logprob" (its value -A has no true gradient)
    lp = inputs["logprobs"].clone().requires_grad_(True)
    rest = {k: v for k, v in inputs.items() if k not in ("logprobs", "turn_ids")}
    g_ratio = grad_of(api.reinforce_loss(lp, **rest, form="ratio", **kw).loss, lp)
    g_logprob = grad_of(api.reinforce_loss(lp, **rest, form="logprob", **kw).loss, lp)
    lib.close(g_ratio, g_logprob)


@API
@pytest.mark.parametrize(
    "variant",
    [{}, {"eps_high": 0.3}, {"clamp": "two_sided", "eps_low": 0.1, "eps_high": 0.2}],
    ids=["upper", "upper_tight", "two_sided"],
)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_cispo(api: Any, variant: dict[str, Any], level: str, pooling: str) -> None:
    inputs = policy_inputs(("cispo", repr(variant), level, pooling), lambda _: True)
    kw = _level_kw(level, pooling, inputs) | variant | {"aggregation": "seq_mean_token_sum"}
    lp0, old0 = inputs["logprobs"], inputs["old_logprobs"]
    rest = {k: v for k, v in inputs.items() if k not in ("logprobs", "old_logprobs", "turn_ids")}

    def fn(x: torch.Tensor) -> torch.Tensor:  # ratio fixed: w constant
        return api.cispo_loss(lp0 + x, (old0 + x).detach(), **rest, **kw).loss

    gradcheck(fn, torch.zeros_like(lp0))


@API
@pytest.mark.parametrize("taus", [{}, {"tau_pos": 0.5, "tau_neg": 2.0}], ids=["d", "custom"])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_sapo(api: Any, taus: dict[str, float], level: str, pooling: str) -> None:
    inputs = policy_inputs(("sapo", repr(taus), level, pooling), lambda _: True)
    kw = _level_kw(level, pooling, inputs) | taus | {"aggregation": "seq_mean_token_sum_norm"}
    gradcheck(_call(api, "sapo_loss", inputs, **kw), inputs["logprobs"])


# --------------------------------------------------------------------------- sequence objectives


@API
@pytest.mark.parametrize("clips", [{}, {"clip_low": 0.2, "clip_high": 0.3}], ids=["d", "wide"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_sequence(api: Any, clips: dict[str, float], aggregation: str) -> None:
    kinks = [1 - clips.get("clip_low", 3e-4), 1 + clips.get("clip_high", 4e-4)]
    inputs = policy_inputs(
        ("gspo", repr(clips), aggregation), ratios_away("trajectory", "mean", kinks)
    )
    inputs.pop("turn_ids")
    kw = clips | {"aggregation": aggregation, "gradient": "sequence"}
    gradcheck(_call(api, "gspo_loss", inputs, **kw), inputs["logprobs"])


@API
@pytest.mark.parametrize("clips", [{}, {"clip_low": 0.2, "clip_high": 0.3}], ids=["d", "wide"])
def test_gspo_token(api: Any, clips: dict[str, float]) -> None:
    kinks = [1 - clips.get("clip_low", 3e-4), 1 + clips.get("clip_high", 4e-4)]
    inputs = policy_inputs(("gspo_token", repr(clips)), ratios_away("trajectory", "mean", kinks))
    inputs.pop("turn_ids")
    inputs["advantages"] = torch.tensor([1.0, -0.5, -1.5, 0.7], dtype=F64)
    inputs["is_weights"] = None
    kw = clips | {"aggregation": "seq_mean_token_mean", "gradient": "token"}
    gradcheck(_call(api, "gspo_loss", inputs, **kw), inputs["logprobs"])


@API
@pytest.mark.parametrize("clips", [{}, {"clip_low": 0.1, "clip_high": 0.2}], ids=["d", "tight"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gmpo(api: Any, clips: dict[str, float], aggregation: str) -> None:
    kinks = [-clips.get("clip_low", 0.4), clips.get("clip_high", 0.4)]

    def ok(inputs: dict[str, Any]) -> bool:
        ells = unit_log_ratios(inputs, "token", "sum")
        return away(ells, kinks)

    inputs = policy_inputs(("gmpo", repr(clips), aggregation), ok)
    inputs.pop("turn_ids")
    gradcheck(_call(api, "gmpo_loss", inputs, **clips, aggregation=aggregation), inputs["logprobs"])


# --------------------------------------------------------------------------- covariance objectives


def _cov_values(inputs: dict[str, Any]) -> list[float]:
    cov = ref.ref_cov(inputs["logprobs"], inputs["advantages"], inputs["mask"])
    return [c for row in cov for c in row if c is not None]


@API
@pytest.mark.parametrize("ratio", [2e-3, 0.3])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_kl_cov(api: Any, ratio: float, aggregation: str) -> None:
    def ok(inputs: dict[str, Any]) -> bool:
        covs = sorted(_cov_values(inputs), reverse=True)
        k = max(1, math.floor(ratio * len(covs)))
        gap_ok = k >= len(covs) or covs[k - 1] - covs[k] > MARGIN
        return gap_ok and away(unit_log_ratios(inputs, "token", "sum"), [0.0])

    inputs = policy_inputs(("kl_cov", ratio, aggregation), ok)
    inputs.pop("turn_ids")
    kw = {"kl_cov_ratio": ratio, "kl_coef": 0.7, "aggregation": aggregation}
    gradcheck(_call(api, "kl_cov_loss", inputs, **kw), inputs["logprobs"])


@API
@pytest.mark.parametrize("ratio", [0.1, 1.0])
def test_clip_cov(api: Any, ratio: float) -> None:
    lb, ub = 0.05, 3.0

    token_ratios = ratios_away("token", "sum", [0.8, 1.2])

    def ok(inputs: dict[str, Any]) -> bool:
        covs = _cov_values(inputs)
        return away(covs, [lb, ub]) and any(lb < c < ub for c in covs) and token_ratios(inputs)

    inputs = policy_inputs(("clip_cov", ratio), ok)
    inputs.pop("turn_ids")
    inputs["is_weights"] = None
    # every candidate clipped: A > 0 -> r = e^0.5 > 1.2, A < 0 -> r = e^-0.5 < 0.8
    cov = ref.ref_cov(inputs["logprobs"], inputs["advantages"], inputs["mask"])
    adv = inputs["advantages"]
    old = inputs["old_logprobs"].clone()
    n_cands = 0
    for i, row in enumerate(cov):
        for s, c in enumerate(row):
            if c is not None and lb < c < ub:
                a = float(adv[i] if adv.dim() == 1 else adv[i, s])
                old[i, s] = inputs["logprobs"][i, s] - (0.5 if a > 0 else -0.5)
                n_cands += 1
    assert n_cands > 0
    inputs["old_logprobs"] = old
    rest = {k: v for k, v in inputs.items() if k != "logprobs"}
    kw = {"clip_cov_ratio": ratio, "clip_cov_lb": lb, "clip_cov_ub": ub}

    def fn(lp: torch.Tensor) -> torch.Tensor:
        if isinstance(api, _Ref):
            return ref.ref_clip_cov_loss(lp, **rest, **kw, chosen=set()).loss
        return rl_losses.clip_cov_loss(
            lp, **rest, **kw, generator=torch.Generator().manual_seed(1234)
        ).loss

    gradcheck(fn, inputs["logprobs"])


# --------------------------------------------------------------------------- value / KL / entropy / aggregate


@API
@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("huber_delta", [None, 0.5])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_value_loss(
    api: Any, clip: float | None, huber_delta: float | None, aggregation: str
) -> None:
    for attempt in range(100):
        g = lib.gen("gc_value", clip, huber_delta, aggregation, attempt)
        values = torch.randn(4, 4, generator=g, dtype=F64)
        old = values + 0.3 * torch.randn(4, 4, generator=g, dtype=F64)
        returns = values + torch.randn(4, 4, generator=g, dtype=F64)
        diffs = (values - old).abs().flatten().tolist()
        errs = (values - returns).abs().flatten().tolist()
        clipped_errs = (old + (values - old).clamp(-0.2, 0.2) - returns).abs().flatten().tolist()
        # the two branches of max(err(V - R), err(Vc - R)) do not cross
        no_cross = all(
            abs(a - b) > MARGIN or d <= 0.2
            for a, b, d in zip(errs, clipped_errs, diffs, strict=True)
        )
        if away(diffs, [0.2]) and away(errs + clipped_errs, [0.5]) and no_cross:
            break
    else:
        raise AssertionError("no kink-free value inputs")
    mask = MASK
    values = torch.where(mask, values, lib.garbage(g, (4, 4)))

    def fn(v: torch.Tensor) -> torch.Tensor:
        return api.value_loss(
            v, old, returns, mask, clip=clip, huber_delta=huber_delta, aggregation=aggregation
        ).loss

    gradcheck(fn, values)


@API
@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
@pytest.mark.parametrize("clamp", [None, 0.1])
def test_kl_penalty(api: Any, kind: str, clamp: float | None) -> None:
    for attempt in range(100):
        g = lib.gen("gc_kl", kind, clamp, attempt)
        lp = -torch.rand(4, 4, generator=g, dtype=F64) * 2.0
        ref_lp = lp + 0.5 * torch.randn(4, 4, generator=g, dtype=F64)
        ells = (lp - ref_lp).flatten()
        est = ref.ref_kl_estimate(lp, ref_lp, kind).flatten().tolist()
        if away(ells.tolist(), [0.0]) and (clamp is None or away(est, [-clamp, clamp])):
            break
    else:
        raise AssertionError("no kink-free KL inputs")
    lp = torch.where(MASK, lp, lib.garbage(g, (4, 4)))
    ref_lp = torch.where(MASK, ref_lp, lib.garbage(g, (4, 4)))

    # w.r.t. logprobs only: whether ref_logprobs is differentiable is not specified
    def fn(x: torch.Tensor) -> torch.Tensor:
        return api.kl_penalty(
            x, ref_lp, MASK, kind=kind, coef=0.7, clamp=clamp, aggregation="seq_mean_token_mean"
        ).loss

    gradcheck(fn, lp)


@API
@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_kl_estimate(api: Any, kind: str) -> None:
    g = lib.gen("gc_kl_estimate", kind)
    lp = -torch.rand(3, 4, generator=g, dtype=F64) * 2.0
    ref_lp = lp + 0.5 * torch.randn(3, 4, generator=g, dtype=F64)
    assert away((lp - ref_lp).flatten().tolist(), [0.0])
    gradcheck(lambda x: api.kl_estimate(x, ref_lp, kind), lp)


@API
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_entropy_bonus(api: Any, aggregation: str) -> None:
    g = lib.gen("gc_entropy", aggregation)
    ent = torch.rand(4, 4, generator=g, dtype=F64) * 3.0

    def fn(e: torch.Tensor) -> torch.Tensor:
        return api.entropy_bonus(e, MASK, coef=0.7, aggregation=aggregation).loss

    gradcheck(fn, ent)


@API
@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("normalizer", [None, 3.0])
def test_aggregate(api: Any, mode: str, normalizer: float | None) -> None:
    g = lib.gen("gc_aggregate", mode, normalizer)
    loss = torch.randn(4, 4, generator=g, dtype=F64)
    gradcheck(
        lambda x: api.aggregate(x, MASK, mode=mode, normalizer=normalizer, max_length=6), loss
    )
