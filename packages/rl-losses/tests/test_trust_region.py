"""DPPO (``dppo_loss``, registered as ``dppo_tv`` / ``dppo_kl``) and DRO (``dro_loss``): agreement
with the float64 loop references of ``ref_trust.py``, hand cases, hypothesis properties,
gradchecks and the registry names.

Gradchecks: DRO has a true gradient. DPPO's weight sg(min(r, C)) and mask are detached, so the
function checked is x -> dppo(lp + x, old + x) (ratio fixed, so the weight is constant) on inputs
whose divergences are at least MARGIN away from the trust-region bounds (the mask is locally
constant); its gradient is the surrogate gradient -M min(r, C) A.
"""

from __future__ import annotations

import math
from typing import Any

import losses_testlib as lib
import pytest
import ref_trust as ref
import rl_losses as rl
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from losses_testlib import AGGREGATIONS, DIAG, F64, close, grad_of

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHAPES = [(n, t) for n in (1, 2, 5) for t in (1, 3, 8)]
T_, F_ = True, False
MARGIN = 1e-3

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("dppo_loss", {}),
    ("dppo_loss", {"delta_low": 0.05, "delta_high": 0.08}),
    ("dppo_loss", {"delta_low": 0.05, "delta_high": 0.08, "ratio_cap": 1.1}),
    ("dppo_loss", {"divergence": "kl", "delta_low": 0.01, "delta_high": 0.02}),
    ("dppo_loss", {"divergence": "kl", "delta_low": 0.01, "ratio_cap": None}),
    ("dro_loss", {}),
    ("dro_loss", {"beta": 0.3}),
]


def t(rows: Any) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def b(rows: Any) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(("name", "variant"), VARIANTS, ids=[f"{n}{v}" for n, v in VARIANTS])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_agrees_with_reference(name: str, variant: dict[str, Any], aggregation: str) -> None:
    for n, tt in SHAPES:
        g = lib.gen("trust", name, repr(variant), aggregation, n, tt)
        inputs = lib.make_policy_inputs(g, n, tt)
        inputs.pop("turn_ids")
        kw = inputs | variant | lib.agg_kwargs(g, aggregation, tt)
        got = getattr(rl, name)(**kw)
        expected = getattr(ref, f"ref_{name}")(**kw)
        lp = kw["logprobs"]
        lib.check_scalar_output(got.loss, "loss")
        lib.check_diag_detached(got, DIAG)
        close(got.loss, expected.loss, f"loss of {name} {variant}")
        close(grad_of(got.loss, lp), grad_of(expected.loss, lp), f"grad of {name} {variant}")
        if bool(kw["mask"].any()):
            for key in DIAG:
                close(getattr(got, key), getattr(expected, key), f"{key} of {name} {variant}")


# --------------------------------------------------------------------------- hand cases


def test_dppo_tv_drops_a_token_that_left_the_region_in_its_advantage_direction() -> None:
    # mu = 0.5 for every token; pi = 0.7 (up 0.2), 0.45 (down 0.05), 0.52 (up 0.02)
    lp = t([[math.log(0.7), math.log(0.45), math.log(0.52)]]).requires_grad_(True)
    old = t([[math.log(0.5)] * 3])
    adv = t([[1.0, -1.0, 1.0]])
    out = rl.dppo_loss(lp, old, adv, b([[T_, T_, T_]]), delta_low=0.04, delta_high=0.1)
    # token 0: A > 0, moved up 0.2 > 0.1: dropped; token 1: A < 0, down 0.05 > 0.04: dropped
    (g,) = torch.autograd.grad(out.loss, lp)
    assert g[0, 0] == 0 and g[0, 1] == 0
    assert float(g[0, 2]) == pytest.approx(-(0.52 / 0.5) / 3)
    assert out.loss.item() == pytest.approx(-(0.52 / 0.5) * math.log(0.52) / 3)
    assert float(out.clip_frac_high) == pytest.approx(1 / 3)
    assert float(out.clip_frac_low) == pytest.approx(1 / 3)


