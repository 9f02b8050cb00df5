"""Naive full-logits references, seeded input generators and comparison helpers shared by the
rl-kernels tests.

The references are exactly the "naive equivalent" of the spec: full ``[M, V]`` logits in fp32
(``upcast``) or the input dtype, ``log_softmax`` + ``gather`` for log-probs,
``-(softmax * log_softmax).sum(-1)`` for entropies, and for the policy loss the composition of
``rl_losses`` functions (``get_policy_loss``, ``rollout_correction``, ``kl_penalty``,
``entropy_bonus``).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

import rl_losses
import torch
from rl_testing import tolerance
from rl_testing.seeded import ROW_KINDS, gen, make_mask, rand, randint  # noqa: F401 (re-exported)

F32 = torch.float32
F64 = torch.float64
# Fused against naive is two routes to one number: every comparison goes through
# rl_testing.tolerance (token_tol for per-token values, lm_tol for losses and gradients).

AGGREGATIONS = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)
DIAG = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean", "ratio_max")

# name -> (objective, objective_kwargs); variants chosen so that clipping / capping is active
# on a fraction of the tokens with the 0.3-std noise between logp and old_logprobs.
OBJECTIVE_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ppo": ("ppo", {}),
    "ppo-clip_high": ("ppo", {"clip_low": 0.2, "clip_high": 0.28}),
    "ppo-dual_clip": ("ppo", {"clip_low": 0.2, "dual_clip": 1.5}),
    "ppo-delta": ("ppo", {"clip_low": 0.2, "clip_high": 0.28, "delta": 1.4}),
    "ppo-ratio_bounds": ("ppo", {"ratio_bounds": (0.7, 1.3)}),
    "cispo-upper": ("cispo", {"clamp": "upper", "eps_high": 0.2}),
    "cispo-two_sided": ("cispo", {"clamp": "two_sided", "eps_low": 0.2, "eps_high": 0.3}),
    "reinforce-logprob": ("reinforce", {"form": "logprob"}),
    "reinforce-ratio": ("reinforce", {"form": "ratio"}),
    "sapo": ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}),
    "dppo_tv": ("dppo_tv", {"delta_low": 0.05, "delta_high": 0.08, "ratio_cap": 1.3}),
    "dppo_kl": ("dppo_kl", {"delta_low": 0.005, "delta_high": 0.01}),
    "dro": ("dro", {"beta": 0.5}),
    "importance_sampling": ("importance_sampling", {}),
    "cross_entropy": ("cross_entropy", {}),
}


# --------------------------------------------------------------------------- random inputs


def make_lm_head(
    g: torch.Generator,
    lead: tuple[int, ...],
    h: int,
    v: int,
    *,
    bias: bool,
    dtype: torch.dtype = F32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """hidden [*lead, h], weight [v, h], bias [v] or None: leaves requiring grad, in ``dtype``.

    Scaled so that the logits have std ~2 (peaked but not degenerate distributions).
    """
    hidden = torch.randn((*lead, h), generator=g, dtype=F64)
    weight = torch.randn(v, h, generator=g, dtype=F64) * (2.0 / h**0.5)
    b = torch.randn(v, generator=g, dtype=F64) * 0.5 if bias else None
    return (
        hidden.to(dtype).requires_grad_(True),
        weight.to(dtype).requires_grad_(True),
        None if b is None else b.to(dtype).requires_grad_(True),
    )


def make_targets(g: torch.Generator, shape: tuple[int, ...], v: int) -> torch.Tensor:
    return torch.randint(0, v, shape, generator=g, dtype=torch.int64)


def garbage(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Finite garbage for invalid positions."""
    return (torch.randn(shape, generator=g, dtype=F64) * 7.0 + 3.0).to(F32)


# --------------------------------------------------------------------------- naive references


def naive_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    upcast: bool = True,
) -> torch.Tensor:
    """z = (hidden @ weight.T + bias) / temperature, in fp32 when ``upcast`` (full [M, V])."""
    if upcast:
        hidden, weight = hidden.float(), weight.float()
        bias = None if bias is None else bias.float()
    z = hidden @ weight.T
    if bias is not None:
        z = z + bias
    return z / temperature


