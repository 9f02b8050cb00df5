"""``rl-train run`` with ``agent.loss_type`` set to rl-losses' DPPO and DRO names: the YAML
front door reaches them through the registry (no rl-train code names them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_train.cli import main

GRPO_TINY = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny.yaml"


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl", "dro"])
def test_yaml_loss_type_runs(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(GRPO_TINY), f"agent.loss_type={name}", "train.steps=2",
                 "train.evaluation_interval=2", "train.checkpoint_steps=2",
                 f"train.run_dir={tmp_path}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "greedy accuracy after training" in capsys.readouterr().out
