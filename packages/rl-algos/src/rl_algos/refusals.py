"""An agent's build-time refusals: unknown arguments, no-effect settings, impossible pairs."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import torch

from rl_algos.config import AgentConfig
from rl_algos.router_balance import router_module_class

__all__ = [
    "DEEPSPEED_ZERO3_MOE_CHECKPOINTING",
    "refuse_agilerl_only",
    "refuse_unbuildable",
    "refuse_unknown",
    "refuse_unused",
    "refuse_with_deepspeed",
]

#: The first DeepSpeed release whose ZeRO-3 gathers a checkpointed mixture-of-experts layer's
#: partitioned weights again when autograd recomputes the layer (0.16.4 to 0.19.2 recompute it
#: with them partitioned; docs/versions.md).
DEEPSPEED_ZERO3_MOE_CHECKPOINTING = "0.19.3"

# Constructor arguments of AgileRL without a field here: name -> (the values that do what this
# library always does, accepted so AgileRL's examples run; why another value is refused).
_IGNORED: dict[str, tuple[tuple[Any, ...], str]] = {
    "calc_position_embeddings": ((True,), "position ids always follow from the padding"),
    "wrap": ((True, False), "models are wrapped when first used"),
    "clone": ((False,), "use agent.clone()"),
    "torch_compiler": ((None,), "use rl-kernels' compile option"),
    "reduce_memory_peak": ((False,), "deprecated upstream"),
    "use_memory_efficient_params": ((False,), "colocated vLLM is configured by VLLMConfig"),
    "cast_logprobs_to_fp32": ((True,), "log-probs are always reduced in fp32"),
    "action_granularity": (
        ("auto",),
        "use advantage_granularity and importance_sampling_level (LLMPPO: a turn is one action)",
    ),
}


def refuse_unknown(agent: str, hyperparameters: dict[str, Any], known: frozenset[str]) -> None:
    """Refuse an argument that is neither a config field (``known``) nor one of AgileRL's.

    Raises:
        TypeError: naming the unexpected arguments of ``agent`` (the class name).
    """
    unknown = sorted(set(hyperparameters) - known - set(_IGNORED))
    if unknown:
        raise TypeError(f"{agent} got unexpected arguments {unknown}")


def refuse_agilerl_only(hyperparameters: dict[str, Any]) -> None:
    """Refuse an AgileRL-only argument set to a value that would change what AgileRL does."""
    for name, value in hyperparameters.items():
        if name in _IGNORED and value not in _IGNORED[name][0]:
            accepted, why = _IGNORED[name]
            raise ValueError(
                f"`{name}={value!r}` has no counterpart here ({why}): leave it unset "
                f"(accepted: {', '.join(repr(v) for v in accepted)})"
            )


def refuse_unused(config: AgentConfig, lora_config: Any, vllm_config: Any, tokenizer: Any) -> None:
    """Refuse a setting that would change nothing (:meth:`AgentConfig.ignored_options`)."""
    ignored = config.ignored_options()
    if ignored:
        raise ValueError(next(iter(ignored.values())))
    if lora_config is not None and config.full_finetune:
        raise ValueError(
            "`lora_config` configures LoRA adapters, and full_finetune=True trains every "
            "weight without them: pass lora_config=None, or full_finetune=False"
        )
    dropout = getattr(lora_config, "lora_dropout", 0.0) if lora_config is not None else 0.0
    if dropout:
        raise ValueError(
            f"`lora_config.lora_dropout`={dropout} has no effect: agents keep the policy in "
            "eval() mode, so the old, reference and current log-probs are those of one "
            "deterministic policy (docs/algorithms/index.md); pass lora_dropout=0.0"
        )
    if vllm_config is not None and not config.use_vllm:
        raise ValueError(
            "`vllm_config` configures the colocated vLLM engine, and use_vllm=False "
            "generates with the Hugging Face engine: pass use_vllm=True, or leave "
            "vllm_config unset"
        )
    if config.stop_sequences and tokenizer is None:
        raise ValueError(
            "`stop_sequences` are text and need a tokenizer to match: pass `tokenizer=`, "
            "or stop on token ids (the model's EOS ids)"
        )


def refuse_unbuildable(
    config: AgentConfig, model_name: str | None, *, critic_adapter: bool
) -> None:
    """Refuse a combination the agent cannot be built with (``critic_adapter``: a LoRA critic)."""
    if config.use_vllm and model_name is None:
        raise ValueError(
            "use_vllm=True needs `model_name` (a hub name or path): vLLM loads the model "
            "itself, and the trained weights are pushed to it after every learn()"
        )
    if config.full_finetune and critic_adapter:
        raise ValueError("full_finetune=True is not supported with a critic (LLMPPO): use LoRA")


def _release(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a version string, or None when it has no such prefix."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return None if found is None else (int(found[1]), int(found[2]), int(found[3]))


def refuse_with_deepspeed(
    config: AgentConfig, model: torch.nn.Module, zero_stage: int, deepspeed: str | None = None
) -> None:
    """Refuse what the installed DeepSpeed cannot run.

    Gradient checkpointing of a mixture-of-experts model under ZeRO-3 needs DeepSpeed
    :data:`DEEPSPEED_ZERO3_MOE_CHECKPOINTING` or later. ``deepspeed`` is the installed version
    (None: read from the installed distribution, only when the check needs it).

    Raises:
        ValueError: naming ``gradient_checkpointing``, ZeRO-3, the installed and the needed
            DeepSpeed.
    """
    if zero_stage != 3 or not config.gradient_checkpointing or router_module_class(model) is None:
        return
    installed = deepspeed or importlib.metadata.version("deepspeed")
    release, needed = _release(installed), _release(DEEPSPEED_ZERO3_MOE_CHECKPOINTING)
    if release is not None and needed is not None and release < needed:
        raise ValueError(
            f"gradient_checkpointing=True on a mixture of experts ({type(model).__name__}) "
            f"under DeepSpeed ZeRO-3 needs deepspeed>={DEEPSPEED_ZERO3_MOE_CHECKPOINTING} "
            f"(installed: {installed}): older releases recompute a checkpointed layer with its "
            "weights still partitioned (a CheckpointError or a size mismatch in the backward); "
            f"upgrade deepspeed, or set gradient_checkpointing=False"
        )
