import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rl_train import MetricsLogger, __version__
from rl_train.cli import EXIT_USAGE, main


def test_demo_trains_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's main command, shortened: accuracy rises, the run directory is complete."""
    assert main(["demo", "--steps", "260", "--run-dir", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    before = float(out.split("greedy accuracy before training:")[1].split()[0])
    after = float(out.split("greedy accuracy after training:")[1].split()[0])
    assert before <= 0.2  # near chance (10 possible answers, a random model rarely stops)
    assert after >= 0.9
    for name in ("metrics.csv", "metrics.jsonl", "reward_curve.png", "config.json"):
        assert (tmp_path / name).is_file(), name
    assert any((tmp_path / "tensorboard").iterdir())
    pointer = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert pointer["step"] == 260


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--task", "no_such_task"], "unknown task 'no_such_task'"),
        (["demo", "--steps", "0"], "--steps must be >= 1"),
    ],
)
def test_demo_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert "demo" in capsys.readouterr().err


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["fly"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    exe = shutil.which("rl-train", path=str(Path(sys.executable).parent))
    assert exe is not None, "the rl-train console script is not installed next to the interpreter"
    proc = subprocess.run(
        [exe, "demo", "--task", "nope"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == EXIT_USAGE
    assert "unknown task 'nope'" in proc.stderr


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny.yaml"
SMALL = ["data.n_train=40", "data.n_test=8", "data.prompts_per_step=4", "agent.group_size=4",
         "train.evaluation_interval=2"]  # fmt: skip


def test_overrides_may_follow_flags_in_run_and_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run CONFIG --quiet key=value`` and ``eval CKPT --config X key=value`` (the order
    ``eval --help`` shows) used to fail with the top-level usage."""
    run = tmp_path / "run"
    assert main(["run", str(EXAMPLE), "--quiet", "train.steps=1", *SMALL, "--debug",
                 f"train.run_dir={run}"]) == 0  # fmt: skip
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 1
    capsys.readouterr()
    step = run / "checkpoints" / "step_00000001"
    assert main(["eval", str(step), "--config", str(EXAMPLE), "data.n_test=4"]) == 0
    assert "greedy accuracy:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "usage", "message"),
    [
        (["demo", "--stpes", "3"], "usage: rl-train demo", "did you mean --steps?"),
        (["run", "x.yaml", "--quiet", "--prnt-config"], "usage: rl-train run", "--print-config?"),
        (["eval", "ckpt", "--confg", "x.yaml"], "usage: rl-train eval", "did you mean --config?"),
    ],
)
def test_an_unknown_option_gets_the_subcommands_usage_and_a_suggestion(
    argv: list[str], usage: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "unrecognized arguments" in err and message in err, err


def test_demo_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for default in ("default: successor_digit", "default: 300", "default: runs/demo"):
        assert default in out, out


def test_reward_server_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reward-server", "--reward", "nosuch"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip() == (
        "rl-train: --reward must be demo, exact_match, tagged or module:function, got 'nosuch'"
    )


def test_the_demo_replaces_its_own_run_and_refuses_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rl-train demo`` twice in a row works (the second replaces the first, saying so); a
    run directory that holds another run is left alone."""
    run = tmp_path / "demo"
    for _ in range(2):
        assert main(["demo", "--steps", "1", "--run-dir", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"rl-train demo: replacing the previous demo run in {run}") == 1
    assert [r["step"] for r in MetricsLogger.read(run / "metrics.jsonl")] == [1]
    assert len(list((run / "tensorboard").iterdir())) == 1  # the second run's events only

    other = tmp_path / "other"
    assert main(["run", str(EXAMPLE), "train.steps=1", *SMALL, f"train.run_dir={other}",
                 "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["demo", "--steps", "1", "--run-dir", str(other), "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--run-dir '{other}' holds a run that is not a demo's" in err
    assert len(err.strip().splitlines()) == 1
    assert (other / "config.json").is_file()


def test_eval_follows_a_run_directory_to_its_latest_checkpoint_and_names_a_wrong_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["run", str(EXAMPLE), "train.steps=1", *SMALL, f"train.run_dir={run}",
                 "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    for where in (run, run / "checkpoints"):
        assert main(["eval", str(where), "--config", str(EXAMPLE), "data.n_test=4"]) == 0
        assert "greedy accuracy:" in capsys.readouterr().out

    ppo = Path(__file__).resolve().parents[3] / "examples" / "ppo_tiny.yaml"
    assert main(["eval", str(run), "--config", str(ppo)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "was written by a GRPO agent (algo: grpo), but the config's algo ppo builds" in err
    assert f"pass --config '{run / 'config.json'}'" in err and len(err.strip().splitlines()) == 1
    # the run's resolved config.json is a config the checkpoint evaluates with
    assert main(["eval", str(run), "--config", str(run / "config.json"), "data.n_test=4"]) == 0
    capsys.readouterr()

    (run / "checkpoints" / "latest.json").unlink()  # no pointer: the step directories are named
    assert main(["eval", str(run), "--config", str(EXAMPLE)]) == EXIT_USAGE
    err = capsys.readouterr().err
    step = run / "checkpoints" / "step_00000001"
    assert f"is not a checkpoint (no state.json); pass a step directory, e.g. '{step}'" in err
