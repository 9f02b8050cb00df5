"""rl-train: training loops, the ``rl-train`` command and the embedded demo.

``finetune_llm_reasoning`` / ``finetune_llm_multiturn`` are the seeds' loops (AgileRL's
``agilerl.training.train_llm`` -> ``rl_train``); :class:`MetricsLogger` writes CSV, JSONL and
TensorBoard; :func:`plot_reward_curve` the PNG.
"""

from importlib.metadata import version as _version

from rl_train.hpo import Mutations, TournamentSelection
from rl_train.ilql import ILQLTrainer, make_experience, train_offline
from rl_train.loops import finetune_llm_multiturn, finetune_llm_reasoning, latest_checkpoint
from rl_train.metrics import MetricsLogger, plot_reward_curve
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
    "ILQLTrainer",
    "MetricsLogger",
    "Mutations",
    "TournamentSelection",
    "__version__",
    "available_trainers",
    "finetune_llm_multiturn",
    "finetune_llm_reasoning",
    "get_trainer",
    "latest_checkpoint",
    "make_experience",
    "make_trainer",
    "plot_reward_curve",
    "register_trainer",
    "train_offline",
]
