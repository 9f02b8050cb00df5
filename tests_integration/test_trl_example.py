"""Issue 22's acceptance: a TRL example, unchanged except its imports, trains with rl-stack.

``TRL_EXAMPLE`` is written the way TRL's GRPO documentation writes it: a dataset with a
conversational ``prompt`` column and a ``ground_truth`` column, and two TRL reward functions,
``reward_correct(completions, ground_truth, **kwargs)`` and ``async def
reward_digit(prompts, completions, **kwargs)``. Only ``from trl import GRPOConfig,
GRPOTrainer`` is gone (and the hub dataset is built in memory, since nothing can be
downloaded). The same file then trains:

* through the Python API (``ReasoningGym`` + a GRPO agent + ``finetune_llm_reasoning``) on the
  embedded tiny model: the rewards are finite, the weights change and the mean reward rises;
* through ``rl-train run`` with a YAML that names the two functions (``module:function``) and
  the dataset as a local JSONL file.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch
from rl_algos import make_agent
from rl_envs import ReasoningGym
from rl_train import MetricsLogger, finetune_llm_reasoning
from rl_train.builder import import_user_code
from rl_train.cli import main
from rl_train.tiny import TINY_AGENT, tiny_model, tiny_tokenizer

TRL_EXAMPLE = '''
import asyncio
import re

from datasets import Dataset

# TRL's docs load a hub dataset; nothing can be downloaded here, so it is built in memory
dataset = Dataset.from_list(
    [
        {
            "prompt": [{"role": "user", "content": f"{d}+1=?"}],
            "ground_truth": str((d + 1) % 10),
        }
        for d in list(range(10)) * 8
    ]
)


def reward_correct(completions, ground_truth, **kwargs):
    """1.0 when the answer is the ground truth (TRL's accuracy-reward pattern)."""
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if c.strip() == gt else 0.0 for c, gt in zip(contents, ground_truth)]


async def reward_digit(prompts, completions, **kwargs):
    """An async reward (as if it asked a judge server): 0.5 for an answer that starts with a digit."""
    await asyncio.sleep(0.001)
    return [0.5 if re.match(r"\\d", completion[0]["content"]) else 0.0 for completion in completions]
'''

#: The chat template the tiny character tokenizer gets (it has none; its alphabet is small).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
STEPS = 40


def _example(tmp_path: Path) -> Any:
    path = tmp_path / "trl_example.py"
    path.write_text(textwrap.dedent(TRL_EXAMPLE))
    return import_user_code([str(path)])[0]


def _rewards(run_dir: Path) -> list[float]:
    return [r["mean_reward"] for r in MetricsLogger.read(run_dir / "metrics.jsonl")]


def test_trl_example_trains_through_the_python_api(tmp_path: Path) -> None:
    example = _example(tmp_path)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    env = ReasoningGym(
        example.dataset,
        example.dataset.select(range(10)),
        tokenizer,
        [example.reward_correct, example.reward_digit],
        data_batch_size_per_gpu=8,
        seed=0,
    )
    assert env.reset()[0]["text"].endswith("+1=?\nassistant:")
    agent = make_agent(
        "grpo",
        actor_network=tiny_model(len(tokenizer), seed=0),
        pad_token_id=tokenizer.pad_token_id,
        pad_token=tokenizer.pad_token,
        tokenizer=tokenizer,
        full_finetune=True,
        group_size=8,
        batch_size=64,
        seed=0,
        **TINY_AGENT,
    )
    before = [p.detach().clone() for p in agent.actor_parameters()]
    finetune_llm_reasoning(
        [agent],
        env,
        max_steps=STEPS,
        evaluation_interval=STEPS,
        run_dir=tmp_path / "api",
        verbose=False,
        plot=False,
        tensorboard=False,
    )
    rewards = _rewards(tmp_path / "api")
    assert len(rewards) == STEPS and all(math.isfinite(r) for r in rewards)
    after = agent.actor_parameters()
    # bit-exact: did training move the actor at all
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, (first, last, rewards)
    components = env.last_reward_components
    assert set(components) == {"reward_correct", "reward_digit"}


def test_trl_example_trains_through_rl_train_run(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    example = _example(tmp_path)
    with open("train.jsonl", "w") as f:
        for row in example.dataset:
            f.write(json.dumps(row) + "\n")
    Path("chat.jinja").write_text(CHAT_TEMPLATE)
    Path("trl.yaml").write_text(
        textwrap.dedent(
            """
            algo: grpo
            imports: [trl_example.py]
            model:
              name: tiny
              chat_template: chat.jinja
            data:
              train_path: train.jsonl
              reward: [trl_example:reward_correct, trl_example:reward_digit]
              reward_weights: [1.0, 1.0]
              prompts_per_step: 8
            train:
              steps: 10
              evaluation_interval: 10
              checkpoint_steps: null
              run_dir: runs/trl
            agent:
              group_size: 8
            """
        )
    )
    sys.modules.pop("trl_example", None)  # the run imports it again, from the YAML's list
    assert main(["run", "trl.yaml", "--quiet"]) == 0
    rewards = _rewards(Path("runs/trl"))
    assert len(rewards) == 10 and all(math.isfinite(r) for r in rewards)
    assert json.loads(Path("runs/trl/config.json").read_text())["data"]["reward"] == [
        "trl_example:reward_correct",
        "trl_example:reward_digit",
    ]


#: TRL's trainer part of the example, as its docs write it; only the import differs
#: (``from trl import GRPOConfig, GRPOTrainer``) and the model is a local path, since nothing
#: can be downloaded (TRL takes a hub id or a path alike).
TRL_TRAINER = """
from rl_train.trl import GRPOConfig, GRPOTrainer

training_args = GRPOConfig(
    output_dir="runs/trl-script",
    learning_rate=1e-3,
    per_device_train_batch_size=64,
    num_generations=8,
    max_completion_length=2,
    max_steps=40,
    logging_steps=10,
    report_to="none",
)
trainer = GRPOTrainer(
    model=MODEL_PATH,
    reward_funcs=[reward_correct, reward_digit],
    args=training_args,
    train_dataset=dataset,
)
result = trainer.train()
"""


def test_trl_example_with_trls_trainer_calls(tmp_path: Path, monkeypatch: Any) -> None:
    """The whole TRL script, ``GRPOConfig``/``GRPOTrainer``/``train()`` included, with only
    ``from trl import ...`` replaced by ``from rl_train.trl import ...``."""
    monkeypatch.chdir(tmp_path)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_model(len(tokenizer), seed=0).save_pretrained("model")
    tokenizer.save_pretrained("model")
    script = textwrap.dedent(TRL_EXAMPLE) + TRL_TRAINER.replace("MODEL_PATH", repr("model"))
    namespace: dict[str, Any] = {"__name__": "trl_script"}
    exec(compile(script, "trl_script.py", "exec"), namespace)
    result = namespace["result"]
    rewards = _rewards(Path("runs/trl-script"))
    assert result.global_step == 40 and len(rewards) == 40
    assert all(math.isfinite(r) for r in rewards) and math.isfinite(result.training_loss)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, (first, last, rewards)
    namespace["trainer"].save_model("saved")
    assert (Path("saved") / "model.safetensors").is_file()
