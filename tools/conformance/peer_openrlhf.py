"""OpenRLHF 0.11.2: ``models.loss.PolicyLoss`` / ``ValueLoss``, ``models.utils``
(``compute_approx_kl``, ``compute_reward``, ``masked_normalize``) and
``RemoteExperienceMaker.compute_advantages_and_returns`` (run in OpenRLHF's venv).

Installed with ``--no-deps`` (torch and numpy only). Stubbed, because the math never calls them:
``deepspeed`` (training engine, imported at the top of ``models/utils.py``), ``ray`` and
``openrlhf.trainer.ray.launcher`` (the Ray actor launcher). The package ``__init__``s of
``openrlhf.models``, ``openrlhf.utils`` and ``openrlhf.trainer.ppo_utils`` (which import the
actor model, peft and transformers) are bypassed: the modules load from their own files.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

import peerlib
import torch

ROOT = pathlib.Path(importlib.util.find_spec("openrlhf").origin).parent  # type: ignore[arg-type,union-attr]
peerlib.stub("deepspeed", "ray", "openrlhf.trainer.ray.launcher")
sys.modules["openrlhf.trainer.ray.launcher"].RayActorGroup = object  # type: ignore[attr-defined]
sys.modules["ray"].remote = lambda f=None, **k: f  # type: ignore[attr-defined]
for pkg in ("openrlhf.models", "openrlhf.utils", "openrlhf.trainer", "openrlhf.trainer.ppo_utils"):
    mod = types.ModuleType(pkg)
    mod.__path__ = [str(ROOT.joinpath(*pkg.split(".")[1:]))]  # type: ignore[attr-defined]
    sys.modules[pkg] = mod
sys.modules["openrlhf.utils.utils"] = types.ModuleType("openrlhf.utils.utils")
sys.modules["openrlhf.utils.utils"].zero_pad_sequences = None  # type: ignore[attr-defined]

from openrlhf.models.loss import PolicyLoss, ValueLoss  # noqa: E402
from openrlhf.models.utils import compute_approx_kl, compute_reward, masked_normalize  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402


def _ns(**kw: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


def _advantages(
    b: dict[str, torch.Tensor], g: int, estimator: str, gamma: float = 1.0
) -> peerlib.Out:
    m = b["mask"].to(torch.float64)
    n = m.shape[0]
    args = _ns(
        rollout=_ns(n_samples_per_prompt=g),
        algo=_ns(advantage=_ns(estimator=estimator, gamma=gamma, lambd=0.8, no_std_norm=False)),
        reward=_ns(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
        data=_ns(max_len=10**6),
    )
    maker = object.__new__(RemoteExperienceMaker)
    maker.strategy = _ns(args=args)
    maker.kl_ctl = _ns(value=0.0)
    maker.advantage_estimator = estimator
    exp = _ns(
        rewards=b["scores"].clone(), index=list(range(n)), kl=torch.zeros_like(m), action_mask=m,
        values=b["values"].clone(), info={}, sequences=None,
    )  # fmt: skip
    (exp,) = maker.compute_advantages_and_returns([exp])
    return {"advantages": exp.advantages, "returns": exp.returns}


def run(b: dict[str, torch.Tensor], g: int) -> dict[str, peerlib.Out]:
    m = b["mask"]
    mf = m.to(torch.float64)
    lp, old, ref, samp = b["logprobs"], b["old_logprobs"], b["ref_logprobs"], b["sampling_logprobs"]
    adv = b["advantages"][:, None] * mf
    out: dict[str, peerlib.Out] = {}

    def pol(name: str, **kw: object) -> None:
        fn = PolicyLoss(**kw)
        out[name] = peerlib.with_grad(lambda x: fn(x, old, adv, mf, rollout_log_probs=samp)[0], lp)

    pol("ppo", clip_eps_low=0.2, clip_eps_high=0.28)
    pol("ppo_sample", clip_eps_low=0.2, clip_eps_high=0.28, token_level_loss=False)
    pol("ppo_dual", clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=3.0)
    pol("gspo", clip_eps_low=3e-4, clip_eps_high=4e-4, policy_loss_type="gspo")
    pol(
        "tis",
        is_correction_level="token",
        is_correction_mode="clip",
        is_correction_threshold=(0.9, 1.1),
    )
    pol(
        "icepop",
        is_correction_level="token",
        is_correction_mode="mask",
        is_correction_threshold=(0.9, 1.1),
    )
    pol(
        "seq_mask_tis",
        is_correction_level="seq",
        is_correction_mode="mask",
        is_correction_threshold=(0.97, 1.03),
    )
    for est in ("k1", "k2", "k3"):
        out[f"kl[{est}]"] = peerlib.with_grad(
            lambda x, est=est: (compute_approx_kl(x, ref, kl_estimator=est) * mf).sum() / mf.sum(),
            lp,
        )
    out["kl_unbiased"] = peerlib.with_grad(
        lambda x: (
            (compute_approx_kl(x, ref, old, "k3", unbiased_gradient=True) * mf).sum() / mf.sum()
        ),
        lp,
    )
    vl = ValueLoss(clip_eps=0.2)
    out["value"] = peerlib.with_grad(
        lambda v: vl(v, b["old_values"], b["returns"], mf), b["values"]
    )
    out["reward"] = {
        "rewards": compute_reward(b["scores"], 0.05, b["ref_logprobs"], action_mask=mf)
    }
    flat = masked_normalize(b["values"].reshape(1, -1), mf.reshape(1, -1))
    out["whiten"] = {"whitened": flat.reshape(m.shape)}
    for est in ("reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo"):
        out[f"adv[{est}]"] = _advantages(b, g, est)
    out["adv[reinforce_gamma]"] = _advantages(b, g, "reinforce", gamma=0.9)
    out["adv[gae]"] = _advantages(b, g, "gae", gamma=0.9)
    return out


if __name__ == "__main__":
    peerlib.main(run)
