"""Extending is one place: a user module registers a policy loss and an advantage estimator,
and ``rl-train run`` trains with them through a YAML ``imports:`` entry (no edits to our
packages).
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
from rl_train.cli import EXIT_USAGE, main

USER_MODULE = '''
"""A user's objective and estimator, registered by name."""

import inspect
from pathlib import Path

import rl_advantages
import rl_losses
import torch

CALLS = Path({calls!r})
_SURROGATE = set(inspect.signature(rl_losses.clipped_surrogate).parameters)


def _record(what: str) -> None:
    with CALLS.open("a") as f:
        f.write(what + "\\n")


@rl_losses.register_policy_loss({loss!r})
def tight_clip(logprobs, old_logprobs, advantages, mask, **kw):
    """PPO's clipped surrogate with a tighter lower clip (the tweak)."""
    _record("loss")
    kw = {{k: v for k, v in kw.items() if k in _SURROGATE}}
    kw["clip_low"] = 0.1
    return rl_losses.clipped_surrogate(logprobs, old_logprobs, advantages, mask, **kw)


@rl_advantages.register_estimator({estimator!r})
def group_mean_baseline(rewards, group_size, **kw):
    """Reward minus its group's mean (no std scaling)."""
    _record("estimator")
    grouped = rewards.reshape(-1, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
'''


def test_rl_train_run_trains_with_a_registered_loss_and_estimator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:8]
    loss, estimator = f"tight_clip_{tag}", f"group_mean_{tag}"
    calls = tmp_path / "calls.txt"
    module = tmp_path / f"my_objective_{tag}.py"
    module.write_text(USER_MODULE.format(calls=str(calls), loss=loss, estimator=estimator))
    run_dir = tmp_path / "run"
    config = tmp_path / "extend.yaml"
    config.write_text(textwrap.dedent(f"""\
        algo: grpo
        imports: [{module.name}]          # relative: next to this YAML
        model: {{name: tiny}}
        data: {{n_train: 40, n_test: 8, prompts_per_step: 4}}
        train: {{steps: 3, evaluation_interval: 3, checkpoint_steps: 3, run_dir: {run_dir}}}
        agent: {{group_size: 4, loss_type: {loss}, advantage_estimator: {estimator}}}
        """))  # fmt: skip
    code = main(["run", str(config), "--quiet"])
    assert code == 0, capsys.readouterr().err
    seen = calls.read_text().split()
    assert seen.count("estimator") >= 3, seen  # once per step at least
    assert seen.count("loss") >= 3, seen
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert json.loads((run_dir / "config.json").read_text())["agent"]["loss_type"] == loss


def test_a_bad_import_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("imports: [no_such_module_here_xyz]\n")
    assert main(["run", str(config), f"train.run_dir={tmp_path / 'run'}", "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "imports: cannot import 'no_such_module_here_xyz'" in err
    assert len(err.strip().splitlines()) == 1, err
