"""Typed configurations shared by the agents (AgileRL's names)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "ActionResult",
    "CosineLRScheduleConfig",
    "HyperparameterConfig",
    "RLParameter",
    "VLLMConfig",
    "cosine_schedule",
]


@dataclass(frozen=True)
class RLParameter:
    """A mutable RL hyperparameter: bounds and the multiplicative mutation step."""

    min: float
    """Smallest value a mutation may produce."""
    max: float
    """Largest value a mutation may produce."""
    shrink_factor: float = 0.8
    """Factor of a downward mutation."""
    grow_factor: float = 1.2
    """Factor of an upward mutation."""
    dtype: type = float
    """``float`` or ``int`` (ints are rounded after mutation)."""

    def __post_init__(self) -> None:
        if not self.min <= self.max:
            raise ValueError(f"RLParameter needs min <= max, got min={self.min}, max={self.max}")
        if not 0 < self.shrink_factor <= 1 <= self.grow_factor:
            raise ValueError(
                "RLParameter needs 0 < shrink_factor <= 1 <= grow_factor, got "
                f"{self.shrink_factor} and {self.grow_factor}"
            )

    def mutate(self, value: float, rng: random.Random) -> float:
        """``value`` times shrink or grow (equal odds), clipped to [min, max]."""
        factor = self.grow_factor if rng.random() < 0.5 else self.shrink_factor
        out = min(self.max, max(self.min, value * factor))
        return float(round(out)) if self.dtype is int else out


@dataclass
class HyperparameterConfig:
    """The hyperparameters evolutionary HPO may mutate, e.g. ``lr=RLParameter(1e-5, 1e-3)``."""

    params: dict[str, RLParameter] = field(default_factory=dict)
    """Name -> bounds; the names are agent attributes (``lr``, ``beta``, ``clip_coef``, ...)."""

    def __init__(self, **params: RLParameter) -> None:
        for name, p in params.items():
            if not isinstance(p, RLParameter):
                raise TypeError(f"hyperparameter {name!r} must be an RLParameter, got {type(p)}")
        self.params = dict(params)

    def names(self) -> list[str]:
        """The mutable hyperparameters."""
        return sorted(self.params)

    def sample(self, rng: random.Random) -> str:
        """A hyperparameter name chosen uniformly."""
        if not self.params:
            raise ValueError("HyperparameterConfig is empty: nothing to mutate")
        return rng.choice(self.names())


@dataclass(frozen=True)
class CosineLRScheduleConfig:
    """Cosine learning-rate decay after a linear warm-up."""

    num_epochs: int
    """Optimizer steps over which the rate decays to ``min_lr_ratio * lr``."""
    warmup_proportion: float = 0.05
    """Fraction of ``num_epochs`` spent warming up linearly from 0."""
    min_lr_ratio: float = 0.0
    """Final rate as a fraction of the peak."""

    def __post_init__(self) -> None:
        if self.num_epochs < 1:
            raise ValueError(f"`num_epochs` must be >= 1, got {self.num_epochs}")
        if not 0 <= self.warmup_proportion < 1:
            raise ValueError(f"`warmup_proportion` must be in [0, 1), got {self.warmup_proportion}")


def cosine_schedule(
    optimizer: torch.optim.Optimizer, config: CosineLRScheduleConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` implementing :class:`CosineLRScheduleConfig`."""
    warmup = int(config.num_epochs * config.warmup_proportion)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, config.num_epochs - warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(frozen=True)
class VLLMConfig:
    """Colocated vLLM settings (``use_vllm=True``); see :class:`rl_rollout.VLLMEngine`."""

    gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory vLLM may take."""
    max_num_seqs: int = 256
    """Sequences decoded concurrently."""
    tensor_parallel_size: int = 1
    """GPUs per engine."""
    sleep_mode: bool = True
    """Free vLLM's memory during training steps."""
    max_model_len: int | None = None
    """Override of the agent's ``max_model_len`` for the engine."""


@dataclass
class ActionResult:
    """What ``get_action`` returns; unpacks as ``completion_ids, action_masks``."""

    completion_ids: list[torch.Tensor]
    """Per prompt, [G, P + T]: prompt and completion, right-padded with the pad id."""
    action_masks: list[torch.Tensor]
    """Per prompt, [G, P + T - 1] bool: True where token t + 1 was generated and counts."""
    sampling_logprobs: list[torch.Tensor] | None = None
    """Per prompt, [G, P + T - 1] sampling log-probs aligned with the action mask, or None."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine details (finish reasons, texts)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        """``completion_ids, action_masks = agent.get_action(prompts)`` (AgileRL's tuple)."""
        return iter((self.completion_ids, self.action_masks))
