"""Offline ILQL in rl-train: make_experience, the "ilql" trainer, train_offline, the behaviour
dataset and ``rl-train demo --algo ilql``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rl_algos import ILQL
from rl_train import ILQLTrainer, get_trainer, make_experience, make_trainer, train_offline
from rl_train.cli import main
from rl_train.config import load_config
from rl_train.ilql_demo import ILQLDemoConfig, behaviour_dataset, run_ilql_demo
from rl_train.loops import offline_learning_loop
from rl_train.tiny import demo_reward, tiny_tokenizer

TOK = tiny_tokenizer()
BOS, EOS, PAD = 1, 2, 0


def enc(text: str) -> list[int]:
    return list(TOK.encode(text, add_special_tokens=False))


def test_make_experience_layout_pairs_strings_and_dialogues() -> None:
    samples = [("12", "3"), "ab", ("1", "2", "3", "45")]
    data = make_experience(samples, [1.0, 0.0, 2.0], TOK, normalize_rewards=False)
    rows = [
        enc("12") + enc("3") + [EOS],
        [BOS, *enc("ab"), EOS],  # a plain string is all output, after BOS (trlX)
        enc("1") + enc("2") + enc("3") + enc("45") + [EOS],
    ]
    acts = [
        [False, True, True],
        [True, True, True],
        [True, False, True, True, True],  # outputs "2" and "45<eos>"; "3" is a prompt turn
    ]
    assert data.input_ids.shape == (3, 6) and data.action_masks.shape == (3, 5)
    for n, (row, act) in enumerate(zip(rows, acts, strict=True)):
        assert data.input_ids[n, : len(row)].tolist() == row
        assert bool((data.input_ids[n, len(row) :] == PAD).all())
        assert data.action_masks[n, : len(act)].tolist() == act
        assert not bool(data.action_masks[n, len(act) :].any())
    assert data.lengths.tolist() == [4, 4, 6]
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert data.rewards.tolist() == [1.0, 0.0, 2.0] == data.raw_rewards.tolist()
    ids, masks, r = data.batch(torch.tensor([0, 1]))
    assert ids.shape == (2, 4) and masks.shape == (2, 3) and r.tolist() == [1.0, 0.0]


def test_make_experience_standardises_and_truncates() -> None:
    data = make_experience([("1", "2"), ("3", "4"), ("5", "6")], [0.0, 1.0, 2.0], TOK)
    expected = (torch.tensor([0.0, 1.0, 2.0]) - 1.0) / torch.tensor([0.0, 1.0, 2.0]).std(
        unbiased=False
    )
    torch.testing.assert_close(data.rewards, expected)
    long = make_experience([("abcdef", "12")], [1.0], TOK, max_length=4, normalize_rewards=False)
    assert long.input_ids[0].tolist() == [*enc("f12"), EOS]  # the last 4 tokens
    assert long.action_masks[0].tolist() == [True, True, True]
    with pytest.warns(RuntimeWarning, match="every reward is the same"):
        flat = make_experience([("1", "2"), ("3", "4")], [0.5, 0.5], TOK)
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert flat.rewards.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("samples", "rewards", "message"),
    [
        ([("1", "2")], None, r"`rewards` is None: ILQL learns from \(sample, reward\) pairs"),
        ([], [], "`samples` is empty: pass at least one sample and its reward"),
        ([("1", "2"), ("3", "4")], [1.0], "`samples` has 2 items but `rewards` has 1"),
        ([("1", "2"), ("3", "4")], [1.0, math.nan], r"`rewards` has NaN or inf at index \[1\]"),
        ([("1", "2", "3")], [1.0], r"`samples`\[0\] must be a string or an even number of strings"),
        ([("", "2")], [1.0], r"`samples`\[0\] needs a non-empty prompt"),
    ],
)
def test_make_experience_errors(samples: list, rewards: list | None, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message):
        make_experience(samples, rewards, TOK)


def test_make_experience_needs_an_output_token() -> None:
    with pytest.raises(ValueError, match=r"`samples`\[0\] has no output token to learn from"):
        make_experience([("1", "")], [1.0], TOK, append_eos=False)


def test_behaviour_dataset_mixes_right_systematic_and_random() -> None:
    n = 2000
    questions = [str(i % 10) for i in range(n)]
    answers = [str((i + 1) % 10) for i in range(n)]
    samples, rewards = behaviour_dataset(questions, answers, demo_reward, p_correct=0.2,
                                         p_distractor=0.5, seed=0)  # fmt: skip
    right = sum(c == a for (_, c), a in zip(samples, answers, strict=True)) / n
    shifted = (
        sum(c == str((int(a) + 1) % 10) for (_, c), a in zip(samples, answers, strict=True)) / n
    )
    # expected 0.2 + 0.3 * 0.1 = 0.23 and 0.5 + 0.03 = 0.53 (random answers hit either by chance);
    # the bounds are about 4 standard deviations (0.01) wide
    assert 0.19 <= right <= 0.27
    assert 0.49 <= shifted <= 0.57
    assert rewards == [demo_reward(c, a, q) for (q, c), a in zip(samples, answers, strict=True)]
    with pytest.raises(ValueError, match="need p_correct, p_distractor >= 0 with sum <= 1"):
        behaviour_dataset(questions, answers, demo_reward, p_correct=0.7, p_distractor=0.5)


def _config(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_config(None, ["algo=ilql", "train.steps=2", "train.evaluation_interval=2",
                              "train.checkpoint_steps=2", f"train.run_dir={tmp_path}",
                              "data.n_train=40", "data.n_test=8", "agent.batch_size=4",
                              "agent.alpha=0.5", "agent.steps_for_target_q_sync=1", *extra])  # fmt: skip


def test_trainer_registry_learn_callbacks_checkpoint_and_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert get_trainer("ilql") is ILQLTrainer
    trainer = make_trainer(_config(tmp_path))
    assert isinstance(trainer, ILQLTrainer) and isinstance(trainer.agent, ILQL)
    with pytest.raises(ValueError, match=r"call trainer.make_experience\(samples, rewards\)"):
        trainer.learn()
    trainer.make_experience([("1", "2"), ("3", "4"), ("5", "7"), ("8", "9"), ("0", "0")],
                            [1.0, 1.0, 0.0, 1.0, 0.0])  # fmt: skip
    logs: list[dict] = []  # type: ignore[type-arg]
    saves: list[Path] = []
    evals: list[object] = []
    trainer.learn(log_fn=logs.append, save_fn=saves.append,
                  eval_fn=lambda t: evals.append(t) or {"custom": 1.0})  # fmt: skip
    assert [r["step"] for r in logs] == [1, 2]
    assert {"q_loss", "v_loss", "cql_loss", "awac_loss", "reward/mean", "custom"} <= set(logs[1])
    assert evals == [trainer] and trainer.agent.steps == 2
    assert [p.name for p in saves] == ["step_00000002"]
    agent_dir = saves[0] / "agent_0"
    assert (agent_dir / "ilql_heads.safetensors").is_file()
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["step"] == 2
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    # the checkpoint evaluates through the command line (heads loaded with the agent)
    config_file = tmp_path / "ilql.yaml"
    config_file.write_text("algo: ilql\ndata:\n  n_train: 40\n  n_test: 8\n")
    assert main(["eval", str(saves[0]), "--config", str(config_file)]) == 0
    assert "greedy accuracy:" in capsys.readouterr().out


def test_train_offline_with_eval_prompts(tmp_path: Path) -> None:
    def reward_fn(samples, prompts, outputs, **kwargs):  # type: ignore[no-untyped-def]
        return [float(o == "2") for o in outputs]

    def metric_fn(samples, prompts, outputs, **kwargs):  # type: ignore[no-untyped-def]
        return {"length": [len(o) for o in outputs]}

    rows: list[dict] = []  # type: ignore[type-arg]
    trainer = train_offline([("1", "2"), ("1", "5"), ("3", "4")], [1.0, 0.0, 1.0],
                            config=_config(tmp_path), eval_prompts=["1", "3"],
                            reward_fn=reward_fn, metric_fn=metric_fn, log_fn=rows.append)  # fmt: skip
    assert isinstance(trainer, ILQLTrainer) and trainer.agent.steps == 2
    stats = trainer.evaluate(show=True)
    assert set(stats) == {"reward/mean", "metrics/length"}
    assert 0.0 <= stats["reward/mean"] <= 1.0 and stats["metrics/length"] <= 2
    assert "reward/mean" in rows[-1]
    with pytest.raises(ValueError, match="`eval_prompts` is empty"):
        trainer.add_eval_prompts([])


def test_offline_loop_reshuffles_and_rejects_bad_arguments() -> None:
    from rl_train.tiny import tiny_model

    agent = ILQL(actor_network=tiny_model(len(TOK)), pad_token_id=PAD, pad_token="<pad>",
                 tokenizer=TOK, full_finetune=True, batch_size=2, lr=1e-3)  # fmt: skip
    data = make_experience([("1", "2"), ("3", "4"), ("5", "6")], [1.0, 0.0, 1.0], TOK)
    history = offline_learning_loop(agent, data, steps=3)  # 2 + 2 rows, reshuffled at step 2
    assert len(history) == 3 and agent.steps == 3
    assert all(math.isfinite(r["loss"]) for r in history)
    with pytest.raises(ValueError, match="`steps` must be >= 1"):
        offline_learning_loop(agent, data, steps=0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"`batch_size` must be an int >= 1"):
            offline_learning_loop(agent, data, steps=1, batch_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`batch_size` is 4 but the dataset has 3 rows"):
        offline_learning_loop(agent, data, steps=1, batch_size=4)


def test_demo_cli_runs_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--algo", "ilql", "--steps", "3", "--run-dir", str(tmp_path), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "mean reward r0 = " in out and "value-guided accuracy" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["after"]) == {"lm_accuracy", "lm_reward", "guided_accuracy", "guided_reward"}
    assert (tmp_path / "checkpoints" / "step_00000003" / "agent_0" / "ilql_heads.json").is_file()
    # the online demo's outputs: a curve (of the evaluations: no logged reward) and TensorBoard
    assert (tmp_path / "reward_curve.png").is_file()
    assert any((tmp_path / "tensorboard").iterdir())


def test_demo_summary_fields() -> None:
    cfg = ILQLDemoConfig(
        steps=2, n_train=40, n_test=8, evaluation_interval=1, agent={"batch_size": 8}
    )
    summary = run_ilql_demo(cfg, None, verbose=False)
    assert 0.0 < summary["logged_reward"] < 1.0
    assert [("eval_accuracy" in r) for r in summary["history"]] == [True, True]


def test_demo_agent_settings_are_the_config_defaults_then_the_demo_overrides() -> None:
    """ILQLConfig holds the agent defaults; the demo's overrides and the user's sit on top."""
    from rl_algos import ILQLConfig
    from rl_train.ilql_demo import ILQL_DEMO_AGENT

    settings = ILQLDemoConfig(seed=3, agent={"batch_size": 8, "tau": 0.9}).agent_settings()
    assert settings == {**ILQL_DEMO_AGENT, "batch_size": 8, "tau": 0.9, "seed": 3}
    defaults = ILQLConfig()
    # every override changes a default (an override equal to the default is a second home)
    assert [k for k, v in ILQL_DEMO_AGENT.items() if getattr(defaults, k) == v] == []
    with pytest.raises(ValueError, match=r"\['taus'\].*its fields: .*tau"):
        ILQLDemoConfig(agent={"taus": 0.9}).agent_settings()


@pytest.mark.parametrize(("key", "value"), [("resume", "true"), ("max_reward", "0.5")])
def test_an_offline_run_refuses_resume_and_max_reward(key: str, value: str) -> None:
    """The offline loop has neither: the config says so instead of training without them."""
    from rl_train.config import ConfigError, load_config
    from rl_train.run import prepare

    example = Path(__file__).resolve().parents[3] / "examples" / "ilql_tiny.yaml"
    config = load_config(example, [f"train.{key}={value}"])
    with pytest.raises(ConfigError, match=rf"train\.{key} is not supported"):
        prepare(config)
