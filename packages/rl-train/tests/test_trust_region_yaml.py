"""``rl-train run`` with ``agent.loss_type`` set to rl-losses' DPPO and DRO names, and
``agent.advantage_estimator=max_rl``: the YAML front door reaches them through the registries
(no rl-train code names them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_train.cli import main

GRPO_TINY = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny.yaml"


@pytest.mark.parametrize(
    "override",
    ["agent.loss_type=dppo_tv", "agent.loss_type=dppo_kl", "agent.loss_type=dro",
     "agent.advantage_estimator=max_rl"],
)  # fmt: skip
def test_yaml_names_run(override: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(GRPO_TINY), override, "train.steps=2",
                 "train.evaluation_interval=2", "train.checkpoint_steps=2",
                 f"train.run_dir={tmp_path}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "greedy accuracy after training" in capsys.readouterr().out
