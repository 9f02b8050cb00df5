"""The command line answers before torch: ``--help`` and config errors import no model library.

Each check runs in a fresh interpreter (a subprocess), because the test process itself has
long imported torch. ``sys.modules`` after the command tells what was imported.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = {
    "torch",
    "transformers",
    "peft",
    "datasets",
    "accelerate",
    "tensorboard",
    "matplotlib",
    "deepspeed",
    "vllm",
}

# Runs the ``rl-train`` main with ``argv`` and prints the exit status and the heavy modules
# that were imported, as JSON on the last line.
_PROBE = """
import json, sys
from rl_train.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:  # --help / --version / argparse errors
    status = exc.code if isinstance(exc.code, int) else 1
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(%r)))
print(json.dumps({"status": status, "heavy": heavy}))
"""


def _probe(argv: list[str], cwd: Path) -> tuple[int, list[str], str, str]:
    code = _PROBE % json.dumps(sorted(HEAVY))
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    assert proc.stdout.strip(), proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["status"], result["heavy"], proc.stdout, proc.stderr


def _heavy_imports(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(sorted({{m.split('.')[0] for m in sys.modules}}))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(eval(proc.stdout.strip().splitlines()[-1]))  # a printed list of str
    return sorted(loaded & HEAVY)


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["demo", "--help"], ["--version"]])
def test_help_imports_no_model_library(argv: list[str], tmp_path: Path) -> None:
    status, heavy, out, _ = _probe(argv, tmp_path)
    assert status == 0
    assert "rl-train" in out
    assert heavy == []


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("train:\n  stepz: 3\n", [], "unknown key 'train.stepz'; did you mean 'train.steps'?"),
        ("algo: grpoo\n", [], "unknown algorithm 'grpoo'; did you mean 'grpo'?"),
        ("train:\n  steps: many\n", [], "train.steps must be"),
        ("algo: grpo\n", ["train.stepz=3"], "did you mean 'train.steps'?"),
        ("data:\n  train_path: nowhere.jsonl\n", [], "data.train_path 'nowhere.jsonl'"),
        ("deepspeed_config: nowhere.json\n", [], "deepspeed_config file 'nowhere.json'"),
    ],
)
def test_config_errors_answer_before_torch(
    yaml_text: str, overrides: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "bad.yaml").write_text(yaml_text)
    status, heavy, _, err = _probe(["run", "bad.yaml", *overrides], tmp_path)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rl-train: ") and message in lines[0]
    assert heavy == []


def test_missing_config_file_answers_before_torch(tmp_path: Path) -> None:
    status, heavy, _, err = _probe(["run", "missing.yaml"], tmp_path)
    assert status == 2
    assert err.strip() == "rl-train: config file 'missing.yaml' does not exist"
    assert heavy == []


def test_bad_demo_arguments_answer_before_torch(tmp_path: Path) -> None:
    status, heavy, _, err = _probe(["demo", "--task", "no_such_task"], tmp_path)
    assert status == 2
    assert "unknown task 'no_such_task'" in err
    assert heavy == []
    status, heavy, _, err = _probe(["demo", "--algo", "nope"], tmp_path)
    assert status == 2  # argparse: invalid choice, from rl_algos.ALGORITHMS
    assert "invalid choice" in err
    assert heavy == []


def test_packages_import_cheaply() -> None:
    """The packages themselves load their heavy parts only on first use of a name."""
    assert _heavy_imports("import rl_train, rl_algos, rl_envs") == []
    assert _heavy_imports("from rl_algos.names import ALGORITHMS; import rl_train.config") == []
    assert _heavy_imports("from rl_envs.tasks import available_tasks; available_tasks()") == []


def test_full_finetune_path_imports_no_lora_or_logging_library() -> None:
    """Building the demo (full fine-tuning) needs neither peft nor tensorboard nor matplotlib."""
    heavy = _heavy_imports(
        "from rl_train.demo import DemoConfig\n"
        "from rl_train.builder import build\n"
        "build(DemoConfig(steps=1).run_config('unused'), distributed=False)"
    )
    assert "torch" in heavy and "transformers" in heavy
    assert not {"peft", "tensorboard", "matplotlib", "deepspeed", "vllm"} & set(heavy)


def test_public_names_still_import() -> None:
    """Laziness keeps every public name where it was."""
    import rl_algos
    import rl_train

    for module in (rl_algos, rl_train):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
        assert set(module.__all__) <= set(dir(module))
    assert rl_algos.rloo is rl_algos.rloo_agent
    assert tuple(rl_algos.PRESETS) == rl_algos.ALGORITHMS
    from rl_algos.names import ALGORITHM_SPECS

    for name, preset in rl_algos.PRESETS.items():
        spec = ALGORITHM_SPECS[name]
        assert preset.agent is getattr(rl_algos, spec.agent)
        assert (preset.grouped, preset.online, preset.summary) == (
            spec.grouped,
            spec.online,
            spec.summary,
        )
    with pytest.raises(AttributeError):
        _ = rl_algos.no_such_name


def test_trainer_registry_is_complete_from_the_package() -> None:
    """``from rl_train import get_trainer`` alone still knows every algorithm's trainer."""
    code = (
        "from rl_train import available_trainers, get_trainer\n"
        "from rl_algos.names import ALGORITHMS\n"
        "assert available_trainers() == sorted(ALGORITHMS), available_trainers()\n"
        "print(get_trainer('ilql').__name__)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ILQLTrainer"
