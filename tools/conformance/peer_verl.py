"""verl 0.9.1: ``verl.trainer.ppo.core_algos`` on the shared batches (run in verl's venv).

Installed with ``--no-deps`` plus what ``core_algos`` imports: packaging, ray, tensordict,
omegaconf, transformers, codetiming, orjson (CPU wheels; nothing is stubbed). The ``*_lone``
cases make each batch's last row a group of one (its own prompt index).
"""

from __future__ import annotations

import numpy as np
import peerlib
import torch
from verl.trainer.ppo import core_algos as ca
from verl.workers.config import ActorConfig, PolicyLossConfig


def _cfg(**kw: object) -> ActorConfig:
    base = {"strategy": "fsdp", "ppo_micro_batch_size_per_gpu": 1, "ppo_mini_batch_size": 1}
    return ActorConfig(**base, rollout_n=1, **kw)


class _Algo(dict):  # AlgoConfig stand-in: attribute and .get access to plain settings
    __getattr__ = dict.get


def _gdpo(b: dict[str, torch.Tensor], index: np.ndarray) -> peerlib.Out:
    """GDPO on two rewards per sample (the scores and the batch's `advantages` column), weights
    1 and 0.5, given as verl's trainer gives them: per-key arrays and the prompt/response mask."""
    m = b["mask"]
    n, p_len = m.shape[0], 2
    batch = {
        "prompts": torch.zeros(n, p_len, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(n, p_len, dtype=torch.long), m.long()], 1),
    }
    rewards = {"acc": b["token_rewards"].sum(-1).numpy(), "fmt": b["advantages"].numpy()}
    cfg = _Algo(gdpo_reward_keys=["acc", "fmt"], gdpo_reward_weights=[1.0, 0.5])
    a, r = ca.compute_gdpo_outcome_advantage(
        b["token_rewards"], m.to(torch.float64), index, config=cfg,
        non_tensor_batch=rewards, batch=batch,
    )  # fmt: skip
    return {"advantages": a, "returns": r}


def _otb(b: dict[str, torch.Tensor], index: np.ndarray) -> dict[str, peerlib.Out]:
    """The optimal token baseline with a made-up vocabulary sum of pi^2 (>= pi_t^2), without and
    with rollout-correction weights (the sampler's ratio)."""
    old, mf = b["old_logprobs"], b["mask"].to(torch.float64)
    p_old = torch.exp(old)
    spi = p_old**2 + 0.5 * (1 - p_old) ** 2
    rho = torch.exp(b["sampling_logprobs"] - old)
    out: dict[str, peerlib.Out] = {}
    for name, w in (("otb", None), ("otb_is", rho)):
        a, r = ca.compute_optimal_token_baseline_advantage(
            b["token_rewards"], mf, index, old, spi, rollout_is_weights=w
        )
        out[name] = {"advantages": a, "returns": r}
    return out


