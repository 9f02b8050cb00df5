"""rl-train: one training loop, its sources and hooks, the builder, the ``rl-train`` command.

``finetune_llm_reasoning`` / ``finetune_llm_multiturn`` are the seeds' loops (AgileRL's
``agilerl.training.train_llm`` -> ``rl_train``), thin layers over :func:`train_loop`, as are
``offline_learning_loop`` / ``train_offline`` and the trlX-style trainers. :func:`build` makes
model, environment and agent from a :class:`RunConfig`; :class:`MetricsLogger` writes CSV,
JSONL and TensorBoard; :func:`plot_reward_curve` the PNG.

Modules, bottom to top (each imports only those before it): ``tiny``, ``collective``,
``user_code``, ``config`` (its private ``_config_*`` and ``_run_dir`` modules first),
``settings``, ``metrics``, ``checkpoint``, ``offline``, ``evaluation``, ``sources``, ``hooks``,
``loop``, ``rollout_worker``, ``async_loop``, ``loops``, ``builder``, ``hpo``, ``run``,
``trainer``, ``ilql``, ``demo``, ``ilql_demo``, ``trl``, ``cli``.
"""

from importlib import import_module
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_train.async_loop import AsyncReasoningSource, RolloutWorkerError
    from rl_train.builder import Built, build
    from rl_train.checkpoint import latest_checkpoint
    from rl_train.config import AsyncConfig, RunConfig, load_config
    from rl_train.hooks import Hook, LoopState
    from rl_train.hpo import Mutations, TournamentSelection
    from rl_train.ilql import ILQLTrainer, train_offline
    from rl_train.loop import train_loop
    from rl_train.loops import finetune_llm_multiturn, finetune_llm_reasoning, offline_learning_loop
    from rl_train.metrics import MetricsLogger, plot_reward_curve
    from rl_train.offline import OfflineDataset, make_experience
    from rl_train.rollout_worker import RolloutPieces
    from rl_train.sources import MultiTurnSource, OfflineSource, ReasoningSource
    from rl_train.trainer import (
        AgentTrainer,
        BaseRLTrainer,
        available_trainers,
        get_trainer,
        make_trainer,
        register_trainer,
    )

# Public name -> (submodule, attribute): loaded on first access (PEP 562), so importing the
# package (or a light submodule of it) does not import torch or the model libraries.
_LAZY: dict[str, tuple[str, str]] = {
    "AgentTrainer": ("rl_train.trainer", "AgentTrainer"),
    "AsyncConfig": ("rl_train.config", "AsyncConfig"),
    "AsyncReasoningSource": ("rl_train.async_loop", "AsyncReasoningSource"),
    "BaseRLTrainer": ("rl_train.trainer", "BaseRLTrainer"),
    "Built": ("rl_train.builder", "Built"),
    "Hook": ("rl_train.hooks", "Hook"),
    "ILQLTrainer": ("rl_train.ilql", "ILQLTrainer"),
    "LoopState": ("rl_train.hooks", "LoopState"),
    "MetricsLogger": ("rl_train.metrics", "MetricsLogger"),
    "MultiTurnSource": ("rl_train.sources", "MultiTurnSource"),
    "Mutations": ("rl_train.hpo", "Mutations"),
    "OfflineDataset": ("rl_train.offline", "OfflineDataset"),
    "OfflineSource": ("rl_train.sources", "OfflineSource"),
    "ReasoningSource": ("rl_train.sources", "ReasoningSource"),
    "RolloutPieces": ("rl_train.rollout_worker", "RolloutPieces"),
    "RolloutWorkerError": ("rl_train.async_loop", "RolloutWorkerError"),
    "RunConfig": ("rl_train.config", "RunConfig"),
    "TournamentSelection": ("rl_train.hpo", "TournamentSelection"),
    "available_trainers": ("rl_train.trainer", "available_trainers"),
    "build": ("rl_train.builder", "build"),
    "finetune_llm_multiturn": ("rl_train.loops", "finetune_llm_multiturn"),
    "finetune_llm_reasoning": ("rl_train.loops", "finetune_llm_reasoning"),
    "get_trainer": ("rl_train.trainer", "get_trainer"),
    "latest_checkpoint": ("rl_train.checkpoint", "latest_checkpoint"),
    "load_config": ("rl_train.config", "load_config"),
    "make_experience": ("rl_train.offline", "make_experience"),
    "make_trainer": ("rl_train.trainer", "make_trainer"),
    "offline_learning_loop": ("rl_train.loops", "offline_learning_loop"),
    "plot_reward_curve": ("rl_train.metrics", "plot_reward_curve"),
    "register_trainer": ("rl_train.trainer", "register_trainer"),
    "train_loop": ("rl_train.loop", "train_loop"),
    "train_offline": ("rl_train.ilql", "train_offline"),
}

__version__: str = _version("rl-train")

# Modules whose import completes another's registry: the trainer registry of
# ``rl_train.trainer`` holds ILQL's trainer once ``rl_train.ilql`` is imported (as it was when
# ``import rl_train`` imported every module).
_LOAD_WITH: dict[str, tuple[str, ...]] = {"rl_train.trainer": ("rl_train.ilql",)}

__all__ = [
    "AgentTrainer",
    "AsyncConfig",
    "AsyncReasoningSource",
    "BaseRLTrainer",
    "Built",
    "Hook",
    "ILQLTrainer",
    "LoopState",
    "MetricsLogger",
    "MultiTurnSource",
    "Mutations",
    "OfflineDataset",
    "OfflineSource",
    "ReasoningSource",
    "RolloutPieces",
    "RolloutWorkerError",
    "RunConfig",
    "TournamentSelection",
    "__version__",
    "available_trainers",
    "build",
    "finetune_llm_multiturn",
    "finetune_llm_reasoning",
    "get_trainer",
    "latest_checkpoint",
    "load_config",
    "make_experience",
    "make_trainer",
    "offline_learning_loop",
    "plot_reward_curve",
    "register_trainer",
    "train_loop",
    "train_offline",
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
    for also in _LOAD_WITH.get(module, ()):
        import_module(also)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