def test_dppo_keeps_a_token_moving_against_its_advantage() -> None:
    # A > 0 but pi fell far: the update moves it back into the region, so it keeps its gradient
    lp = t([[math.log(0.1)]]).requires_grad_(True)
    old = t([[math.log(0.9)]])
    for divergence in ("tv", "kl"):
        out = rl.dppo_loss(lp, old, t([2.0]), b([[T_]]), divergence=divergence, delta_low=0.01)
        (g,) = torch.autograd.grad(out.loss, lp)
        assert float(g) == pytest.approx(-2.0 * (0.1 / 0.9))


def test_dppo_kl_binary_divergence_and_cap() -> None:
    mu, p = 0.5, 0.6
    d = mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))  # 0.0204
    lp = t([[math.log(p)]]).requires_grad_(True)
    old = t([[math.log(mu)]])
    inside = rl.dppo_loss(lp, old, t([1.0]), b([[T_]]), divergence="kl", delta_low=d + 1e-3)
    outside = rl.dppo_loss(lp, old, t([1.0]), b([[T_]]), divergence="kl", delta_low=d - 1e-3)
    capped = rl.dppo_loss(lp, old, t([1.0]), b([[T_]]), delta_low=0.5, ratio_cap=1.1)
    assert inside.loss.item() == pytest.approx(-1.2 * math.log(p))
    assert outside.loss.item() == 0.0 and float(outside.clip_frac_high) == 1.0
    assert capped.loss.item() == pytest.approx(-1.1 * math.log(p))


def test_dppo_kl_at_probability_one() -> None:
    # mu = 1: the divergence is -log pi (finite); pi = 1: infinite, dropped when it moved up
    lp = t([[-0.5, 0.0]]).requires_grad_(True)
    old = t([[0.0, -0.5]])
    out = rl.dppo_loss(lp, old, t([[-1.0, 1.0]]), b([[T_, T_]]), divergence="kl")
    assert bool(torch.isfinite(out.loss))
    assert float(out.clip_frac_low) == 0.5 and float(out.clip_frac_high) == 0.5
    (g,) = torch.autograd.grad(out.loss, lp)
    assert bool(torch.isfinite(g).all()) and float(g[0, 1]) == 0.0


def test_dro_value_and_gradient() -> None:
    lp = t([[-1.0, -0.5]]).requires_grad_(True)
    old = t([[-1.2, -0.5]])
    out = rl.dro_loss(lp, old, t([[1.0, -2.0]]), b([[T_, T_]]), beta=0.5)
    assert out.loss.item() == pytest.approx((1.0 + 0.25 * 0.04 - 1.0) / 2)
    (g,) = torch.autograd.grad(out.loss, lp)
    assert g[0].tolist() == pytest.approx([(-1.0 + 0.5 * 0.2) / 2, 2.0 / 2])


@pytest.mark.parametrize(
    ("name", "kw", "word"),
    [
        ("dppo_loss", {"divergence": "js"}, "divergence"),
        ("dppo_loss", {"delta_low": 0.0}, "delta_low"),
        ("dppo_loss", {"delta_high": -1.0}, "delta_high"),
        ("dppo_loss", {"ratio_cap": 0.0}, "ratio_cap"),
        ("dro_loss", {"beta": 0.0}, "beta"),
    ],
)
def test_bad_options_are_named(name: str, kw: dict[str, Any], word: str) -> None:
    lp = t([[-1.0]])
    with pytest.raises(ValueError, match=word):
        getattr(rl, name)(lp, lp, t([1.0]), b([[T_]]), **kw)


# --------------------------------------------------------------------------- properties

LOGP = st.floats(-4.0, -0.01)