def run(b: dict[str, torch.Tensor], g: int) -> dict[str, peerlib.Out]:
    m = b["mask"]
    mf = m.to(torch.float64)
    n = m.shape[0]
    index = np.array([i // g for i in range(n)])
    tr = b["token_rewards"]
    lp, old, adv_t = b["logprobs"], b["old_logprobs"], b["advantages"][:, None] * mf
    out: dict[str, peerlib.Out] = {}

    def adv(name: str, fn: object, *args: object, **kw: object) -> None:
        a, r = fn(*args, **kw)  # type: ignore[operator]
        out[name] = {"advantages": a, "returns": r}

    adv("grpo", ca.compute_grpo_outcome_advantage, tr, mf, index)
    adv("grpo_vectorized", ca.compute_grpo_vectorized_outcome_advantage, tr, mf, index)
    adv(
        "grpo_nostd",
        ca.compute_grpo_outcome_advantage,
        tr,
        mf,
        index,
        norm_adv_by_std_in_grpo=False,
    )
    adv("rloo", ca.compute_rloo_outcome_advantage, tr, mf, index)
    adv("rloo_vectorized", ca.compute_rloo_vectorized_outcome_advantage, tr, mf, index)
    adv("opo", ca.compute_opo_outcome_advantage, tr, mf, index)
    adv("gpg", ca.compute_gpg_outcome_advantage, tr, mf, index)
    adv(
        "passk",
        ca.compute_grpo_passk_outcome_advantage,
        tr,
        mf,
        index,
        config=_Algo(norm_adv_by_std_in_grpo=True),
    )
    # a group of one: the last row is its own prompt (index B), its G - 1 siblings keep theirs
    lone = np.array([i // g for i in range(n - 1)] + [n // g])
    adv("grpo_lone", ca.compute_grpo_outcome_advantage, tr, mf, lone)
    adv("grpo_vectorized_lone", ca.compute_grpo_vectorized_outcome_advantage, tr, mf, lone)
    adv("rloo_lone", ca.compute_rloo_outcome_advantage, tr, mf, lone)
    adv("rloo_vectorized_lone", ca.compute_rloo_vectorized_outcome_advantage, tr, mf, lone)
    out |= {"gdpo": _gdpo(b, index), **_otb(b, index)}
    adv("rpp", ca.compute_reinforce_plus_plus_outcome_advantage, tr, mf, config=_Algo(gamma=1.0))
    adv(
        "rpp_gamma",
        ca.compute_reinforce_plus_plus_outcome_advantage,
        tr,
        mf,
        config=_Algo(gamma=0.9),
    )
    adv("rpp_baseline", ca.compute_reinforce_plus_plus_baseline_outcome_advantage, tr, mf, index)
    adv("remax", ca.compute_remax_outcome_advantage, tr, b["advantages"], mf)
    adv("gae", ca.compute_gae_advantage_return, tr, b["values"], mf, 0.9, 0.8)

    def loss(
        name: str, mode: str, cfg: ActorConfig, adv: torch.Tensor = adv_t, **kw: object
    ) -> None:
        fn = ca.get_policy_loss_fn(mode)
        out[name] = peerlib.with_grad(lambda x: fn(old, x, adv, mf, config=cfg, **kw)[0], lp)

    ppo = _cfg(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28)
    for agg in (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    ):
        loss(f"vanilla[{agg}]", "vanilla", ppo, loss_agg_mode=agg)
    loss(
        "gspo",
        "gspo",
        _cfg(clip_ratio=0.2, clip_ratio_low=3e-4, clip_ratio_high=4e-4),
        loss_agg_mode="seq-mean-token-mean",
    )
    loss("sapo", "sapo", _cfg(clip_ratio=0.2))
    loss("gpg", "gpg", ppo)
    loss("geo_mean", "geo_mean", _cfg(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4))
    loss("cispo", "cispo", _cfg(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28))
    kl_cov = _cfg(clip_ratio=0.2, policy_loss=PolicyLossConfig(kl_cov_ratio=0.2, ppo_kl_coef=0.5))
    loss("kl_cov", "kl_cov", kl_cov)
    # DPPO: trust regions narrow enough that tokens of both advantage signs leave them; the
    # truncation cap 1.1 binds on some tokens (verl's ActorConfig default 3.0 in dppo_kl)
    loss("dppo_tv", "dppo_tv", _cfg(clip_ratio=0.2, clip_ratio_low=0.05, clip_ratio_high=0.08))
    loss(
        "dppo_tv_cap",
        "dppo_tv",
        _cfg(clip_ratio=0.2, clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=1.1),
        loss_agg_mode="seq-mean-token-sum",
    )
    loss("dppo_kl", "dppo_kl", _cfg(clip_ratio=0.2, clip_ratio_low=0.005, clip_ratio_high=0.01))
    loss("dro", "dro", _cfg(clip_ratio=0.2, policy_loss=PolicyLossConfig(dro_beta=0.5)))
    # every candidate detached (ratio 1), so verl's random choice is no choice
    cov = PolicyLossConfig(clip_cov_ratio=1.0, clip_cov_lb=0.1, clip_cov_ub=5.0)
    loss("clip_cov", "clip_cov", _cfg(clip_ratio=0.2, policy_loss=cov))
    for kind, name in (("low_var_kl", "k3"), ("kl", "k1"), ("mse", "k2"), ("abs", "abs")):
        ref = b["ref_logprobs"]
        out[f"kl[{name}]"] = peerlib.with_grad(
            lambda x, kind=kind, ref=ref: ca.agg_loss(
                ca.kl_penalty(x, ref, kind), mf, "token-mean"
            ),
            lp,
        )
    out["value"] = peerlib.with_grad(
        lambda v: ca.compute_value_loss(v, b["returns"], b["old_values"], mf, 0.2)[0], b["values"]
    )
    return out


if __name__ == "__main__":
    peerlib.main(run)
