"""rl-algos: PPO, REINFORCE (ReBN), the GRPO family and offline ILQL for causal LMs.

Assembled from the rl-* packages (adapters, rollout, kernels, losses, advantages), with
AgileRL's API and ``rl_*`` imports: ``from rl_algos import GRPO, LLMPPO, LLMREINFORCE``.
``ILQL`` learns offline from (sequence, reward) pairs and decodes value-guided.
"""

from importlib.metadata import version as _version

from rl_algos.base import Batch, LLMAlgorithm
from rl_algos.checkpoint import save_llm_checkpoint
from rl_algos.config import (
    ActionResult,
    CosineLRScheduleConfig,
    HyperparameterConfig,
    RLParameter,
    VLLMConfig,
)
from rl_algos.grpo import CISPO, GRPO, GSPO, dapo, dr_grpo, reinforce_pp, rloo_agent
from rl_algos.ilql import ILQL
from rl_algos.ppo import LLMPPO
from rl_algos.reinforce import LLMREINFORCE

rloo = rloo_agent

__version__: str = _version("rl-algos")

__all__ = [
    "CISPO",
    "GRPO",
    "GSPO",
    "ILQL",
    "LLMPPO",
    "LLMREINFORCE",
    "ActionResult",
    "Batch",
    "CosineLRScheduleConfig",
    "HyperparameterConfig",
    "LLMAlgorithm",
    "RLParameter",
    "VLLMConfig",
    "__version__",
    "dapo",
    "dr_grpo",
    "reinforce_pp",
    "rloo",
    "rloo_agent",
    "save_llm_checkpoint",
]
