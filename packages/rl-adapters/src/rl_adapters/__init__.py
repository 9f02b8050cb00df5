"""rl-adapters: actor, reference and critic on one base; safe checkpoints; shared-base populations.

One Hugging Face causal LM base with LoRA adapters by role (``actor``, ``reference``,
``critic``), a value head for the critic, checkpoints in safetensors + JSON that never execute
code on load, and populations of agents sharing one frozen base. ``ILQLHeads`` are the V, Q
and target-Q heads of ILQL (arXiv 2206.11871).
"""

from importlib.metadata import version as _version

from rl_adapters.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rl_adapters.ilql_heads import ILQLHeads, ILQLHeadsConfig, ILQLHeadsOutput
from rl_adapters.lora import default_lora_config, linear_module_names, validate_lora_config
from rl_adapters.policy import PolicyModel
from rl_adapters.population import SharedBasePopulation
from rl_adapters.value_head import ValueHead

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
