"""``rl-train run`` with ``agent.loss_type`` set to rl-losses' DPPO, DRO and Tinker's names, and
``agent.advantage_estimator=max_rl``, ``optimal_token_baseline`` (the agent scores the
vocabulary's squared probabilities it reads) or ``gdpo``: the YAML front door reaches them
through the registries (no rl-train code names them); the names an agent cannot run are
refused before training."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_train.cli import main

GRPO_TINY = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny.yaml"


@pytest.mark.parametrize(
    "override",
    ["agent.loss_type=dppo_tv", "agent.loss_type=dppo_kl", "agent.loss_type=dro",
     "agent.loss_type=importance_sampling", "agent.loss_type=cross_entropy",
     "agent.advantage_estimator=max_rl",
     "agent.advantage_estimator=optimal_token_baseline"],
)  # fmt: skip
def test_yaml_names_run(override: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(GRPO_TINY), override, "train.steps=2",
                 "train.evaluation_interval=2", "train.checkpoint_steps=2",
                 f"train.run_dir={tmp_path}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "greedy accuracy after training" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "reason"),
    [("agent.loss_type=stable_reinforce", "formula is not published")],
)  # fmt: skip
def test_yaml_names_refused(
    override: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", str(GRPO_TINY), override, f"train.run_dir={tmp_path}", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert override.split(".")[1].split("=", maxsplit=1)[0] in err
    assert reason in err


def test_yaml_gdpo_reads_each_reward_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GDPO with two reward functions: the environment's per-function scores and weights reach
    the estimator through the rollout (without them ``gdpo`` raises, naming what is missing)."""
    config = tmp_path / "gdpo.yaml"
    text = GRPO_TINY.read_text().replace(
        "  task: successor_digit\n",
        "  task: successor_digit\n  reward: [demo, exact_match]\n  reward_weights: [1.0, 0.5]\n",
    )
    config.write_text(text + "  advantage_estimator: gdpo\n")
    code = main(["run", str(config), "train.steps=2", "train.evaluation_interval=2",
                 "train.checkpoint_steps=2", f"train.run_dir={tmp_path / 'run'}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "greedy accuracy after training" in capsys.readouterr().out
