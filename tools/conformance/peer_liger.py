"""liger-kernel 0.8.5: ``LigerFusedLinearGRPOLoss`` (chunked, ``compiled=False``) on the shared
batches' tiny lm_head (run in Liger's venv). Installed with ``--no-deps`` (torch only; the
chunked loss needs no Triton); nothing is stubbed. Outputs: the loss and its gradient with
respect to the hidden states.
"""

from __future__ import annotations

import peerlib
import torch
from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOLoss


def run(b: dict[str, torch.Tensor], g: int) -> dict[str, peerlib.Out]:
    m = b["mask"]
    t = m.shape[1]
    w = b["weight"]
    out: dict[str, peerlib.Out] = {}

    def case(name: str, beta: float = 0.0, epsilon_high: float = 0.28, **kw: object) -> None:
        fn = LigerFusedLinearGRPOLoss(
            beta=beta, compiled=False, use_ref_model=beta != 0.0, chunk_size=2, epsilon_low=0.2,
            epsilon_high=epsilon_high, max_completion_length=t, **kw,
        )  # fmt: skip

        def loss(h: torch.Tensor) -> torch.Tensor:
            res = fn(
                h, w, b["targets"], m.to(torch.long), b["advantages"],
                ref_per_token_logps=b["ref_h"] if beta else None, old_per_token_logps=b["old_h"],
            )  # fmt: skip
            return res[0] if isinstance(res, tuple) else res

        out[name] = peerlib.with_grad(loss, b["hidden"])

    for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "sapo"):
        case(lt, loss_type=lt)
    case("cispo", loss_type="cispo", epsilon_high=5.0)
    case("dapo_kl", beta=0.04, loss_type="dapo")
    case("dapo_kl_bias", beta=0.04, loss_type="dapo", use_bias_correction_kl=True)
    case("dapo_sequence", loss_type="dapo", importance_sampling_level="sequence")
    case("vespo", loss_type="vespo")
    case("luspo", loss_type="luspo", importance_sampling_level="sequence")
    return out


if __name__ == "__main__":
    peerlib.main(run)
