"""The algorithm table (rl_algos.names): rows, views, the torch-free keyword list, a new row."""

from __future__ import annotations

import subprocess
import sys

import pytest
import rl_algos
from rl_algos.config import config_fields
from rl_algos.names import (
    ALGORITHM_SPECS,
    ALGORITHMS,
    AlgorithmSpec,
    FromArg,
    agent_config_fields,
    batch_rows,
    register_algorithm,
    remove_algorithm,
)
from rl_algos.presets import PRESETS, Preset, get_preset


@pytest.mark.parametrize("name", list(ALGORITHM_SPECS))
def test_each_row_agrees_with_its_agent_class(name: str) -> None:
    spec = ALGORITHM_SPECS[name]
    preset = get_preset(name)
    assert preset.agent is getattr(rl_algos, spec.agent)
    assert spec.critic == preset.agent.uses_critic
    read = agent_config_fields(name)
    assert read is not None and config_fields(preset.agent.config_class) <= set(read)
    assert {"device", "index"} <= set(read)  # constructor keywords beside the config's


def test_keywords_are_read_without_torch() -> None:
    code = (
        "import sys\nfrom rl_algos.names import agent_config_fields\n"
        "assert 'critic_mode' in agent_config_fields('ppo')\nprint('torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout.strip() == "False", proc.stderr


def test_views_follow_the_table() -> None:
    spec = AlgorithmSpec("test_row", "GRPO", {"max_length_norm": FromArg("max_output_tokens")})
    register_algorithm(spec)
    try:
        assert ALGORITHMS[-1] == "test_row" and "test_row" in ALGORITHMS
        assert tuple(PRESETS) == ALGORITHMS and PRESETS["test_row"].spec is spec
        assert spec.resolve({"max_output_tokens": 7}) == {
            "max_output_tokens": 7,
            "max_length_norm": 7,
        }
        register_algorithm(spec)  # the same row again is a no-op
        with pytest.raises(ValueError, match="'test_row' exists already"):
            register_algorithm(AlgorithmSpec("test_row", "GSPO"))
    finally:
        remove_algorithm("test_row")
    assert "test_row" not in ALGORITHMS and "test_row" not in PRESETS


def test_bad_rows_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"AlgorithmSpec\.name must be an identifier"):
        AlgorithmSpec("my algo", "GRPO")
    with pytest.raises(ValueError, match=r"critic=False but LLMPPO\.uses_critic is True"):
        Preset(AlgorithmSpec("ppo_no_critic", "LLMPPO"), rl_algos.LLMPPO)
    with pytest.raises(ValueError, match="unknown algorithm 'nope'; choose one of grpo"):
        get_preset("nope")
    with pytest.raises(ValueError, match="`prompts` and `group_size` must be >= 1"):
        batch_rows(2, 0)
    assert batch_rows(3, 4) == 12
