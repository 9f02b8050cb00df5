"""rl-envs: datasets and text environments as the token-level batches RL trains on.

:class:`ReasoningGym` (question/answer datasets, single turn), :class:`TokenObservationWrapper`
and :class:`SyncMultiTurnVecEnv` (multi-turn text environments), built-in tasks generated
locally (:mod:`rl_envs.tasks`) and reward helpers (:mod:`rl_envs.rewards`).
"""

from importlib.metadata import version as _version

from rl_envs.multiturn import (
    SyncMultiTurnVecEnv,
    TextEnv,
    TokenObservationWrapper,
    Trajectory,
    TrajectoryBatch,
)
from rl_envs.reasoning import PromptBatch, ReasoningGym, RewardFunctionError, render_prompt

__version__: str = _version("rl-envs")

__all__ = [
    "PromptBatch",
    "ReasoningGym",
    "RewardFunctionError",
    "SyncMultiTurnVecEnv",
    "TextEnv",
    "TokenObservationWrapper",
    "Trajectory",
    "TrajectoryBatch",
    "__version__",
    "render_prompt",
]
