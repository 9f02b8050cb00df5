"""The trlX-style trainer object: learn with callbacks, evaluate, generate, decode, save."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_testing.tolerance import assert_close
from rl_train import (
    AgentTrainer,
    BaseRLTrainer,
    available_trainers,
    get_trainer,
    make_trainer,
    register_trainer,
)
from rl_train.config import load_config


def config(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_config(None, ["train.steps=4", "train.evaluation_interval=2", "train.checkpoint_steps=2",
                              f"train.run_dir={tmp_path}", "data.n_train=40", "data.n_test=8",
                              "data.prompts_per_step=4", "agent.group_size=4", *extra])  # fmt: skip


def test_registry() -> None:
    assert set(available_trainers()) >= {"grpo", "ppo", "reinforce", "cispo"}
    assert get_trainer("grpo") is AgentTrainer
    with pytest.raises(ValueError, match="unknown trainer 'nope'"):
        get_trainer("nope")

    @register_trainer("custom_test")
    class Custom(BaseRLTrainer):
        def setup(self) -> None:
            self.ready = True

    assert get_trainer("custom_test") is Custom
    with pytest.raises(ValueError, match="registered already"):
        register_trainer("custom_test")(AgentTrainer)


def test_learn_with_callbacks_reward_and_metric_fns(tmp_path: Path) -> None:
    calls: dict[str, list] = {"log": [], "save": [], "eval": [], "reward": []}  # type: ignore[type-arg]

    def reward_fn(samples, prompts, outputs, **kwargs):  # type: ignore[no-untyped-def]
        calls["reward"].append(kwargs["answers"])
        return [float(o.strip() == a) for o, a in zip(outputs, kwargs["answers"], strict=True)]

    def metric_fn(samples, prompts, outputs, **kwargs):  # type: ignore[no-untyped-def]
        return {"length": [len(o) for o in outputs]}

    trainer = make_trainer(
        config(tmp_path), reward_fn=reward_fn, metric_fn=metric_fn, stop_sequences=["x"]
    )
    trainer.learn(log_fn=calls["log"].append, save_fn=calls["save"].append,
                  eval_fn=lambda t: calls["eval"].append(t) or {"custom": 1.0})  # fmt: skip
    assert [r["step"] for r in calls["log"]] == [1, 2, 3, 4]
    assert [p.name for p in calls["save"]] == ["step_00000002", "step_00000004"]
    assert calls["eval"] == [trainer, trainer]
    assert calls["reward"]  # the trlX reward_fn scored the training samples
    assert "metrics/length" in calls["log"][1] and "custom" in calls["log"][1]
    stats = trainer.evaluate(show=True)
    assert 0.0 <= stats["reward/mean"] <= 1.0


def test_generate_decode_and_stop_sequences(tmp_path: Path) -> None:
    trainer = make_trainer(config(tmp_path), stop_sequences=["3"])
    tok = trainer.tokenizer
    ids = torch.tensor([tok.encode("5"), tok.encode("7")])
    greedy = trainer.generate_eval(ids)
    assert greedy.shape[0] == 2
    assert torch.equal(greedy, trainer.generate_eval(ids))  # bit-exact: integer token ids
    sampled = trainer.generate(ids)
    assert torch.equal(sampled[:, :1], ids)  # bit-exact: integer token ids
    samples, prompts, outputs = trainer.decode(ids, [tok.encode("5") + tok.encode("12345")], [1])
    assert (samples, prompts, outputs) == (["512"], ["5"], ["12"])


@pytest.mark.parametrize(
    ("extra", "merge"), [([], False), (["algo=ppo"], False), (["algo=ppo"], True)]
)
def test_save_pretrained_loads_back_with_transformers(
    tmp_path: Path, extra: list[str], merge: bool
) -> None:
    from transformers import AutoModelForCausalLM

    trainer = make_trainer(config(tmp_path, *extra))
    out = trainer.save_pretrained(tmp_path / "hf", merge=merge)
    ids = torch.tensor([trainer.tokenizer.encode("12")])
    if trainer.agent.policy.peft is None or merge:
        model = AutoModelForCausalLM.from_pretrained(str(out))
        expected = trainer.agent.policy.logits(ids, torch.ones_like(ids))
        # transformers' plain forward (merged LoRA) against the agent's: float32 rounding
        # through 2 decoder layers and the head, the longest sum the MLP's 128
        assert_close(model(ids).logits, expected, reduction=128, stages=3, msg="logits")
    else:
        assert (out / "adapter_config.json").is_file() or (
            out / "actor" / "adapter_config.json"
        ).is_file()
    assert (out / "tokenizer.json").is_file()
