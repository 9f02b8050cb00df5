"""Our side of every conformance case: the documented mapping, as calls (workspace venv).

``OURS[peer](batch, G)`` returns ``{case: {name: tensor}}`` with the same case names and
output names as that peer's script; ``tools/conformance/run.py`` compares the two.
"""

from __future__ import annotations

from collections.abc import Callable

import rl_advantages as ra
import rl_kernels as rk
import rl_losses as rl
import torch

Out = dict[str, torch.Tensor]
F64 = torch.float64
AGG = {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum": "seq_mean_token_sum",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}


def with_grad(fn: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor) -> Out:
    x = x0.detach().clone().requires_grad_(True)
    value = fn(x)
    (g,) = torch.autograd.grad(value, x, allow_unused=True)
    return {"value": value.detach(), "grad": torch.zeros_like(x) if g is None else g}


def _tok(adv: torch.Tensor, m: torch.Tensor) -> Out:
    a = adv[:, None] * m.to(F64)
    return {"advantages": a, "returns": a}


def _lone(n: int, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``*_lone`` cases' groups (peer_verl.py): the last row is a prompt of its own.

    Returns ``(keep, lone)``, [N] bool each: our ``mask`` (every row but the last, so the last
    group of G keeps its G - 1 others) and the rows that are alone in verl's grouping.
    """
    index = torch.tensor([i // g for i in range(n - 1)] + [n // g])
    keep = torch.arange(n) < n - 1
    return keep, torch.bincount(index)[index] == 1


def verl(b: dict[str, torch.Tensor], g: int) -> dict[str, Out]:
    m = b["mask"]
    tr = b["token_rewards"]
    scores = tr.sum(-1)
    lp, old = b["logprobs"], b["old_logprobs"]
    adv_t = b["advantages"][:, None] * m.to(F64)
    keep, lone = _lone(m.shape[0], g)
    # a group of one: verl's grpo / grpo_vectorized take mean 0, std 1 (A = r / (1 + eps)), its
    # loop rloo leaves A = r, its rloo_vectorized gives 0; ours gives 0 (no baseline)
    grpo_lone = torch.where(lone, scores / (1 + 1e-6), ra.group_relative(scores, g, mask=keep))
    rloo_lone = ra.rloo(scores, g, mask=keep)
    out: dict[str, Out] = {
        "grpo": _tok(ra.group_relative(scores, g, eps=1e-6), m),
        "grpo_vectorized": _tok(ra.group_relative(scores, g, eps=1e-6), m),
        "grpo_lone": _tok(grpo_lone, m),
        "grpo_vectorized_lone": _tok(grpo_lone, m),
        "grpo_nostd": _tok(ra.group_relative(scores, g, scale="none"), m),
        "rloo": _tok(ra.rloo(scores, g), m),
        "rloo_vectorized": _tok(ra.rloo(scores, g), m),
        "rloo_lone": _tok(torch.where(lone, scores, rloo_lone), m),
        "rloo_vectorized_lone": _tok(rloo_lone, m),
        "opo": _tok(ra.opo(scores, m.sum(-1).to(F64), g, mask=m.any(-1)), m),
        "gpg": _tok(ra.gpg(scores, g, alpha="nonzero_rewards"), m),
        "passk": _tok(ra.pass_at_k(scores, g), m),
    }
    both = torch.stack([scores, b["advantages"]], 1)
    gdpo = ra.gdpo(both, g, weights=(1.0, 0.5), eps=1e-6)[:, None] * m.to(F64)
    w = ra.whiten(gdpo, m) * m.to(F64)
    out["gdpo"] = {"advantages": w, "returns": w}
    p_old = torch.exp(old)
    spi = p_old**2 + 0.5 * (1 - p_old) ** 2
    a, r = ra.optimal_token_baseline(tr, m, old, spi, g)
    out["otb"] = {"advantages": a, "returns": r}
    rho = torch.exp(b["sampling_logprobs"] - old)
    a, r = ra.optimal_token_baseline(tr, m, old, spi, g, is_weights=rho)
    out["otb_is"] = {"advantages": a, "returns": r}
    for name, gamma in (("rpp", 1.0), ("rpp_gamma", 0.9)):
        a, r = ra.reinforce_plus_plus(tr, m, gamma)
        out[name] = {"advantages": a, "returns": r}
    a, r = ra.reinforce_plus_plus_baseline(scores, m, g)
    out["rpp_baseline"] = {"advantages": a, "returns": r}
    a, r = ra.remax(tr, m, b["advantages"])
    out["remax"] = {"advantages": a, "returns": r}
    a, r = ra.gae(tr, b["values"], m, 0.9, 0.8)
    out["gae"] = {"advantages": ra.whiten(a, m), "returns": r}
    for agg, ours in AGG.items():
        out[f"vanilla[{agg}]"] = with_grad(
            lambda x, ours=ours: (
                rl.clipped_surrogate(
                    x, old, adv_t, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0, aggregation=ours
                ).loss
            ),
            lp,
        )
    out["gspo"] = with_grad(
        lambda x: (
            rl.gspo_loss(x, old, adv_t, m, gradient="token", aggregation="seq_mean_token_mean").loss
        ),
        lp,
    )
    out["sapo"] = with_grad(
        lambda x: rl.sapo_loss(x, old, adv_t, m, aggregation="seq_mean_token_mean").loss, lp
    )
    out["gpg"] = out["gpg"] | with_grad(lambda x: rl.reinforce_loss(x, old, adv_t, m).loss, lp)
    n = m.shape[0]
    out["geo_mean"] = with_grad(lambda x: rl.gmpo_loss(x, old, adv_t, m, normalizer=n).loss, lp)
    out["cispo"] = with_grad(
        lambda x: (
            rl.cispo_loss(x, old, adv_t, m, clamp="two_sided", eps_low=0.2, eps_high=0.28).loss
        ),
        lp,
    )
    out["clip_cov"] = with_grad(
        lambda x: rl.clip_cov_loss(x, old, adv_t, m, clip_cov_ratio=1.0, clip_cov_lb=0.1).loss, lp
    )
    out["kl_cov"] = with_grad(
        lambda x: rl.kl_cov_loss(x, old, adv_t, m, kl_cov_ratio=0.2, kl_coef=0.5).loss, lp
    )
    dppo = {"delta_low": 0.05, "delta_high": 0.08}
    out["dppo_tv"] = with_grad(
        lambda x: rl.dppo_loss(x, old, adv_t, m, **dppo, ratio_cap=3.0).loss, lp
    )
    out["dppo_tv_cap"] = with_grad(
        lambda x: (
            rl.dppo_loss(
                x, old, adv_t, m, **dppo, ratio_cap=1.1, aggregation="seq_mean_token_sum"
            ).loss
        ),
        lp,
    )
    kl = {"divergence": "kl", "delta_low": 0.005, "delta_high": 0.01, "ratio_cap": 3.0}
    out["dppo_kl"] = with_grad(lambda x: rl.dppo_loss(x, old, adv_t, m, **kl).loss, lp)
    out["dro"] = with_grad(lambda x: rl.dro_loss(x, old, adv_t, m, beta=0.5).loss, lp)
    ref = b["ref_logprobs"]
    for kind, clamp in (("k3", 10.0), ("k1", None), ("k2", None), ("abs", None)):
        out[f"kl[{kind}]"] = with_grad(
            lambda x, kind=kind, clamp=clamp: rl.kl_penalty(x, ref, m, kind=kind, clamp=clamp).loss,
            lp,
        )
    out["value"] = with_grad(
        lambda v: rl.value_loss(v, b["old_values"], b["returns"], m, clip=0.2).loss, b["values"]
    )
    return out


def agilerl(b: dict[str, torch.Tensor], g: int) -> dict[str, Out]:
    m = b["mask"]
    lp, old, ref, adv = b["logprobs"], b["old_logprobs"], b["ref_logprobs"], b["advantages"]
    n = m.shape[0]

    def ppo(x: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.clipped_surrogate(x, old, adv, m, clip_low=0.2, **kw).loss  # type: ignore[arg-type]

    def kl(x: torch.Tensor, keep: torch.Tensor | None = None, bias: bool = True) -> torch.Tensor:
        extra: dict[str, object] = (
            {"old_logprobs": old, "importance_weight": "ratio"} if bias else {}
        )
        if keep is not None:
            extra["is_weights"] = keep.to(F64)
        return rl.kl_penalty(x, ref, m, coef=0.04, clamp=10.0, clamp_mode="drop", **extra).loss  # type: ignore[arg-type]

    keep = rl.off_policy_mask(lp, old, adv, m, token_bounds=(0.9, 1.1), sequence_threshold=0.0)
    tis = rl.rollout_correction(old, b["sampling_logprobs"], m, cap=2.0).weights
    tok = {"unit_weight": "tokens", "pooling": "mean"}
    return {
        "grpo_window": with_grad(ppo, lp),
        "grpo_window_fp32": with_grad(ppo, lp),
        "grpo_micro_batch": with_grad(
            lambda x: ppo(x, aggregation="seq_mean_token_mean", normalizer=n), lp
        ),
        "grpo_micro_batch_fp32": with_grad(
            lambda x: ppo(x, aggregation="seq_mean_token_mean", normalizer=n), lp
        ),
        "grpo_kl": with_grad(lambda x: ppo(x) + kl(x), lp),
        "grpo_kl_plain": with_grad(lambda x: ppo(x) + kl(x, bias=False), lp),
        "grpo_masks": with_grad(lambda x: ppo(x, is_weights=keep.to(F64)) + kl(x, keep), lp),
        "grpo_vllm_tis": with_grad(lambda x: ppo(x, is_weights=tis), lp),
        "trajectory": with_grad(lambda x: ppo(x, level="trajectory", **tok), lp),
        "turn": with_grad(lambda x: ppo(x, level="turn", turn_ids=b["turn_ids"], **tok), lp),
        "cispo": with_grad(lambda x: rl.cispo_loss(x, old, adv, m, eps_high=0.2).loss, lp),
        "adv_mean_std": {"advantages": ra.group_relative(b["scores"], g, eps=1e-8)[:, None]},
        "adv_mean_only": {"advantages": ra.group_relative(b["scores"], g, scale="none")[:, None]},
        **_agilerl_token_returns(b),
    }


def _agilerl_token_returns(b: dict[str, torch.Tensor]) -> dict[str, Out]:
    """AgileRL's token-level GAE and ReBN: a gap ends the episode (``gap="reset"``)."""
    m = b["mask"]
    out: dict[str, Out] = {}
    for name, rewards in (("", b["token_rewards"]), ("_dense", b["returns"])):
        a, r = ra.gae(rewards, b["values"], m, 0.9, 0.8, gap="reset")
        out[f"gae_token{name}"] = {"advantages": ra.whiten(a, m), "returns": r}
        out[f"gae_token{name}_raw"] = {"advantages": a, "returns": r}
        returns = ra.discounted_returns(rewards, m, 0.9, gap="reset")
        out[f"rebn_token{name}"] = {"advantages": ra.rebn(returns, m)}
    return out


def trl(b: dict[str, torch.Tensor], g: int) -> dict[str, Out]:
    m = b["mask"]
    lp, old, ref, adv = b["logprobs"], b["old_logprobs"], b["ref_logprobs"], b["advantages"]
    n, t = m.shape
    clip = {"clip_low": 0.2, "clip_high": 0.28}
    rows = {"aggregation": "seq_mean_token_mean", "normalizer": n}

    def ppo(x: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.clipped_surrogate(x, old, adv, m, **clip, **kw).loss  # type: ignore[arg-type]

    def gspo(x: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.gspo_loss(x, old, adv, m, gradient="token", **clip, **kw).loss  # type: ignore[arg-type]

    def kl(x: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.kl_penalty(x, ref, m, coef=0.04, **kw).loss  # type: ignore[arg-type]

    keep = rl.off_policy_mask(lp, b["sampling_logprobs"], adv, m, sequence_threshold=0.0)
    tis = rl.rollout_correction(old, b["sampling_logprobs"], m, cap=3.0).weights
    return {
        "grpo": with_grad(lambda x: ppo(x, **rows), lp),
        "bnpo": with_grad(ppo, lp),
        "dr_grpo": with_grad(
            lambda x: ppo(x, aggregation="seq_mean_token_sum_norm", normalizer=n, max_length=t), lp
        ),
        "dapo": with_grad(ppo, lp),
        "sapo": with_grad(lambda x: rl.sapo_loss(x, old, adv, m, **rows).loss, lp),  # type: ignore[arg-type]
        "vespo": with_grad(lambda x: rl.vespo_loss(x, old, adv, m).loss, lp),
        "cispo": with_grad(lambda x: rl.cispo_loss(x, old, adv, m, eps_high=4.0).loss, lp),
        "dapo_sequence": with_grad(gspo, lp),
        "grpo_sequence": with_grad(lambda x: gspo(x, **rows), lp),
        "luspo": with_grad(lambda x: rl.luspo_loss(x, old, adv, m, normalizer=n, **clip).loss, lp),
        "dapo_delta": with_grad(lambda x: ppo(x, delta=1.5), lp),
        "dapo_kl": with_grad(lambda x: ppo(x) + kl(x), lp),
        "dapo_kl_bias": with_grad(
            lambda x: ppo(x) + kl(x, old_logprobs=old, importance_weight="ratio"), lp
        ),
        "dapo_off_policy": with_grad(lambda x: ppo(x, is_weights=keep.to(F64)), lp),
        "dapo_vllm_is": with_grad(lambda x: ppo(x, is_weights=tis), lp),
        "dapo_entropy": with_grad(
            lambda x: ppo(x) + rl.entropy_bonus(_entropies(b), m, coef=0.01).loss, lp
        ),
        "high_entropy_mask": {
            "mask": rl.high_entropy_mask(_entropies(b), m, top_quantile=0.2).to(F64)
        },
    }


def _entropies(b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The shared entropies of the TRL cases: |values| rounded to float32 (TRL's quantile is float32)."""
    return b["values"].abs().float().double()


def openrlhf(b: dict[str, torch.Tensor], g: int) -> dict[str, Out]:
    m = b["mask"]
    lp, old, ref, samp = b["logprobs"], b["old_logprobs"], b["ref_logprobs"], b["sampling_logprobs"]
    adv = b["advantages"][:, None] * m.to(F64)
    scores = b["scores"]
    clip = {"clip_low": 0.2, "clip_high": 0.28}

    def ppo(x: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.clipped_surrogate(x, old, adv, m, **kw).loss  # type: ignore[arg-type]

    def corrected(**kw: object) -> torch.Tensor:
        return rl.rollout_correction(old, samp, m, **kw).weights  # type: ignore[arg-type]

    tis = corrected(mode="truncate", lower=0.9, cap=1.1)
    icepop = corrected(mode="mask", lower=0.9, cap=1.1)
    seq_tis = corrected(
        level="sequence",
        statistic="geometric_mean",
        weights="token",
        mode="mask",
        lower=0.97,
        cap=1.03,
    )
    whiten = {"unbiased": False, "eps": 0.0}
    token_rewards = ra.kl_in_reward(scores, m)
    out: dict[str, Out] = {
        "ppo": with_grad(lambda x: ppo(x, **clip), lp),
        "ppo_sample": with_grad(lambda x: ppo(x, aggregation="seq_mean_token_mean", **clip), lp),
        "ppo_dual": with_grad(lambda x: ppo(x, dual_clip=3.0), lp),
        "gspo": with_grad(
            lambda x: rl.gspo_loss(x, old, adv, m, aggregation="seq_mean_token_mean").loss, lp
        ),
        "tis": with_grad(lambda x: ppo(x, is_weights=tis), lp),
        "icepop": with_grad(lambda x: ppo(x, is_weights=icepop), lp),
        "seq_mask_tis": with_grad(lambda x: ppo(x, is_weights=seq_tis), lp),
        "kl_unbiased": with_grad(
            lambda x: (
                rl.kl_penalty(
                    x,
                    ref,
                    m,
                    clamp=10.0,
                    old_logprobs=old,
                    importance_weight="gradient",
                    weight_cap=10.0,
                ).loss
            ),
            lp,
        ),
        "value": with_grad(
            lambda v: rl.value_loss(v, b["old_values"], b["returns"], m, clip=0.2).loss, b["values"]
        ),
        "reward": {"rewards": ra.kl_in_reward(scores, m, kl=ref, beta=0.05)},
        "whiten": {"whitened": ra.whiten(b["values"], m, **whiten)},
    }
    for kind, clamp in (("k1", 10.0), ("k2", 10.0), ("k3", 10.0)):
        out[f"kl[{kind}]"] = with_grad(
            lambda x, kind=kind, clamp=clamp: rl.kl_penalty(x, ref, m, kind=kind, clamp=clamp).loss,
            lp,
        )
    for name, gamma in (("reinforce", 1.0), ("reinforce_gamma", 0.9)):
        a, r = ra.reinforce_plus_plus(token_rewards, m, gamma, gap="carry", **whiten)  # type: ignore[arg-type]
        out[f"adv[{name}]"] = {"advantages": a, "returns": r}
    a, r = ra.reinforce_plus_plus_baseline(scores, m, g, **whiten)  # type: ignore[arg-type]
    out["adv[reinforce_baseline]"] = {"advantages": a}
    for name, a in (
        ("rloo", ra.rloo(scores, g)),
        ("group_norm", ra.group_relative(scores, g, eps=1e-9)),
        ("dr_grpo", ra.group_relative(scores, g, scale="none")),
    ):
        out[f"adv[{name}]"] = _tok(a, m)
    a, r = ra.gae(token_rewards, b["values"], m, 0.9, 0.8, gap="carry")
    out["adv[gae]"] = {"advantages": ra.whiten(a, m, **whiten), "returns": r}  # type: ignore[arg-type]
    return out


def liger(b: dict[str, torch.Tensor], g: int) -> dict[str, Out]:
    m = b["mask"]
    n, t = m.shape
    old, ref, adv, w, tgt = b["old_h"], b["ref_h"], b["advantages"], b["weight"], b["targets"]
    clip = {"clip_low": 0.2, "clip_high": 0.28}
    rows = {"aggregation": "seq_mean_token_mean", "normalizer": n}

    def lp(h: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(h @ w.T, -1).gather(-1, tgt[..., None])[..., 0]

    def ppo(h: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.clipped_surrogate(lp(h), old, adv, m, **clip, **kw).loss  # type: ignore[arg-type]

    def kl(h: torch.Tensor, **kw: object) -> torch.Tensor:
        return rl.kl_penalty(lp(h), ref, m, coef=0.04, **kw).loss  # type: ignore[arg-type]

    def fused(h: torch.Tensor, **kw: object) -> torch.Tensor:
        return rk.fused_policy_loss(h, w, tgt, m, adv, old, ref, **clip, **kw).loss  # type: ignore[arg-type]

    h0 = b["hidden"]
    return {
        "dapo_kl#fused": with_grad(lambda h: fused(h, kl_coef=0.04), h0),
        "grpo#fused": with_grad(lambda h: fused(h, **rows), h0),
        "cispo#fused": with_grad(
            lambda h: (
                rk.fused_policy_loss(h, w, tgt, m, adv, old, objective="cispo", eps_high=4.0).loss
            ),
            h0,
        ),
        "grpo": with_grad(lambda h: ppo(h, **rows), h0),
        "bnpo": with_grad(ppo, h0),
        "dr_grpo": with_grad(
            lambda h: ppo(h, aggregation="seq_mean_token_sum_norm", normalizer=n, max_length=t), h0
        ),
        "dapo": with_grad(ppo, h0),
        "sapo": with_grad(lambda h: rl.sapo_loss(lp(h), old, adv, m, **rows).loss, h0),  # type: ignore[arg-type]
        "cispo": with_grad(lambda h: rl.cispo_loss(lp(h), old, adv, m, eps_high=4.0).loss, h0),
        "dapo_kl": with_grad(lambda h: ppo(h) + kl(h), h0),
        "dapo_kl_bias": with_grad(
            lambda h: ppo(h) + kl(h, old_logprobs=old, importance_weight="ratio"), h0
        ),
        "dapo_sequence": with_grad(
            lambda h: rl.gspo_loss(lp(h), old, adv, m, gradient="token", **clip).loss, h0
        ),
        "vespo": with_grad(lambda h: rl.vespo_loss(lp(h), old, adv, m).loss, h0),
        "luspo": with_grad(
            lambda h: rl.luspo_loss(lp(h), old, adv, m, normalizer=n, **clip).loss, h0
        ),
    }


OURS: dict[str, Callable[[dict[str, torch.Tensor], int], dict[str, Out]]] = {
    "verl": verl,
    "agilerl": agilerl,
    "trl": trl,
    "openrlhf": openrlhf,
    "liger": liger,
}
