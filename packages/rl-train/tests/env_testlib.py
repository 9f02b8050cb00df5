"""An ``rl-train run`` config on an ``env:`` section (OpenEnv, verifiers), for the env tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(tmp_path: Path, env: dict[str, Any], **train_keys: Any) -> Path:
    """GRPO on the tiny model, 4 tasks x 8 episodes a step, 10 steps (``train_keys`` override
    the ``train:`` section), written to ``tmp_path / "run.json"`` (JSON is YAML)."""
    config = {
        "algo": "grpo",
        "model": {"name": "tiny"},
        "env": env,
        "data": {"prompts_per_step": 4},
        "agent": {"group_size": 8},
        "train": {
            "steps": 10,
            "evaluation_interval": 1000,
            "checkpoint_steps": None,
            "run_dir": str(tmp_path / "run"),
            "report_to": "none",
            **train_keys,
        },
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    return path
