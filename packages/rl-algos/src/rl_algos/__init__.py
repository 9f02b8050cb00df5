"""rl-algos: PPO, REINFORCE (ReBN), the GRPO family and offline ILQL for causal LMs.

Assembled from the rl-* packages (adapters, rollout, kernels, losses, advantages), with
AgileRL's API and ``rl_*`` imports: ``from rl_algos import GRPO, LLMPPO, LLMREINFORCE``.
``ILQL`` learns offline from (sequence, reward) pairs and decodes value-guided.
"""

from importlib.metadata import version as _version

from rl_algos.base import AgentParts, LLMAlgorithm
from rl_algos.batch import Batch, Estimates, MicroBatch, Normalizers, Scores, parse_experiences
from rl_algos.checkpoint import save_llm_checkpoint
from rl_algos.config import (
    ActionResult,
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
from rl_algos.objectives import LossTerms, PolicyObjective
from rl_algos.ppo import LLMPPO, PPOConfig
from rl_algos.presets import (
    ALGORITHMS,
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
    "PolicyObjective",
    "Preset",
    "REINFORCEConfig",
    "RLParameter",
    "Scorer",
    "Scores",
    "StepResult",
    "VLLMConfig",
    "__version__",
    "dapo",
    "dr_grpo",
    "get_preset",
    "make_agent",
    "parse_experiences",
    "reinforce_pp",
    "rloo",
    "rloo_agent",
    "save_llm_checkpoint",
]
