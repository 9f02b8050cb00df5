"""One algorithm table: a row added here is an algorithm everywhere.

The row below (GRPO with DAPO's clip-higher bound and a token-mean loss) is registered by this
module's fixture and runs through ``make_agent``, ``rl-train run`` (tiny model, two steps) and
the TRL facade; then ``--print-config``, the ``agent:`` key check (before torch), the
trainer registry and the progress bar's KL read the same table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets import Dataset
from rl_algos import GRPO, make_agent
from rl_algos.names import (
    ALGORITHM_SPECS,
    ALGORITHMS,
    AlgorithmSpec,
    batch_rows,
    register_algorithm,
    remove_algorithm,
)
from rl_train import AgentTrainer, available_trainers, get_trainer
from rl_train.cli import main
from rl_train.config import ASYNC_REFUSED, ConfigError, load_config
from rl_train.hooks import LoopState, ProgressBar
from rl_train.settings import agent_kwargs
from rl_train.tiny import tiny_model, tiny_tokenizer
from rl_train.trl import TRL_OVERRIDES, GRPOConfig, GRPOTrainer

ROW = AlgorithmSpec(
    "grpo_clip_higher",
    "GRPO",
    {"clip_coef_high": 0.28, "loss_aggregation": "token_mean"},
    "GRPO with DAPO's clip-higher upper bound (2503.14476)",
)


@pytest.fixture
def row() -> Iterator[AlgorithmSpec]:
    register_algorithm(ROW)
    try:
        yield ROW
    finally:
        remove_algorithm(ROW.name)


def test_a_new_row_is_an_algorithm_for_make_agent(row: AlgorithmSpec) -> None:
    assert row.name in ALGORITHMS and ALGORITHMS[-1] == row.name
    tok = tiny_tokenizer()
    agent = make_agent(
        row.name,
        actor_network=tiny_model(len(tok)),
        pad_token_id=tok.pad_token_id,
        pad_token=tok.pad_token,
        full_finetune=True,
        group_size=4,
    )
    assert type(agent) is GRPO
    assert (agent.clip_coef_high, agent.loss_aggregation) == (0.28, "token_mean")
    explicit = make_agent(
        row.name,
        actor_network=tiny_model(len(tok)),
        pad_token_id=tok.pad_token_id,
        pad_token=tok.pad_token,
        full_finetune=True,
        clip_coef_high=0.3,
    )
    assert explicit.clip_coef_high == 0.3  # an explicit keyword wins over the row
    assert get_trainer(row.name) is AgentTrainer and row.name in available_trainers()


def test_a_new_row_runs_through_rl_train_run(row: AlgorithmSpec, tmp_path: Path) -> None:
    yaml = tmp_path / "new.yaml"
    yaml.write_text(
        f"algo: {row.name}\nmodel:\n  name: tiny\ndata:\n  n_train: 16\n  n_test: 4\n"
        f"  prompts_per_step: 2\ntrain:\n  steps: 2\n  evaluation_interval: 1\n"
        f"  checkpoint_steps: null\n  report_to: none\n  run_dir: {tmp_path / 'run'}\n"
        "agent:\n  group_size: 4\n"
    )
    assert main(["run", str(yaml), "--quiet"]) == 0
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["algo"] == row.name


def test_a_new_row_runs_through_the_trl_facade(row: AlgorithmSpec, tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    data = Dataset.from_list([{"prompt": f"{d}+1="} for d in range(10)])
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        algo=row.name,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=2,
        max_steps=2,
        save_steps=2,
        report_to="none",
        disable_tqdm=True,
    )

    def reward(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [float(len(c)) for c in completions]

    trainer = GRPOTrainer(tiny_model(len(tok)), reward, args, data, processing_class=tok)
    cfg = trainer.agent.config
    assert (cfg.clip_coef_high, cfg.loss_aggregation) == (0.28, "token_mean")
    assert (cfg.batch_size, cfg.group_size) == (batch_rows(2, 4), 4)
    assert trainer.train().global_step == 2
    with pytest.raises(ValueError, match=r"GRPOConfig.algo='ppo' is not a grouped online"):
        GRPOConfig(algo="ppo")


def test_print_config_names_every_layer(
    row: AlgorithmSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yaml = tmp_path / "c.yaml"
    yaml.write_text(f"algo: {row.name}\nagent:\n  group_size: 4\n  lr: 0.01\n")
    assert main(["run", str(yaml), "agent.beta=0.5", "train.steps=7", "--print-config"]) == 0
    lines = {
        line.split(" = ")[0]: line.split("# ")[-1] for line in capsys.readouterr().out.splitlines()
    }
    assert lines["agent.clip_coef_high"] == "preset"
    assert lines["agent.temperature"] == "tiny model"
    assert lines["agent.lr"] == "YAML" and lines["agent.beta"] == "command line"
    assert lines["agent.batch_size"] == "run (data.prompts_per_step x G)"
    assert lines["agent.seed"] == "run (train.seed)"
    assert lines["agent.cispo_eps_high"] == "agent default"
    assert lines["train.steps"] == "command line" and lines["train.seed"] == "default"
    assert not (tmp_path / "runs").exists()  # nothing was trained


def test_a_row_registered_by_a_module_of_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_algos.py").write_text(
        "from rl_algos.names import AlgorithmSpec, register_algorithm\n"
        "register_algorithm(AlgorithmSpec('grpo_from_imports', 'GRPO', {'clip_coef_high': 0.3}))\n"
    )
    yaml = tmp_path / "c.yaml"
    yaml.write_text("imports: [my_algos.py]\nalgo: grpo_from_imports\nagent:\n  group_size: 4\n")
    try:
        assert main(["run", str(yaml), "--print-config"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^agent\.clip_coef_high = 0\.3 +# preset$", out, re.MULTILINE), out
        yaml.write_text("imports: [my_algos.py]\nalgo: grpo_from_importz\n")
        with pytest.raises(ConfigError, match="did you mean 'grpo_from_imports'"):
            load_config(yaml)
    finally:
        remove_algorithm("grpo_from_imports")
        sys.modules.pop("my_algos", None)


def test_batch_size_is_prompts_times_group() -> None:
    grpo = load_config(None, ["data.prompts_per_step=3", "agent.group_size=5"])
    assert agent_kwargs(grpo)["batch_size"] == batch_rows(3, 5) == 15
    with pytest.warns(UserWarning, match=r"agent\.group_size=5 is ignored: ppo samples one"):
        ppo = load_config(None, ["algo=ppo", "data.prompts_per_step=3", "agent.group_size=5"])
    assert agent_kwargs(ppo)["batch_size"] == 3 and "group_size" not in agent_kwargs(ppo)
    assert agent_kwargs(ppo)["critic_mode"] == "shared"  # the tiny model: full fine-tuning
    with pytest.raises(ValueError, match="`prompts` and `group_size` must be >= 1"):
        batch_rows(0, 4)


def test_async_refusals_are_the_tables_column() -> None:
    assert dict(ASYNC_REFUSED) == {
        n: s.async_refused for n, s in ALGORITHM_SPECS.items() if s.async_refused
    }
    assert set(ASYNC_REFUSED) == {"ppo", "ilql"}
    with pytest.raises(ConfigError, match="algo ppo cannot train asynchronously"):
        load_config(None, ["algo=ppo", "async.max_staleness=1"])


def test_unknown_agent_key_answers_before_torch(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("algo: ppo\nagent:\n  critic_lrr: 0.1\n")
    code = (
        "import sys\nfrom rl_train.cli import main\nstatus = main(['run', 'bad.yaml'])\n"
        "print(status, 'torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert proc.stderr.strip() == (
        "rl-train: unknown key 'agent.critic_lrr': LLMPPO got unexpected arguments "
        "['critic_lrr']; did you mean 'agent.critic_lr'?"
    )


def test_trl_overrides_are_where_trl_differs() -> None:
    from rl_algos import GRPOConfig as AgentGRPOConfig

    ours = AgentGRPOConfig()
    for name, value in TRL_OVERRIDES.items():
        assert getattr(ours, name) != value, name  # a real difference, not a restated default
    trl = GRPOConfig()
    assert (trl.learning_rate, trl.temperature, trl.top_k) == (
        TRL_OVERRIDES["lr"],
        TRL_OVERRIDES["temperature"],
        TRL_OVERRIDES["top_k"],
    )
    assert trl.max_grad_norm == TRL_OVERRIDES["max_grad_norm"]


class _Bar:
    def __init__(self) -> None:
        self.postfix: dict[str, str] = {}

    def update(self, n: int) -> None:
        del n

    def set_postfix(self, **shown: str) -> None:
        self.postfix = shown


class _Agent:
    def __init__(self, beta: float) -> None:
        self.beta = beta


@pytest.mark.parametrize(("beta", "shown"), [(0.0, False), (0.04, True)])
def test_progress_bar_shows_kl_only_when_computed(beta: float, shown: bool) -> None:
    bar = ProgressBar(enabled=False)
    bar.bar = _Bar()
    bar.after_step(LoopState([_Agent(beta)], total=1), {"mean_reward": 1.0, "step_time": 0.1})
    assert ("kl" in bar.bar.postfix) is shown
