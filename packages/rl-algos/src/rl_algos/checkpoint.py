"""``save_llm_checkpoint`` (AgileRL's utility name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["save_llm_checkpoint"]


def save_llm_checkpoint(agent: Any, checkpoint_path: str | Path) -> Path:
    """Save ``agent`` (adapters, optimizer, state) to ``checkpoint_path`` atomically.

    Under ``accelerate`` only the main process writes, after a barrier on every process.
    """
    accelerator = getattr(agent, "accelerator", None)
    if accelerator is not None:
        accelerator.wait_for_everyone()
        if not accelerator.is_main_process:
            accelerator.wait_for_everyone()
            return Path(checkpoint_path)
    path: Path = agent.save_checkpoint(checkpoint_path)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return path
