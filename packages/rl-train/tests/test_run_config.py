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
    assert (tmp_path / "reward_curve.png").is_file()  # offline (ilql) runs too
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


def test_scientific_notation_is_a_number_in_files_and_overrides(tmp_path: Path) -> None:
    """PyYAML's YAML 1.1 read ``1e-4`` (no dot) as the string '1e-4'; YAML 1.2 reads a number."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: grpo\nagent:\n  lr: 1e-4\ndata:\n  reward_timeout: 1e3\n")
    config = load_config(cfg)
    assert config.agent["lr"] == 1e-4 and config.data.reward_timeout == 1000.0
    assert load_config(cfg, ["agent.lr=1e-5"]).agent["lr"] == 1e-5
    assert load_config(cfg, ["agent.stop_sequences=['1e3']"]).agent["stop_sequences"] == ["1e3"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["agent.group_size=abc"], "agent.group_size must be an integer >= 1, got 'abc'"),
        (["agent.group_size=2.5"], "agent.group_size must be an integer >= 1, got 2.5"),
        (["agent.max_output_tokens=-1"], "agent.max_output_tokens must be an integer >= 1 or null"),
        (["agent.beta=true"], "agent.beta must be a number >= 0, got True"),
        (["agent.lr='1e-4'"], "agent.lr must be a number >= 0, got '1e-4'"),
        (["agent.stop_sequences=abc"], "agent.stop_sequences must be a list, got 'abc'"),
        (
            ["agent.adv_norm=std"],
            "agent.adv_norm must be one of 'mean_std', 'mean_only', got 'std'",
        ),
        (["data.prompts_per_step=0"], "data.prompts_per_step must be an integer >= 1, got 0"),
        (["data.reward_timeout=abc"], "data.reward_timeout must be a number, got 'abc'"),
        (["train.steps=abc"], "train.steps must be an integer >= 1, got 'abc'"),
        (["train.steps=-1"], "train.steps must be an integer >= 1, got -1"),
        (["train.steps=true"], "train.steps must be an integer >= 1, got True"),
        (["train.evaluation_interval=0"], "train.evaluation_interval must be an integer >= 1"),
        (["train.checkpoint_steps=0"], "train.checkpoint_steps must be an integer >= 1 or null"),
        (["train.checkpoint_steps=-5"], "train.checkpoint_steps must be an integer >= 1 or null"),
        (["model.lora_r=0"], "model.lora_r must be an integer >= 1, got 0"),
        (
            ["model.full_finetune=true", "agent.full_finetune=false"],
            "agent.full_finetune=false contradicts model.full_finetune=true",
        ),
        (
            ["model.name=some/model", "agent.full_finetune=true"],
            "agent.full_finetune=true contradicts model.full_finetune=false",
        ),
        (["model.lora_r=4"], "model.lora_r has no effect: the run trains every weight"),
        (
            ["model.name=some/model", "model.full_finetune=true", "model.lora_alpha=8"],
            "model.lora_alpha has no effect",
        ),
        (["agent.lr=[1,"], "override 'agent.lr=[1,' is not valid YAML at line 1, column 4"),
    ],
)
def test_bad_values_name_the_yaml_key_when_the_config_is_read(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLES / "grpo_tiny.yaml", overrides)
    assert message in str(info.value), info.value
    assert "\n" not in str(info.value) and "<class" not in str(info.value)


def test_a_bad_value_stops_before_anything_is_built_or_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    code = main(["run", str(EXAMPLES / "grpo_tiny.yaml"), "train.steps=-1",
                 f"train.run_dir={run}", "--print-config"])  # fmt: skip
    assert code == EXIT_USAGE
    assert (
        capsys.readouterr().err.strip() == "rl-train: train.steps must be an integer >= 1, got -1"
    )
    assert not run.exists()


def test_bad_yaml_names_the_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: grpo\nmodel:\n  name: tiny\n data: [\n")
    with pytest.raises(ConfigError, match=r"c\.yaml is not valid YAML at line 4, column 2: "):
        load_config(cfg)


def test_settings_an_algorithm_ignores_warn_unless_a_shared_yaml_holds_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agent.group_size`` set for ppo (which samples one completion per prompt) warns; a YAML
    written for grpo and run with ``algo=ppo`` is silent, and so are its LoRA keys on the tiny
    model when the command line picks it."""
    import warnings

    message = r"agent\.group_size=7 is ignored: ppo samples one completion per prompt"
    with pytest.warns(UserWarning, match=message):
        load_config(EXAMPLES / "ppo_tiny.yaml", ["agent.group_size=7"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: ppo\nagent:\n  group_size: 7\n")
    with pytest.warns(UserWarning, match=message):
        load_config(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(EXAMPLES / "grpo_tiny.yaml", ["algo=ppo"]).algo == "ppo"
        tiny = load_config(EXAMPLES / "qwen2.5-0.5b_gsm8k_grpo.yaml", ["model.name=tiny"])
        assert tiny.model.lora_r == 16
    code = main(["run", str(cfg), "agent.group_size=7", "--print-config"])
    assert code == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rl-train: warning: agent.group_size=7"), err


def _small_run(run: Path, *extra: str) -> list[str]:
    return ["run", str(EXAMPLES / "grpo_tiny.yaml"), "data.n_train=40", "data.n_test=8",
            "data.prompts_per_step=4", "agent.group_size=4", "train.evaluation_interval=2",
            "train.checkpoint_steps=2", f"train.run_dir={run}", "--quiet", *extra]  # fmt: skip


def test_a_used_run_dir_is_refused_and_a_resumed_run_reports_what_it_computed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh run in a run directory that holds one would wipe its metrics and mix its
    checkpoints and events; resuming reports the accuracy at the checkpoint (not of a fresh
    model), and resuming a finished run only says so."""
    from rl_train import MetricsLogger

    run = tmp_path / "run"
    assert main(_small_run(run, "train.steps=3")) == 0  # checkpoints at 2 and 3 (the last)
    capsys.readouterr()
    rows = (run / "metrics.jsonl").read_text()
    assert main(_small_run(run, "train.steps=3")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip() == (
        f"rl-train: train.run_dir '{run}' already holds a run (config.json, metrics.jsonl, "
        "metrics.csv, checkpoints, tensorboard, reward_curve.png): pass train.resume=true to "
        "continue it, or choose a new train.run_dir, or delete it"
    )
    assert (run / "metrics.jsonl").read_text() == rows

    assert main(_small_run(run, "train.steps=3", "train.resume=true")) == 0
    out = capsys.readouterr().out
    assert "already finished at step 3" in out and "greedy accuracy" not in out, out
    assert (run / "metrics.jsonl").read_text() == rows

    assert main(_small_run(run, "train.steps=4", "train.resume=true")) == 0
    out = capsys.readouterr().out
    assert "resuming from step 3; greedy accuracy at step 3: " in out, out
    assert "before training" not in out
    assert [r["step"] for r in MetricsLogger.read(run / "metrics.jsonl")] == [1, 2, 3, 4]

    first = tmp_path / "first"
    assert main(_small_run(first, "train.steps=1", "train.resume=true")) == 0
    out = capsys.readouterr().out
    assert f"no checkpoint in {first / 'checkpoints'}; starting at step 1" in out, out


def test_a_resumed_run_loads_its_checkpoint_once(tmp_path: Path) -> None:
    """The accuracy at the checkpoint is reported from the load the loop continues from: the
    agent's weights and optimizer are read once, not once for the report and again to train."""
    from rl_train import MetricsLogger
    from rl_train.run import fit, prepare

    run = tmp_path / "run"
    assert main(_small_run(run, "train.steps=2")) == 0
    overrides = [a for a in _small_run(run, "train.steps=4", "train.resume=true")[2:] if "=" in a]
    built = prepare(load_config(EXAMPLES / "grpo_tiny.yaml", overrides))
    loads: list[bool] = []
    real_load = built.agent.load_checkpoint

    def counted_load(path, load_optimizer=True):  # type: ignore[no-untyped-def]
        loads.append(load_optimizer)
        real_load(path, load_optimizer)

    built.agent.load_checkpoint = counted_load  # type: ignore[method-assign]
    lines: list[str] = []
    summary = fit(built, verbose=False, say=lines.append)
    assert loads == [True]
    assert lines[0].startswith("resuming from step 2; greedy accuracy at step 2: ")
    assert summary.accuracy_before == float(lines[0].rsplit(" ", 1)[1])
    assert [r["step"] for r in MetricsLogger.read(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_run_dir_and_server_failures_are_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(_small_run(afile, "train.steps=1")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip() == f"rl-train: train.run_dir '{afile}' is a file, not a directory: " + (
        "choose a directory"
    )
    assert main(_small_run(afile / "sub", "train.steps=1")) == 1  # an OSError on the way
    err = capsys.readouterr().err
    assert err.startswith("rl-train: train.run_dir: ") and len(err.strip().splitlines()) == 1

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(_small_run(tmp_path / "r", "train.steps=1", f"engine_url=http://127.0.0.1:{port}"))
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("rl-train: engine_url: cannot reach the rollout server"), err
    assert "base_url" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
