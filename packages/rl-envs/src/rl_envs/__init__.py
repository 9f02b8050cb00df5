"""rl-envs: datasets and text environments as the token-level batches RL trains on.

:class:`ReasoningGym` (question/answer datasets, single turn), :class:`TokenObservationWrapper`
and :class:`SyncMultiTurnVecEnv` (multi-turn text environments), :class:`ToolEnvWrapper`
(tool-calling episodes of TRL ``environment_factory``-style classes, :mod:`rl_envs.tools`),
OpenEnv environments in-process or served (:class:`OpenEnvWrapper`, the ``openenv`` extra),
``verifiers`` tasksets scored by their own rewards (:class:`TasksetEnvWrapper`, the
``verifiers`` extra),
OpenRLHF agent files (:mod:`rl_envs.openrlhf_agent`), built-in tasks generated locally
(:mod:`rl_envs.tasks`), reward helpers (:mod:`rl_envs.rewards`) and the AgileRL, TRL, verl and
OpenRLHF reward-function conventions (:mod:`rl_envs.reward_functions`).
"""

from importlib import import_module
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_envs._timeout import EnvTimeoutError
    from rl_envs.multiturn import (
        SyncMultiTurnVecEnv,
        TextEnv,
        TokenObservationWrapper,
        Trajectory,
        TrajectoryBatch,
    )
    from rl_envs.openenv import OpenEnvTextEnv, OpenEnvWrapper
    from rl_envs.reasoning import PromptBatch, ReasoningGym, RewardFunctionError, render_prompt
    from rl_envs.reward_functions import detect_reward_style, verl_reward
    from rl_envs.tools import ToolCall, ToolCallParseError, ToolEnvWrapper
    from rl_envs.verifiers import TasksetEnvWrapper

# Public name -> (submodule, attribute): loaded on first access (PEP 562), so importing the
# package (or a light submodule of it) does not import torch or the model libraries.
_LAZY: dict[str, tuple[str, str]] = {
    "EnvTimeoutError": ("rl_envs._timeout", "EnvTimeoutError"),
    "OpenEnvTextEnv": ("rl_envs.openenv", "OpenEnvTextEnv"),
    "OpenEnvWrapper": ("rl_envs.openenv", "OpenEnvWrapper"),
    "PromptBatch": ("rl_envs.reasoning", "PromptBatch"),
    "ReasoningGym": ("rl_envs.reasoning", "ReasoningGym"),
    "RewardFunctionError": ("rl_envs.reasoning", "RewardFunctionError"),
    "SyncMultiTurnVecEnv": ("rl_envs.multiturn", "SyncMultiTurnVecEnv"),
    "TasksetEnvWrapper": ("rl_envs.verifiers", "TasksetEnvWrapper"),
    "TextEnv": ("rl_envs.multiturn", "TextEnv"),
    "TokenObservationWrapper": ("rl_envs.multiturn", "TokenObservationWrapper"),
    "ToolCall": ("rl_envs.tools", "ToolCall"),
    "ToolCallParseError": ("rl_envs.tools", "ToolCallParseError"),
    "ToolEnvWrapper": ("rl_envs.tools", "ToolEnvWrapper"),
    "Trajectory": ("rl_envs.multiturn", "Trajectory"),
    "TrajectoryBatch": ("rl_envs.multiturn", "TrajectoryBatch"),
    "detect_reward_style": ("rl_envs.reward_functions", "detect_reward_style"),
    "render_prompt": ("rl_envs.reasoning", "render_prompt"),
    "verl_reward": ("rl_envs.reward_functions", "verl_reward"),
}

__version__: str = _version("rl-envs")

__all__ = [
    "EnvTimeoutError",
    "OpenEnvTextEnv",
    "OpenEnvWrapper",
    "PromptBatch",
    "ReasoningGym",
    "RewardFunctionError",
    "SyncMultiTurnVecEnv",
    "TasksetEnvWrapper",
    "TextEnv",
    "TokenObservationWrapper",
    "ToolCall",
    "ToolCallParseError",
    "ToolEnvWrapper",
    "Trajectory",
    "TrajectoryBatch",
    "__version__",
    "detect_reward_style",
    "render_prompt",
    "verl_reward",
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
