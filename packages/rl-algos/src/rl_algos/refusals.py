"""An agent's build-time refusals: unknown arguments, no-effect settings, impossible pairs."""

from __future__ import annotations

from typing import Any

from rl_algos.config import AgentConfig

__all__ = [
    "refuse_agilerl_only",
    "refuse_unbuildable",
    "refuse_unknown",
    "refuse_unused",
]

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