def naive_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs [M], entropies [M]) from the full logits."""
    z = naive_logits(hidden, weight, bias, temperature, upcast=upcast)
    ls = torch.log_softmax(z, dim=-1)
    logp = ls.gather(-1, targets.long()[:, None]).squeeze(-1)
    ent = -(torch.softmax(z, dim=-1) * ls).sum(-1)
    return logp, ent


@dataclass(frozen=True)
class NaivePolicy:
    loss: torch.Tensor
    policy: Any  # rl_losses.PolicyLossOutput
    kl: Any  # rl_losses.KLOutput or None
    entropy: Any  # rl_losses.EntropyOutput
    logp: torch.Tensor  # [N, T] fp32, differentiable
    ent: torch.Tensor  # [N, T] fp32, differentiable
    mask: torch.Tensor  # [N, T] bool


def naive_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    objective: str = "ppo",
    aggregation: str = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    max_length: int | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    kl_clamp: float | None = None,
    kl_grad_kind: str | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
    correction_level: str = "token",
    correction_mode: str = "truncate",
    correction_cap: float = 2.0,
    correction_lower: float | None = None,
    **objective_kwargs: Any,
) -> NaivePolicy:
    """The spec's naive composition. Masked positions are sanitised first (hidden rows zeroed
    through ``torch.where``, targets set to 0): they never reach the losses, which is what the
    spec requires of the fused path, and this keeps NaN there out of the reference's backward.
    """
    n, t, h = hidden.shape
    m = mask.bool()
    hid = torch.where(m[..., None], hidden, torch.zeros((), dtype=hidden.dtype))
    tgt = torch.where(m, targets, torch.zeros((), dtype=targets.dtype))
    logp, ent = naive_logprobs(
        hid.reshape(n * t, h), weight, tgt.reshape(n * t), bias, temperature, upcast=True
    )
    logp, ent = logp.reshape(n, t), ent.reshape(n, t)
    old = old_logprobs if old_logprobs is not None else logp.detach()
    if is_weights is not None:
        w, pmask = is_weights, m
    elif sampling_logprobs is not None:
        assert old_logprobs is not None
        c = rl_losses.rollout_correction(
            old_logprobs,
            sampling_logprobs,
            m,
            level=correction_level,
            mode=correction_mode,
            cap=correction_cap,
            lower=correction_lower,
        )
        w, pmask = c.weights, c.mask
    else:
        w, pmask = None, m
    fn = rl_losses.get_policy_loss(objective)
    # DPPO and DRO are token level by definition and take no `level`
    level = {"level": "token"} if "level" in inspect.signature(fn).parameters else {}
    policy = fn(
        logp,
        old,
        advantages,
        pmask,
        **level,
        aggregation=aggregation,
        normalizer=normalizer,
        max_length=max_length,
        is_weights=w,
        **objective_kwargs,
    )
    kl = None
    kl_loss: torch.Tensor | float = 0.0
    if ref_logprobs is not None:
        kl = rl_losses.kl_penalty(
            logp,
            ref_logprobs,
            m,
            kind=kl_kind,
            coef=kl_coef,
            clamp=kl_clamp,
            grad_kind=kl_grad_kind,
            aggregation=aggregation,
            normalizer=normalizer,
            max_length=max_length,
        )
        kl_loss = kl.loss
    entropy = rl_losses.entropy_bonus(
        ent,
        m,
        coef=entropy_coef,
        aggregation=aggregation,
        normalizer=normalizer,
        max_length=max_length,
    )
    loss = policy.loss + kl_loss + entropy.loss
    return NaivePolicy(loss, policy, kl, entropy, logp, ent, m)


# --------------------------------------------------------------------------- helpers


def token_tol(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Tolerance of per-token log-probs and entropies (``assert_close`` keywords).

    Two chained reductions (the logits' sum over the hidden size, the log-sum-exp over the
    vocabulary); both quantities are differences of O(|z|) terms (z_t - lse, lse - E[z]), so
    the scale is the largest |logit| (at least 1): on a peaked row (entropy ~ 1e-3, log-prob
    ~ 0) two correct fp32 routes differ by a few eps * |z|.
    """
    with torch.no_grad():
        h = hidden.detach().reshape(-1, hidden.shape[-1])
        z = naive_logits(h, weight.detach(), None if bias is None else bias.detach(), temperature)
        scale = max(1.0, float(z.abs().max())) if z.numel() else 1.0
    return {"reduction": max(hidden.shape[-1], weight.shape[0]), "stages": 2, "scale": scale}


