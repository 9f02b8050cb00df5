"""DeepSpeed ZeRO-2/3 under accelerate: preparing the agent's model and optimizer.

The agent computes every loss with *global* denominators (token or sequence counts summed over
processes), so the gradient it wants is the **sum** of the per-process gradients. DDP-style
averaging (what DeepSpeed does) divides by the world size; :func:`loss_scale` gives the factor
that undoes it. Micro-batches are accumulated by the agent itself: DeepSpeed's
``gradient_accumulation_steps`` must be 1 and the agent marks the last micro-batch of each
minibatch as the accumulation boundary.

Nothing here imports deepspeed unless an accelerator with a DeepSpeed plugin is passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = [
    "deepspeed_plugin",
    "ensure_deepspeed",
    "gathered",
    "is_main_process",
    "prepare_deepspeed",
    "world_size",
    "zero_stage",
]


def deepspeed_plugin(accelerator: Any) -> Any:
    """The accelerator's DeepSpeed plugin, or None (no accelerator, DDP, single process)."""
    if accelerator is None:
        return None
    state = getattr(accelerator, "state", None)
    return getattr(state, "deepspeed_plugin", None)


def zero_stage(accelerator: Any) -> int:
    """The ZeRO stage of the accelerator's DeepSpeed plugin; 0 without DeepSpeed."""
    plugin = deepspeed_plugin(accelerator)
    if plugin is None:
        return 0
    return int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


def world_size() -> int:
    """Processes in the default group (1 when torch.distributed is not initialised)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size())
    return 1


def is_main_process() -> bool:
    """Process 0 of the default group, or the only process."""
    return world_size() == 1 or torch.distributed.get_rank() == 0


def ensure_deepspeed(agent: Any) -> Any:
    """The agent's DeepSpeed engine, built on first use (get_action, learn, checkpoints); or None.

    Raises:
        ValueError: options DeepSpeed cannot run with (the liger loss on an lm_head that
            ZeRO-3 partitions, vLLM generation).
    """
    learner = agent.learner
    if learner.ds_engine is None and learner.uses_deepspeed:
        if agent.config.use_liger_loss and agent.scorer.trainable_partitioned_head():
            raise ValueError(
                "use_liger_loss=True cannot train an lm_head partitioned by ZeRO-3 (full "
                "fine-tuning): use LoRA, ZeRO-2, or use_liger_loss=False"
            )
        if agent.config.use_vllm:
            raise ValueError("use_vllm=True is not supported with DeepSpeed yet: use DDP")
        learner.deepspeed(agent.policy)
        if learner.zero_stage == 3 and world_size() > 1:
            agent.engine.generate_kwargs = {"synced_gpus": True}
    return learner.ds_engine


def _fill(config: dict[str, Any], key: str, value: Any) -> None:
    if config.get(key, "auto") == "auto":
        config[key] = value


def prepare_deepspeed(
    accelerator: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batch_size: int,
    max_grad_norm: float | None,
) -> Any:
    """Wrap ``model`` and ``optimizer`` in a DeepSpeed engine through ``accelerator.prepare``.

    Fills the config's ``"auto"`` entries: ``train_micro_batch_size_per_gpu`` (the agent's
    micro-batch), ``gradient_accumulation_steps`` (1), ``train_batch_size`` and
    ``gradient_clipping`` (``max_grad_norm``, 0 for none).

    Returns:
        The ``deepspeed.DeepSpeedEngine`` (its ``module`` is ``model``, unchanged).

    Raises:
        ValueError: The DeepSpeed config asks for something the agent owns: an ``optimizer`` or
            ``scheduler`` section (the agent builds AdamW and its cosine schedule), or
            ``gradient_accumulation_steps`` other than 1 (use ``micro_batch_size_per_gpu``).
    """
    plugin = deepspeed_plugin(accelerator)
    if plugin is None:
        raise ValueError("`accelerator` has no DeepSpeed plugin")
    config = plugin.deepspeed_config
    for section in ("optimizer", "scheduler"):
        if section in config:
            raise ValueError(
                f"the DeepSpeed config has a {section!r} section: remove it; the agent builds "
                "its own AdamW (lr) and cosine schedule (cosine_lr_schedule_config)"
            )
    _fill(config, "gradient_accumulation_steps", 1)
    if int(config["gradient_accumulation_steps"]) != 1:
        raise ValueError(
            "the DeepSpeed config sets gradient_accumulation_steps="
            f"{config['gradient_accumulation_steps']}: set it to 1 or 'auto'; the agent "
            "accumulates micro-batches itself (micro_batch_size_per_gpu)"
        )
    plugin.gradient_accumulation_steps = 1
    _fill(config, "train_micro_batch_size_per_gpu", micro_batch_size)
    _fill(config, "train_batch_size", int(config["train_micro_batch_size_per_gpu"]) * world_size())
    _fill(config, "gradient_clipping", float(max_grad_norm or 0.0))
    # torch's AdamW also with a ZeRO-Offload'ed optimizer (DeepSpeedCPUAdam needs a C++ build)
    config.setdefault("zero_force_ds_cpu_optimizer", False)
    engine, _ = accelerator.prepare(model, optimizer)
    return engine


@contextlib.contextmanager
def gathered(
    params: Sequence[torch.nn.Parameter | torch.Tensor | None],
    enabled: bool,
    modifier_rank: int | None = None,
) -> Iterator[None]:
    """Under ZeRO-3 (``enabled``), make the full ``params`` available inside the block.

    With ``modifier_rank``, that rank's in-place changes are partitioned back (and so reach
    every rank) on exit; otherwise the gathered values are read-only.
    """
    tensors = [p for p in params if p is not None]
    if not enabled or not tensors:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(tensors, modifier_rank=modifier_rank):
        yield
