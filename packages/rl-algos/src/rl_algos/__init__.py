"""rl-algos: PPO, REINFORCE (ReBN), the GRPO family and offline ILQL for causal LMs.

Assembled from the rl-* packages (adapters, rollout, kernels, losses, advantages), with
AgileRL's API and ``rl_*`` imports: ``from rl_algos import GRPO, LLMPPO, LLMREINFORCE``.
``ILQL`` learns offline from (sequence, reward) pairs and decodes value-guided.

Importing the package is cheap: every public name loads its submodule (and torch) on first
access, and :mod:`rl_algos.names` (the algorithm table) is read without torch.
"""

from importlib import import_module
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_algos.base import AgentParts, LLMAlgorithm
    from rl_algos.batch import (
        ActionResult,
        Batch,
        Estimates,
        MicroBatch,
        Normalizers,
        Rollout,
        Scores,
        parse_experiences,
    )
    from rl_algos.checkpoint import save_llm_checkpoint
    from rl_algos.config import (
        AgentConfig,
        CosineLRScheduleConfig,
        HyperparameterConfig,
        RLParameter,
        VLLMConfig,
    )
    from rl_algos.estimators import GroupAdvantage
    from rl_algos.grpo import CISPO, GRPO, GSPO, GRPOConfig
    from rl_algos.ilql import ILQL, ILQLConfig
    from rl_algos.learner import Learner, StepResult
    from rl_algos.microbatch import RowSplit, token_budget_groups
    from rl_algos.names import ALGORITHMS, AlgorithmSpec, batch_rows, register_algorithm
    from rl_algos.objectives import LossTerms, PolicyObjective
    from rl_algos.packing import PackedRows, pack_rows
    from rl_algos.ppo import LLMPPO, PPOConfig
    from rl_algos.presets import (
        PRESETS,
        Preset,
        dapo,
        dr_grpo,
        get_preset,
        make_agent,
        reinforce_pp,
        rloo_agent,
    )
    from rl_algos.reinforce import LLMREINFORCE, REINFORCEConfig
    from rl_algos.scoring import Scorer

    rloo = rloo_agent

# Public name -> (submodule, attribute): loaded on first access (PEP 562), so importing the
# package (or a light submodule of it) does not import torch or the model libraries.
_LAZY: dict[str, tuple[str, str]] = {
    "ALGORITHMS": ("rl_algos.names", "ALGORITHMS"),
    "AlgorithmSpec": ("rl_algos.names", "AlgorithmSpec"),
    "ActionResult": ("rl_algos.batch", "ActionResult"),
    "AgentConfig": ("rl_algos.config", "AgentConfig"),
    "AgentParts": ("rl_algos.base", "AgentParts"),
    "Batch": ("rl_algos.batch", "Batch"),
    "Rollout": ("rl_algos.batch", "Rollout"),
    "CISPO": ("rl_algos.grpo", "CISPO"),
    "CosineLRScheduleConfig": ("rl_algos.config", "CosineLRScheduleConfig"),
    "Estimates": ("rl_algos.batch", "Estimates"),
    "GRPO": ("rl_algos.grpo", "GRPO"),
    "GRPOConfig": ("rl_algos.grpo", "GRPOConfig"),
    "GSPO": ("rl_algos.grpo", "GSPO"),
    "GroupAdvantage": ("rl_algos.estimators", "GroupAdvantage"),
    "HyperparameterConfig": ("rl_algos.config", "HyperparameterConfig"),
    "ILQL": ("rl_algos.ilql", "ILQL"),
    "ILQLConfig": ("rl_algos.ilql", "ILQLConfig"),
    "LLMAlgorithm": ("rl_algos.base", "LLMAlgorithm"),
    "LLMPPO": ("rl_algos.ppo", "LLMPPO"),
    "LLMREINFORCE": ("rl_algos.reinforce", "LLMREINFORCE"),
    "Learner": ("rl_algos.learner", "Learner"),
    "LossTerms": ("rl_algos.objectives", "LossTerms"),
    "MicroBatch": ("rl_algos.batch", "MicroBatch"),
    "Normalizers": ("rl_algos.batch", "Normalizers"),
    "PPOConfig": ("rl_algos.ppo", "PPOConfig"),
    "PackedRows": ("rl_algos.packing", "PackedRows"),
    "PRESETS": ("rl_algos.presets", "PRESETS"),
    "PolicyObjective": ("rl_algos.objectives", "PolicyObjective"),
    "Preset": ("rl_algos.presets", "Preset"),
    "REINFORCEConfig": ("rl_algos.reinforce", "REINFORCEConfig"),
    "RLParameter": ("rl_algos.config", "RLParameter"),
    "RowSplit": ("rl_algos.microbatch", "RowSplit"),
    "Scorer": ("rl_algos.scoring", "Scorer"),
    "Scores": ("rl_algos.batch", "Scores"),
    "StepResult": ("rl_algos.learner", "StepResult"),
    "VLLMConfig": ("rl_algos.config", "VLLMConfig"),
    "batch_rows": ("rl_algos.names", "batch_rows"),
    "dapo": ("rl_algos.presets", "dapo"),
    "dr_grpo": ("rl_algos.presets", "dr_grpo"),
    "get_preset": ("rl_algos.presets", "get_preset"),
    "make_agent": ("rl_algos.presets", "make_agent"),
    "pack_rows": ("rl_algos.packing", "pack_rows"),
    "parse_experiences": ("rl_algos.batch", "parse_experiences"),
    "register_algorithm": ("rl_algos.names", "register_algorithm"),
    "reinforce_pp": ("rl_algos.presets", "reinforce_pp"),
    "rloo": ("rl_algos.presets", "rloo_agent"),
    "rloo_agent": ("rl_algos.presets", "rloo_agent"),
    "save_llm_checkpoint": ("rl_algos.checkpoint", "save_llm_checkpoint"),
    "token_budget_groups": ("rl_algos.microbatch", "token_budget_groups"),
}

__version__: str = _version("rl-algos")

__all__ = [
    "ALGORITHMS",
    "CISPO",
    "GRPO",
    "GSPO",
    "ILQL",
    "LLMPPO",
    "LLMREINFORCE",
    "PRESETS",
    "ActionResult",
    "AgentConfig",
    "AgentParts",
    "AlgorithmSpec",
    "Batch",
    "CosineLRScheduleConfig",
    "Estimates",
    "GRPOConfig",
    "GroupAdvantage",
    "HyperparameterConfig",
    "ILQLConfig",
    "LLMAlgorithm",
    "Learner",
    "LossTerms",
    "MicroBatch",
    "Normalizers",
    "PPOConfig",
    "PackedRows",
    "PolicyObjective",
    "Preset",
    "REINFORCEConfig",
    "RLParameter",
    "Rollout",
    "RowSplit",
    "Scorer",
    "Scores",
    "StepResult",
    "VLLMConfig",
    "__version__",
    "batch_rows",
    "dapo",
    "dr_grpo",
    "get_preset",
    "make_agent",
    "pack_rows",
    "parse_experiences",
    "register_algorithm",
    "reinforce_pp",
    "rloo",
    "rloo_agent",
    "save_llm_checkpoint",
    "token_budget_groups",
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
