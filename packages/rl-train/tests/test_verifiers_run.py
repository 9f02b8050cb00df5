"""``rl-train run`` with ``env: {verifiers: ...}``: the repository's verifiers taskset
(rl_envs.verifiers_taskset) trains with GRPO on the tiny model, scored by the task's own
``@vf.reward`` (issue 41)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from env_testlib import write
from rl_train.config import ConfigError, load_config
from rl_train.run import train


def test_grpo_learns_the_verifiers_taskset_through_rl_train_run(tmp_path: Path) -> None:
    """The untrained tiny model repeats the question mark (return 0 on every task); ten GRPO
    steps of 4 tasks x 8 episodes take the greedy mean return over the 32 tasks to >= 0.5
    (measured: 0.625, 0.5, 0.625 at seeds 0, 1, 2; a digit is worth 0.5, the asked digit 1)."""
    env = {"verifiers": "rl_envs.verifiers_taskset", "kwargs": {"digits": "0123"}}
    summary = train(load_config(write(tmp_path, env)), verbose=False)
    assert summary.accuracy_before <= 0.1, summary
    assert summary.accuracy_after >= 0.5, summary


def test_a_taskset_that_does_not_resolve_is_a_config_error(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"verifiers": "rl_envs.verifiers_taskset:Nope"}, steps=1))
    with pytest.raises(ConfigError, match=r"env\.verifiers 'rl_envs\.verifiers_taskset:Nope'"):
        train(config, verbose=False)


@pytest.mark.parametrize(
    ("env", "extra"),
    [
        ({"verifiers": "rl_envs.verifiers_taskset"}, "verifiers"),
        ({"openenv_url": "http://127.0.0.1:1", "action_class": "builtins:dict"}, "openenv"),
    ],
)
def test_a_missing_extra_is_a_one_line_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, Any], extra: str
) -> None:
    for name in [m for m in sys.modules if m.partition(".")[0] == extra]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, extra, None)
    config = load_config(write(tmp_path, env, steps=1))
    with pytest.raises(ConfigError) as info:
        train(config, verbose=False)
    assert str(info.value).endswith(f"needs the '{extra}' extra: pip install 'rl-envs[{extra}]'")
