"""``save_llm_checkpoint`` (AgileRL's utility name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["save_llm_checkpoint"]


def save_llm_checkpoint(agent: Any, checkpoint_path: str | Path) -> Path:
    """Save ``agent`` (adapters, optimizer, state) to ``checkpoint_path`` atomically.

    Call it on every process: under ``accelerate`` / ``torchrun`` the weights are gathered
    where ZeRO-3 partitions them, the main process writes, and every process waits for it.
    """
    path: Path = agent.save_checkpoint(checkpoint_path)
    return path
