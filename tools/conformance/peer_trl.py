"""TRL 1.16.0: ``GRPOTrainer._compute_loss`` on the shared batches (run in TRL's venv).

Installed with ``--no-deps`` plus packaging, transformers, accelerate, datasets (CPU wheels).
The trainer is built with ``object.__new__`` (no model): the forward
``_get_per_token_logps_and_entropies`` returns the batch's log-probs, the accelerator is a
single-process stand-in (gather / reduce are the identity); nothing is stubbed.
"""

from __future__ import annotations

import collections
import types

import peerlib
import torch
from trl.trainer.grpo_trainer import GRPOTrainer

T_MAX = 7  # max_completion_length of the shared batches


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x: torch.Tensor) -> torch.Tensor:
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x

    @staticmethod
    def pad_across_processes(x: torch.Tensor, dim: int = 0, pad_index: float = 0.0) -> torch.Tensor:
        return x


def _trainer(x: torch.Tensor, entropies: torch.Tensor | None = None, **kw: object) -> GRPOTrainer:
    args = types.SimpleNamespace(
        delta=None, use_bias_correction_kl=False, sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0,
        vespo_lambda_neg=2.0, steps_per_generation=1,
    )  # fmt: skip
    for k in list(kw):
        if hasattr(args, k):
            setattr(args, k, kw.pop(k))
    t = object.__new__(GRPOTrainer)
    settings = {
        "args": args,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "importance_sampling_level": "token",
        "beta": 0.0,
        "loss_type": "dapo",
        "epsilon_low": 0.2,
        "epsilon_high": 0.28,
        "use_vllm": False,
        "vllm_importance_sampling_correction": False,
        "model": types.SimpleNamespace(training=True),
        "current_gradient_accumulation_steps": 1,
        "accelerator": _Accelerator(),
        "max_completion_length": T_MAX,
        "_metrics": {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        "_entropy_bonus_enabled": False,
        "aux_loss_enabled": False,
        "use_adaptive_entropy": False,
        "_get_per_token_logps_and_entropies": lambda *a, **k: (
            x,
            torch.zeros_like(x) if entropies is None else entropies,
            None,
        ),
    } | kw
    for k, v in settings.items():
        object.__setattr__(t, k, v)
    return t


def run(b: dict[str, torch.Tensor], g: int) -> dict[str, peerlib.Out]:
    m = b["mask"]
    n, t = m.shape
    lp = b["logprobs"]
    is_ratio = torch.exp(b["old_logprobs"] - b["sampling_logprobs"]).clamp(max=3.0) * m
    base = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long),
        "completion_mask": m.to(torch.long),
        "advantages": b["advantages"],
        "old_per_token_logps": b["old_logprobs"],
        "ref_per_token_logps": b["ref_logprobs"],
        "sampling_per_token_logps": b["sampling_logprobs"],
        "importance_sampling_ratio": is_ratio,
        "num_items_in_batch": m.sum().to(torch.float64),
    }
    out: dict[str, peerlib.Out] = {}

    def case(name: str, **kw: object) -> None:
        inputs = dict(base)
        if not kw.get("use_vllm"):  # no rollout-correction ratio unless vLLM correction is on
            del inputs["importance_sampling_ratio"]

        def loss(x: torch.Tensor) -> torch.Tensor:
            return _trainer(x, **kw)._compute_loss(None, dict(inputs))

        out[name] = peerlib.with_grad(loss, lp)

    for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "sapo", "vespo"):
        case(lt, loss_type=lt)
    case("cispo", loss_type="cispo", epsilon_high=5.0)
    case("dapo_sequence", loss_type="dapo", importance_sampling_level="sequence")
    case("grpo_sequence", loss_type="grpo", importance_sampling_level="sequence")
    case("luspo", loss_type="luspo", importance_sampling_level="sequence")
    case("dapo_delta", loss_type="dapo", delta=1.5)
    case("dapo_kl", loss_type="dapo", beta=0.04)
    case("dapo_kl_bias", loss_type="dapo", beta=0.04, use_bias_correction_kl=True)
    case("dapo_off_policy", loss_type="dapo", off_policy_mask_threshold=0.0)
    case("dapo_vllm_is", loss_type="dapo", use_vllm=True, vllm_importance_sampling_correction=True)
    ent = b["values"].abs().float().double()  # float32-exact: TRL's quantile runs in float32
    case(
        "dapo_entropy",
        loss_type="dapo",
        entropies=ent,
        _entropy_bonus_enabled=True,
        entropy_coef=0.01,
    )
    mask = _trainer(lp).get_high_entropy_mask(ent, m.to(torch.long), 1 - 0.2)
    out["high_entropy_mask"] = {"mask": mask.to(torch.float64)}
    return out


if __name__ == "__main__":
    peerlib.main(run)