@SETTINGS
@given(
    lp=st.lists(LOGP, min_size=1, max_size=6),
    shift=st.lists(st.floats(-1.0, 1.0), min_size=6, max_size=6),
    adv=st.lists(st.floats(-2.0, 2.0), min_size=6, max_size=6),
    divergence=st.sampled_from(["tv", "kl"]),
    aggregation=st.sampled_from(AGGREGATIONS),
)
def test_dppo_gradient_is_minus_m_w_a(
    lp: list[float], shift: list[float], adv: list[float], divergence: str, aggregation: str
) -> None:
    """Every token's gradient is 0 (dropped) or -min(r, C) A / D; with huge regions none drops and
    DPPO is the CISPO-style truncated policy gradient; on-policy nothing drops."""
    k = len(lp)
    x = t([lp]).requires_grad_(True)
    old = (x.detach() + t([shift[:k]])).clamp(max=-1e-3)
    a = t([adv[:k]])
    m = torch.ones(1, k, dtype=torch.bool)
    wide = rl.dppo_loss(
        x, old, a, m, divergence=divergence, delta_low=1e9, ratio_cap=None, aggregation=aggregation
    )
    cispo = rl.cispo_loss(x, old, a, m, eps_high=1e12, aggregation=aggregation)
    close(grad_of(wide.loss, x), grad_of(cispo.loss, x), "wide DPPO vs CISPO")
    out = rl.dppo_loss(x, old, a, m, divergence=divergence, delta_low=0.05, aggregation=aggregation)
    g = grad_of(out.loss, x)
    full = grad_of(wide.loss, x)
    w = torch.exp(x.detach() - old)
    cap = torch.clamp(w, max=20.0) / w
    for j in range(k):
        assert float(g[0, j]) == 0.0 or float(g[0, j]) == pytest.approx(
            float(full[0, j] * cap[0, j])
        )
    on = rl.dppo_loss(x, x.detach(), a, m, divergence=divergence, delta_low=1e-9)
    assert float(on.clip_frac_low) == 0.0 and float(on.clip_frac_high) == 0.0


@SETTINGS
@given(
    lp=st.lists(LOGP, min_size=1, max_size=6),
    adv=st.lists(st.floats(-2.0, 2.0), min_size=6, max_size=6),
    beta=st.floats(0.01, 5.0),
)
def test_dro_on_policy_is_the_policy_gradient(
    lp: list[float], adv: list[float], beta: float
) -> None:
    k = len(lp)
    x = t([lp]).requires_grad_(True)
    a = t([adv[:k]])
    m = torch.ones(1, k, dtype=torch.bool)
    dro = rl.dro_loss(x, x.detach(), a, m, beta=beta)
    pg = rl.reinforce_loss(x, x.detach(), a, m)
    close(dro.loss, pg.loss, "value")
    close(grad_of(dro.loss, x), grad_of(pg.loss, x), "gradient")


@SETTINGS
@given(garbage=st.sampled_from([float("nan"), float("inf"), -1e9, 1e9]))
def test_masked_tokens_do_not_leak(garbage: float) -> None:
    lp = t([[-1.0, -0.5, -2.0]])
    old = t([[-1.1, -0.4, -2.0]])
    m = b([[T_, T_, F_]])
    for name, kw in VARIANTS:
        base = getattr(rl, name)(lp, old, t([[1.0, -1.0, 0.5]]), m, **kw).loss
        lp2, old2 = lp.clone(), old.clone()
        lp2[0, 2] = garbage
        old2[0, 2] = garbage
        got = getattr(rl, name)(lp2, old2, t([[1.0, -1.0, garbage]]), m, **kw).loss
        assert float(got) == float(base), (name, kw)


# --------------------------------------------------------------------------- gradchecks

MASK = b([[T_, T_, F_, T_], [F_, F_, F_, F_], [T_, T_, T_, F_], [F_, T_, F_, F_]])


def _inputs(key: object, ok: Any) -> dict[str, Any]:
    for attempt in range(200):
        g = lib.gen("gradcheck-trust", key, attempt)
        inputs = lib.make_policy_inputs(g, 4, 4, mask=MASK.clone())
        inputs.pop("turn_ids")
        inputs["logprobs"] = inputs["logprobs"].detach()
        if ok(inputs):
            return inputs
    raise AssertionError(f"no kink-free inputs for {key}")


def _divergences(inputs: dict[str, Any], divergence: str) -> list[float]:
    m = inputs["mask"]
    lp, old = inputs["logprobs"][m].tolist(), inputs["old_logprobs"][m].tolist()
    if divergence == "tv":
        return [math.exp(a) - math.exp(o) for a, o in zip(lp, old, strict=True)]
    return [ref._binary_kl(math.exp(o), math.exp(a)) for a, o in zip(lp, old, strict=True)]


