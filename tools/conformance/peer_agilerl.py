"""AgileRL 2.58.0: ``GRPO._compute_policy_loss`` on the shared batches (run in AgileRL's venv).

Installed with ``--no-deps`` plus what ``agilerl.algorithms.grpo`` imports: lazy_loader,
gymnasium, tensordict, pyyaml, accelerate, dill, peft, packaging, transformers, pillow,
pettingzoo, fastrand, wandb and agilerl-arena (AgileRL's own ``agilerl.arena`` namespace
package); CPU wheels, imported by ``agilerl.algorithms`` but unused by the loss.
The agent is built with ``object.__new__`` (no model, no accelerator) and only the attributes
the loss reads are set; nothing is stubbed. One patch: ``_token_loss_weights`` builds its
aggregation weights in float32 (``mask.to(torch.float32)``), which caps agreement at about
1e-8; the cases run it in the inputs' dtype so the comparison holds at 1e-10 (the unpatched
method is run too, as ``*_fp32`` cases compared at 1e-6). The token-level return paths run
on bare agents too: ``PPO._compute_gae_returns_token`` (gamma 0.9, lambda 0.8, whitened or not)
and ``REINFORCE._compute_rebn_advantages_token`` (gamma 0.9), on rows with masked gaps.
"""

from __future__ import annotations

import peerlib
import torch
from agilerl.algorithms.grpo import GRPO
from agilerl.algorithms.ppo_llm import PPO
from agilerl.algorithms.reinforce_llm import REINFORCE


def _agent(**kw: object) -> GRPO:
    agent = object.__new__(GRPO)
    settings = {
        "off_policy_token_mask_bounds": None,
        "off_policy_sequence_mask_threshold": None,
        "kl_clamp": 10.0,
        "use_kl_advantage_shaping": False,
        "clip_coef_min": 0.8,
        "clip_coef_max": 1.2,
        "vllm_importance_sampling_cap": 2.0,
        "use_bias_correction_kl": False,
        "beta": 0.0,
        "_segment_accumulation_steps": None,
        "loss_norm": "window",
        "gradient_accumulation_steps": 1,
        "_window_action_tokens": None,
    } | kw
    for k, v in settings.items():
        object.__setattr__(agent, k, v)
    return agent


_FP32_WEIGHTS = GRPO._token_loss_weights


def _weights_in_input_dtype(self: GRPO, mask: torch.Tensor, window: object) -> torch.Tensor:
    """``GRPO._token_loss_weights`` with its float32 cast replaced by float64."""
    weights = mask.to(torch.float64)
    if window is not None:
        steps, window_tokens = window  # type: ignore[misc]
        return weights * (steps / window_tokens)
    row_tokens = weights.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return weights / (row_tokens * mask.shape[0])


def run(b: dict[str, torch.Tensor], g: int) -> dict[str, peerlib.Out]:
    GRPO._token_loss_weights = _FP32_WEIGHTS  # type: ignore[method-assign]
    fp32 = {
        f"{k}_fp32": v for k, v in _run(b, g).items() if k in ("grpo_window", "grpo_micro_batch")
    }
    GRPO._token_loss_weights = _weights_in_input_dtype  # type: ignore[method-assign]
    return _run(b, g) | fp32


def _run(b: dict[str, torch.Tensor], g: int) -> dict[str, peerlib.Out]:
    m = b["mask"]
    lp, old, ref = b["logprobs"], b["old_logprobs"], b["ref_logprobs"]
    adv = b["advantages"][:, None]
    tokens = float(m.sum())
    out: dict[str, peerlib.Out] = {}

    def case(
        name: str, level: str = "token", objective: str = "grpo", samp: bool = False, **kw: object
    ) -> None:
        agent = _agent(_window_action_tokens=tokens, **kw)
        turn_ids = b["turn_ids"] if level == "turn" else None
        sampling = b["sampling_logprobs"] if samp else None

        def loss(x: torch.Tensor) -> torch.Tensor:
            value, _, _ = agent._compute_policy_loss(
                m, x, old, ref, adv, turn_ids, level, objective, sampling_log_probs=sampling
            )
            return value

        out[name] = peerlib.with_grad(loss, lp)

    case("grpo_window")
    case("grpo_micro_batch", loss_norm="micro_batch")
    case("grpo_kl", beta=0.04, use_bias_correction_kl=True)
    case("grpo_kl_plain", beta=0.04)
    case(
        "grpo_masks",
        beta=0.04,
        use_bias_correction_kl=True,
        off_policy_token_mask_bounds=(0.9, 1.1),
        off_policy_sequence_mask_threshold=0.0,
    )
    case("grpo_vllm_tis", samp=True)
    case("trajectory", level="trajectory")
    case("turn", level="turn")
    case("cispo", objective="cispo")
    _token_returns(b, out)
    for norm in ("mean_std", "mean_only"):
        agent = _agent(group_size=g, adv_norm=norm)
        out[f"adv_{norm}"] = {"advantages": agent._calculate_advantage(b["scores"])}
    return out


def _token_returns(b: dict[str, torch.Tensor], out: dict[str, peerlib.Out]) -> None:
    """LLMPPO's token-level GAE and LLMREINFORCE's token-level ReBN on rows with gaps.

    Sparse rewards (the score on each row's last valid token) and dense ones (``returns``:
    a random reward on every token, masked ones included, which both sides must drop).
    """
    m = b["mask"]
    for name, rewards in (("", b["token_rewards"]), ("_dense", b["returns"])):
        for whiten in (True, False):
            ppo = object.__new__(PPO)
            for k, v in {"gamma": 0.9, "whiten_advantages": whiten}.items():
                object.__setattr__(ppo, k, v)
            returns, adv = ppo._compute_gae_returns_token(rewards, b["values"], m, 0.8)
            key = f"gae_token{name}" + ("" if whiten else "_raw")
            out[key] = {"advantages": adv, "returns": returns}
        agent = object.__new__(REINFORCE)
        object.__setattr__(agent, "gamma", 0.9)
        out[f"rebn_token{name}"] = {"advantages": agent._compute_rebn_advantages_token(rewards, m)}


if __name__ == "__main__":
    peerlib.main(run)
