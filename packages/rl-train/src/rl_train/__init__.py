"""rl-train: one training loop, its sources and hooks, the builder, the ``rl-train`` command.

``finetune_llm_reasoning`` / ``finetune_llm_multiturn`` are the seeds' loops (AgileRL's
``agilerl.training.train_llm`` -> ``rl_train``), thin layers over :func:`train_loop`, as are
``offline_learning_loop`` / ``train_offline`` and the trlX-style trainers. :func:`build` makes
model, environment and agent from a :class:`RunConfig`; :class:`MetricsLogger` writes CSV,
JSONL and TensorBoard; :func:`plot_reward_curve` the PNG.

Modules, bottom to top (each imports only those before it): ``tiny``, ``collective``,
``config``, ``metrics``, ``checkpoint``, ``offline``, ``evaluation``, ``sources``, ``hooks``,
``loop``, ``loops``, ``builder``, ``hpo``, ``run``, ``trainer``, ``ilql``, ``demo``,
``ilql_demo``, ``cli``.
"""

from importlib.metadata import version as _version

from rl_train.builder import Built, build
from rl_train.checkpoint import latest_checkpoint
from rl_train.config import RunConfig, load_config
from rl_train.hooks import Hook, LoopState
from rl_train.hpo import Mutations, TournamentSelection
from rl_train.ilql import ILQLTrainer, train_offline
from rl_train.loop import train_loop
from rl_train.loops import finetune_llm_multiturn, finetune_llm_reasoning, offline_learning_loop
from rl_train.metrics import MetricsLogger, plot_reward_curve
from rl_train.offline import OfflineDataset, make_experience
from rl_train.sources import MultiTurnSource, OfflineSource, ReasoningSource
from rl_train.trainer import (
    AgentTrainer,
    BaseRLTrainer,
    available_trainers,
    get_trainer,
    make_trainer,
    register_trainer,
)

__version__: str = _version("rl-train")

__all__ = [
    "AgentTrainer",
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