@pytest.mark.parametrize("api", [rl, ref], ids=["impl", "ref"])
@pytest.mark.parametrize(
    "variant",
    [
        {"delta_low": 0.05, "delta_high": 0.08},
        {"delta_low": 0.05, "ratio_cap": 1.1},
        {"divergence": "kl", "delta_low": 0.01, "delta_high": 0.02},
    ],
)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradcheck_dppo(api: Any, variant: dict[str, Any], aggregation: str) -> None:
    div = variant.get("divergence", "tv")
    bounds = [variant["delta_low"], variant.get("delta_high", variant["delta_low"])]
    kinks = bounds + [-x for x in bounds] if div == "tv" else bounds

    def ok(inputs: dict[str, Any]) -> bool:
        ds = _divergences(inputs, div)
        return all(abs(d - k) > MARGIN for d in ds for k in kinks)

    inputs = _inputs(("dppo", repr(variant), aggregation), ok)
    lp0, old0 = inputs.pop("logprobs"), inputs.pop("old_logprobs")
    fn = getattr(api, "dppo_loss" if api is rl else "ref_dppo_loss")

    def f(x: torch.Tensor) -> torch.Tensor:
        return fn(lp0 + x, (old0 + x).detach(), **inputs, **variant, aggregation=aggregation).loss

    x = torch.zeros_like(lp0, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("api", [rl, ref], ids=["impl", "ref"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gradcheck_dro(api: Any, aggregation: str) -> None:
    inputs = _inputs(("dro", aggregation), lambda _: True)
    lp0 = inputs.pop("logprobs")
    fn = getattr(api, "dro_loss" if api is rl else "ref_dro_loss")

    def f(x: torch.Tensor) -> torch.Tensor:
        return fn(x, **inputs, beta=0.7, aggregation=aggregation).loss

    x = lp0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- registry


def test_registered_names() -> None:
    assert rl.get_policy_loss("dppo_tv") is rl.dppo_loss
    assert rl.get_policy_loss("dro") is rl.dro_loss
    kl = rl.get_policy_loss("dppo_kl")
    lp = t([[-0.3, -1.0]]).requires_grad_(True)
    old = t([[-0.9, -0.4]])
    a, m = t([1.0, -1.0]), b([[T_, T_], [T_, T_]])
    lp2, old2 = torch.cat([lp, lp]), torch.cat([old, old])
    got = kl(lp2, old2, a, m, delta_low=0.01).loss.detach()
    expected = rl.dppo_loss(lp2, old2, a, m, divergence="kl", delta_low=0.01).loss.detach()
    assert got.item() == expected.item()
    for name in ("dppo_tv", "dppo_kl", "dro"):
        assert name in rl.available_policy_losses()


# --------------------------------------------------------------------------- Tinker's names


def _tinker_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = lib.gen("tinker")
    inputs = lib.make_policy_inputs(g, 3, 5, adv_per_seq=False, with_is=False)
    return inputs["logprobs"], inputs["old_logprobs"], inputs["advantages"], inputs["mask"]


def _tinker_sum(terms: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(terms).sum() if terms else torch.zeros((), dtype=F64)


@pytest.mark.parametrize("name", ["importance_sampling", "cross_entropy", "dro"])
def test_tinker_named_objectives_match_its_documented_formulas(name: str) -> None:
    """Tinker's `importance_sampling`: -sum(exp(lp - q) A); `cross_entropy`: -sum(w lp) (the
    weights passed as advantages); `dro`: -sum(lp A - beta/2 (lp - q)^2): each a sum over the
    valid tokens, token by token here (Tinker's docs, tinker-docs.thinkingmachines.ai/losses)."""
    lp, q, a, m = _tinker_inputs()
    terms = []
    for i, j in m.nonzero().tolist():
        x, old, adv = lp[i, j], q[i, j], a[i, j]
        if name == "importance_sampling":
            terms.append(-torch.exp(x - old) * adv)
        elif name == "cross_entropy":
            terms.append(-adv * x)
        else:
            terms.append(-(x * adv - 0.5 * 0.05 * (x - old) ** 2))
    expected = _tinker_sum(terms)
    kw: dict[str, Any] = {"aggregation": "seq_mean_token_sum", "normalizer": 1.0}
    if name == "dro":
        kw["beta"] = 0.05
    got = rl.get_policy_loss(name)(lp, q, a, m, **kw).loss
    close(got, expected, name)
    close(grad_of(got, lp), grad_of(expected, lp), f"grad of {name}")
