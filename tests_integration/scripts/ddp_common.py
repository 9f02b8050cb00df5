"""The agent and the fixed batches shared by the distributed script and its single-process twin."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from peft import LoraConfig
from rl_algos import GRPO
from rl_testing.models import tiny_causal_lm

GROUP = 3
PROMPTS = 4  # global; each of the 2 ranks gets 2
STEPS = 3
L = 14
#: The DeepSpeed runs' extra agent arguments: 2 micro-batches per rank's minibatch (6 rows).
DS_AGENT = {"micro_batch_size_per_gpu": 4, "max_output_tokens": 6}
#: Padding-free training (issue 20): packed rows in micro-batches of at most 20 tokens, so the
#: ranks' rows (lengths 6..14) need different numbers of micro-batches.
PACKED_AGENT = {"use_sequence_packing": True, "micro_batch_tokens": 20}
#: A mixture of experts (LoRA on its attention) with its load-balancing loss weighted 1 (as
#: large as the policy loss), gradient-checkpointed, in two epochs whose second replays the
#: routes the old forward recorded (R2).
MOE_AGENT = {
    "arch": "qwen3_moe",
    "router_aux_loss_coef": 1.0,
    "gradient_checkpointing": True,
    "router_replay": "R2",
    "update_epochs": 2,
}


def make_agent(arch: str = "qwen2", **kw: Any) -> GRPO:
    """The GRPO agent on the tiny ``arch`` (``rl_testing.models.tiny_causal_lm``)."""
    model, tok = tiny_causal_lm(arch, seed=0)  # type: ignore[call-overload]
    return GRPO(
        actor_network=model, pad_token_id=tok.pad_token_id, pad_token=tok.pad_token,
        group_size=GROUP, batch_size=64, lr=1e-2, beta=0.05, max_grad_norm=1.0, seed=3,
        **{"lora_config": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0), **kw},
    )  # fmt: skip


def one_after_another(runs: Iterable[Any], learn: Callable[[Any], Any]) -> None:
    """``learn(run)`` for each run in the same processes, each building its own ``Accelerator``
    (``learn`` returns it) in the one process group; the group is destroyed at the end."""
    from accelerate.state import AcceleratorState, GradientState

    accelerator = None
    for run in runs:
        if accelerator is not None:  # the next run's Accelerator, in the same process group
            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()
        accelerator = learn(run)
    assert accelerator is not None, "no run"
    # destroy the process group before exit: left to interpreter shutdown, gloo's threads
    # sometimes aborted a rank ("terminate called without an active exception", twice in
    # about twenty runs here) after every result was written
    accelerator.end_training()


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """``STEPS`` batches of ``PROMPTS * GROUP`` rows: ids [N, L], masks [N, L-1], rewards [N]."""
    g = torch.Generator().manual_seed(0)
    out = []
    N = PROMPTS * GROUP
    for _ in range(STEPS):
        ids = torch.randint(8, 40, (N, L), generator=g)
        lengths = torch.randint(6, L + 1, (N,), generator=g)
        ids[torch.arange(L)[None] >= lengths[:, None]] = 0
        masks = torch.zeros(N, L - 1, dtype=torch.bool)
        for n in range(N):
            masks[n, 3 : int(lengths[n]) - 1] = True
        rewards = torch.randn(N, generator=g)
        out.append((ids, masks, rewards, N // 2))
    return out


# --------------------------------------------------------------------------- tolerances

#: Two processes (or a ZeRO stage) against one process on the global batch: two routes, equal
#: to float32 rounding (rl_testing.tolerance). The longest sum behind a loss or gradient element
#: is the global batch's 168 tokens (longer than the MLP's 128); the chain from the weights to a
#: loss is 2 decoder layers, the head with its log-softmax and the loss's mean, and a gradient's
#: is that and back. Each earlier optimiser step chains one more forward and backward.
REDUCTION = PROMPTS * GROUP * L
LOSS_STAGES = 4
GRAD_STAGES = 2 * LOSS_STAGES


def assert_step_matches(
    step: int,
    rank_losses: list[float],
    metrics: dict[str, float],
    rank_weights: dict[str, torch.Tensor],
    single: GRPO,
    rank_grad_norm: float | None = None,
) -> None:
    """The ranks' step ``step`` (0-based) against one process's: losses, gradient norm, weights.

    The per-rank losses (global denominators) sum to the global loss, and the gradient norms
    agree, to the derived tolerance. The weights cannot be held to it: Adam moves every weight
    by about ``lr`` per step whatever its gradient's size, so a weight whose exact gradient is 0
    (``k_proj.bias``: softmax ignores a shift shared by all keys) follows its float32 rounding
    noise, differently in each route. The bound on them is ``lr`` per step taken; the losses of
    the following steps check that the routes still compute the same model.
    """
    from rl_testing import tolerance

    earlier = step * GRAD_STAGES  # the optimiser steps taken before this one
    tolerance.assert_close(
        torch.tensor(sum(rank_losses), dtype=torch.float64),
        torch.tensor(metrics["loss"], dtype=torch.float64),
        reduction=REDUCTION,
        stages=LOSS_STAGES + earlier,
        scale=max(1.0, abs(metrics["loss"])),  # the advantages' size: the terms the loss cancels
        dtype=torch.float32,
        msg=f"step {step} loss",
    )
    weights = {n: p.detach() for n, p in single.policy.named_parameters() if p.requires_grad}
    if rank_grad_norm is not None:
        tolerance.assert_close(
            torch.tensor(rank_grad_norm, dtype=torch.float64),
            torch.tensor(metrics["grad_norm"], dtype=torch.float64),
            reduction=max(REDUCTION, sum(w.numel() for w in weights.values())),  # the norm's sum
            stages=GRAD_STAGES + earlier + 1,
            dtype=torch.float32,
            msg=f"step {step} grad_norm",
        )
    assert_weights_match(step + 1, rank_weights, single)


def assert_weights_match(taken: int, rank_weights: dict[str, torch.Tensor], single: GRPO) -> None:
    """The ranks' weights after ``taken`` optimiser steps against one process's: within ``lr``
    per step taken (:func:`assert_step_matches` says why)."""
    from rl_testing import tolerance

    r = tolerance.rtol(torch.float32, reduction=REDUCTION, stages=GRAD_STAGES * max(taken, 1))
    bound = single.lr * taken  # lr per Adam step taken
    for name, p in single.policy.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(
                rank_weights[name],
                p.detach(),
                rtol=r,
                atol=bound,
                msg=lambda m, n=name: f"{n}: {m}",
            )
