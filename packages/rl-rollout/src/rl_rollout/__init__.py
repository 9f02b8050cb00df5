"""rl-rollout: generation engines with the sampling log-probs the trainer needs.

``HFEngine`` (Hugging Face ``generate``, works on CPU) behind the :class:`Engine` interface;
:class:`SamplingParams`, :func:`process_logits` (the exact processing that was sampled from, for
trainer-side recomputation) and :class:`RolloutResult`.
"""

from importlib.metadata import version as _version

from rl_rollout.engine import Engine, HFEngine, available_engines, get_engine, register_engine
from rl_rollout.params import LogitsHook, SamplingParams, process_logits
from rl_rollout.result import RolloutResult

__version__: str = _version("rl-rollout")

__all__ = [
    "Engine",
    "HFEngine",
    "LogitsHook",
    "RolloutResult",
    "SamplingParams",
    "__version__",
    "available_engines",
    "get_engine",
    "process_logits",
    "register_engine",
]
