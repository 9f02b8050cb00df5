"""rl-adapters: actor, reference and critic on one base; safe checkpoints; shared-base populations.

One Hugging Face causal LM base with LoRA adapters by role (``actor``, ``reference``,
``critic``), a value head for the critic, checkpoints in safetensors + JSON that never execute
code on load, and populations of agents sharing one frozen base. ``ILQLHeads`` are the V, Q
and target-Q heads of ILQL (arXiv 2206.11871).
"""

from importlib import import_module
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_adapters.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from rl_adapters.ilql_heads import ILQLHeads, ILQLHeadsConfig, ILQLHeadsOutput
    from rl_adapters.lora import default_lora_config, linear_module_names, validate_lora_config
    from rl_adapters.policy import PolicyModel
    from rl_adapters.population import SharedBasePopulation
    from rl_adapters.value_head import ValueHead

# Public name -> (submodule, attribute): loaded on first access (PEP 562), so importing the
# package (or a light submodule of it) does not import torch or the model libraries.
_LAZY: dict[str, tuple[str, str]] = {
    "CheckpointError": ("rl_adapters.checkpoint", "CheckpointError"),
    "ILQLHeads": ("rl_adapters.ilql_heads", "ILQLHeads"),
    "ILQLHeadsConfig": ("rl_adapters.ilql_heads", "ILQLHeadsConfig"),
    "ILQLHeadsOutput": ("rl_adapters.ilql_heads", "ILQLHeadsOutput"),
    "PolicyModel": ("rl_adapters.policy", "PolicyModel"),
    "SharedBasePopulation": ("rl_adapters.population", "SharedBasePopulation"),
    "ValueHead": ("rl_adapters.value_head", "ValueHead"),
    "default_lora_config": ("rl_adapters.lora", "default_lora_config"),
    "linear_module_names": ("rl_adapters.lora", "linear_module_names"),
    "load_checkpoint": ("rl_adapters.checkpoint", "load_checkpoint"),
    "save_checkpoint": ("rl_adapters.checkpoint", "save_checkpoint"),
    "validate_lora_config": ("rl_adapters.lora", "validate_lora_config"),
}

__version__: str = _version("rl-adapters")

__all__ = [
    "CheckpointError",
    "ILQLHeads",
    "ILQLHeadsConfig",
    "ILQLHeadsOutput",
    "PolicyModel",
    "SharedBasePopulation",
    "ValueHead",
    "__version__",
    "default_lora_config",
    "linear_module_names",
    "load_checkpoint",
    "save_checkpoint",
    "validate_lora_config",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its submodule on first access (PEP 562)."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        try:  # a submodule, as ``pkg.sub`` after ``import pkg`` when the package was eager
            return import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