def lm_tol(hidden: torch.Tensor, weight: torch.Tensor) -> dict[str, Any]:
    """Tolerance of a loss or gradient through an lm head (``assert_close`` keywords).

    Three chained reductions (logits over the hidden size, log-sum-exp over the vocabulary,
    then the mean over tokens or the backward's sum over rows / vocabulary), the longest being
    the largest of rows, hidden size and vocabulary.
    """
    rows = hidden.numel() // max(1, hidden.shape[-1])
    return {"reduction": max(rows, hidden.shape[-1], weight.shape[0]), "stages": 3}


def through_logprobs_scale(value: torch.Tensor, ref: NaivePolicy) -> float:
    r"""``scale`` of a loss computed from the naive path's log-probs and entropies.

    Each log-prob carries a rounding error of its own size (:math:`|\log p| \approx
    \mathrm{lse}`, not 1), and the error reaches the loss through its gradient, so the terms
    whose rounding the loss keeps are :math:`\sum_i |\partial L / \partial \log p_i|\,
    |\log p_i|` (and the same for the entropies), not the loss itself: a policy loss whose
    advantages nearly cancel is much smaller than that.
    """
    if not value.requires_grad:
        return float(value.detach().abs()) or 1.0
    g_logp, g_ent = torch.autograd.grad(
        value, [ref.logp, ref.ent], retain_graph=True, allow_unused=True
    )
    terms = float(value.detach().abs())
    for g, x in ((g_logp, ref.logp), (g_ent, ref.ent)):
        if g is not None:
            terms += float((g.abs() * x.detach().abs()).sum())
    return terms or 1.0


def grads(scalar: torch.Tensor, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """d scalar / d tensors (None entries stay None); one backward call."""
    present = [x for x in tensors if x is not None]
    got = iter(torch.autograd.grad(scalar, present))
    return [None if x is None else next(got) for x in tensors]


def assert_close(
    actual: torch.Tensor | float,
    expected: torch.Tensor | float,
    what: str,
    *,
    reduction: int = 1,
    stages: int = 1,
    scale: float | None = None,
    dtype: torch.dtype | None = None,
    accumulate: torch.dtype | None = None,
) -> None:
    """``rl_testing.tolerance.assert_close`` on tensors or Python floats (named ``what``)."""
    a = torch.as_tensor(actual).detach()
    e = (
        expected.detach()
        if isinstance(expected, torch.Tensor)
        else torch.tensor(expected, dtype=a.dtype)
    )
    tolerance.assert_close(
        a,
        e.to(a.device),
        reduction=reduction,
        stages=stages,
        scale=scale,
        dtype=dtype,
        accumulate=accumulate,
        msg=what,
    )


def stored_in(dtype: torch.dtype) -> dict[str, Any]:
    """Tolerance keywords for a gradient the kernels sum in float32 and return in ``dtype``.

    Half-precision inputs: their precision, sums accumulated in float32 (``upcast`` and the
    half GEMMs' fp32 results). float32 and float64: ``dtype`` float32.
    """
    wide = tolerance.half_accumulation(dtype)
    return {"dtype": dtype if wide else torch.float32, "accumulate": wide}


def assert_grads_close(
    actual: list[torch.Tensor | None],
    expected: list[torch.Tensor | None],
    names: tuple[str, ...] = ("hidden", "weight", "bias"),
    *,
    reduction: int = 1,
    stages: int = 1,
    dtype: torch.dtype | None = None,
) -> None:
    """Per-tensor check; the tolerance's scale is each reference's largest entry (the default),
    since a gradient entry is a sum over rows of terms as large as that and cancels to any size.
    """
    for a, e, name in zip(actual, expected, names, strict=True):
        if e is None:
            continue
        assert a is not None, f"no gradient for {name}"
        assert a.shape == e.shape, f"grad {name}: shape {list(a.shape)} vs {list(e.shape)}"
        assert torch.isfinite(a).all(), f"non-finite gradient for {name}"
        assert_close(a, e, f"grad {name}", reduction=reduction, stages=stages, dtype=dtype)


def shape_pattern(*dims: int) -> str:
    """Matches "(3, 4)", "[3, 4]", "torch.Size([3, 4])", "(3,4)"."""
    return r"\D" + r",\s*".join(str(d) for d in dims) + r"\D"


def names_argument(message: str, name: str) -> bool:
    """Whether ``message`` mentions the argument ``name`` as a whole word."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None
