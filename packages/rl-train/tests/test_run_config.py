"""`rl-train run` / `rl-train eval` with YAML configs: the examples run, bad configs fail cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_train.cli import EXIT_USAGE, main
from rl_train.config import ConfigError, load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CPU_EXAMPLES = sorted(p for p in EXAMPLES.glob("*_tiny.yaml"))


def test_every_algorithm_has_a_cpu_example() -> None:
    from rl_algos import ALGORITHMS

    assert sorted(p.name.removesuffix("_tiny.yaml") for p in CPU_EXAMPLES) == sorted(ALGORITHMS)


@pytest.mark.parametrize("path", CPU_EXAMPLES, ids=lambda p: p.stem)
def test_cpu_example_configs_run_a_few_steps(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", str(path), "train.steps=2", "train.evaluation_interval=2",
                 "train.checkpoint_steps=2", f"train.run_dir={tmp_path}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "greedy accuracy after training" in capsys.readouterr().out
    assert (tmp_path / "config.json").is_file()
    assert (tmp_path / "checkpoints" / "latest.json").is_file()
    # and the checkpoint evaluates
    assert (
        main(["eval", str(tmp_path / "checkpoints" / "step_00000002"), "--config", str(path)]) == 0
    )
    assert "greedy accuracy:" in capsys.readouterr().out


def test_gpu_example_parses() -> None:
    config = load_config(EXAMPLES / "qwen2.5-0.5b_gsm8k_grpo.yaml")
    assert config.model.name == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.agent["group_size"] == 8


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("algo: grpo\nmodel:\n  name: /no/such/model\n", [], "cannot load model '/no/such/model'"),
        ("algo: grpoo\n", [], "unknown algorithm 'grpoo'; did you mean 'grpo'?"),
        ("algo: grpo\ntrian:\n  steps: 3\n", [], "unknown key 'trian'; did you mean 'train'?"),
        (
            "algo: grpo\ntrain:\n  stepz: 3\n",
            [],
            "unknown key 'train.stepz'; did you mean 'train.steps'?",
        ),
        ("algo: grpo\ndata:\n  task: no_such_task\n", [], "unknown task 'no_such_task'"),
        (
            "deepspeed_config: /no/ds.json\n",
            [],
            "deepspeed_config file '/no/ds.json' does not exist",
        ),
        ("train:\n  steps: many\n", [], "train.steps must be"),
        ("algo: ilql\n", [], "algo: ilql learns offline: set data.offline_path"),
        (
            "algo: ilql\ndata:\n  offline_path: /no/logged.jsonl\n",
            [],
            "data.offline_path '/no/logged.jsonl' does not exist",
        ),
        ("algo: grpo\n", ["train.steps"], "must look like key=value"),
        (
            "algo: grpo\nagent:\n  no_such_arg: 1\n",
            ["train.steps=1"],
            "unexpected arguments ['no_such_arg']",
        ),
    ],
)
def test_bad_configs_are_one_line_exit_2(
    yaml_text: str,
    overrides: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    code = main(["run", str(cfg), *overrides, f"train.run_dir={tmp_path / 'run'}", "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert message in err, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "/no/such.yaml"]) == EXIT_USAGE
    assert "config file '/no/such.yaml' does not exist" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: nope\n")
    with pytest.raises(ConfigError, match="unknown algorithm"):
        main(["run", str(cfg), "--debug"])


@pytest.mark.parametrize(
    ("content", "launched", "message"),
    [
        ('{"zero_optimization": {"stage": 2}}', False, "deepspeed_config needs a launcher"),
        ("zero_optimization: 2", True, "is not a readable JSON file"),
    ],
)
def test_bad_deepspeed_setups_are_one_line_exit_2(
    content: str,
    launched: bool,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(content)
    if launched:
        monkeypatch.setenv("WORLD_SIZE", "1")
    else:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"deepspeed_config: {ds}\n")
    code = main(["run", str(cfg), f"train.run_dir={tmp_path / 'run'}", "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_bad_offline_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "logged.jsonl"
    data.write_text('{"sample": ["1", "2"], "reward": 1.0}\n{"sample": ["3", "4"]}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"algo: ilql\ndata:\n  offline_path: {data}\n")
    assert main(["run", str(cfg), f"train.run_dir={tmp_path / 'run'}", "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "data.offline_path line 2" in err and len(err.strip().splitlines()) == 1, err


def test_imports_run_user_code_before_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``.py`` path in ``imports`` (relative to the YAML) defines a reward named in
    ``data.reward`` as ``module:function``; it scores the training samples."""
    calls = tmp_path / "calls.txt"
    (tmp_path / "user_reward_mod.py").write_text(
        "from pathlib import Path\n\n\n"
        "def reward(completion, answer, question):\n"
        f"    with Path({str(calls)!r}).open('a') as f:\n"
        "        f.write('r\\n')\n"
        "    return float(completion.strip() == answer)\n"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text("imports: [user_reward_mod.py]\ndata:\n  reward: user_reward_mod:reward\n"
                   "  n_train: 40\n  n_test: 8\n  prompts_per_step: 4\nagent:\n  group_size: 4\n")  # fmt: skip
    code = main(["run", str(cfg), "train.steps=1", "train.checkpoint_steps=null",
                 f"train.run_dir={tmp_path / 'run'}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert len(calls.read_text().split()) >= 16  # 4 prompts x 4 samples, plus the evaluations


@pytest.mark.parametrize(
    ("imports", "message"),
    [
        ("[missing_file.py]", "imports: file "),
        ("[broken_mod.py]", "imports: cannot import"),
        ("not_a_list", "imports must be"),
    ],
)
def test_bad_imports_are_one_line_exit_2(
    imports: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"imports: {imports}\n")
    code = main(["run", str(cfg), f"train.run_dir={tmp_path / 'run'}", "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_packing_options_reach_the_agent_from_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agent:`` keys pass through: ``use_sequence_packing`` and ``micro_batch_tokens``
    (issue 20) reach the agent and train."""
    config = load_config(
        EXAMPLES / "grpo_tiny.yaml",
        ["agent.use_sequence_packing=true", "agent.micro_batch_tokens=64"],
    )
    assert config.agent["use_sequence_packing"] is True
    assert config.agent["micro_batch_tokens"] == 64
    auto = load_config(EXAMPLES / "qwen2.5-0.5b_gsm8k_grpo.yaml", [])
    assert auto.agent["use_sequence_packing"] == "auto"  # AgentConfig reads it as None
    code = main(["run", str(EXAMPLES / "grpo_tiny.yaml"), "train.steps=2",
                 "train.evaluation_interval=2", "train.checkpoint_steps=2",
                 f"train.run_dir={tmp_path}", "agent.use_sequence_packing=true",
                 "agent.micro_batch_tokens=64", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err


def test_lean_forwards_reaches_the_agent_from_yaml() -> None:
    """``agent.lean_forwards`` passes through to the agent's policy: False swaps
    nothing, the default "auto" the tiny Qwen2's rotary, RMSNorm and SwiGLU."""
    from rl_train.builder import build

    off = build(
        load_config(EXAMPLES / "grpo_tiny.yaml", ["agent.lean_forwards=false"]), distributed=False
    )
    assert off.agent.lean_report.mode is False and off.agent.lean_report.swapped == ()
    auto = build(
        load_config(EXAMPLES / "grpo_tiny.yaml", ["agent.lean_forwards=auto"]), distributed=False
    )
    assert auto.agent.lean_report.mode == "auto"
    assert auto.agent.lean_report.forwards == ("rotary", "rms_norm", "swiglu")  # full fine-tuning
