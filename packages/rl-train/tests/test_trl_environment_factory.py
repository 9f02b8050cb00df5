"""``GRPOTrainer(environment_factory=...)``: a TRL environment script (one environment per
episode, ``reset(**row)``, public methods as tools, ``environments=`` to the reward functions)
trains through rl-stack's tool-calling episodes."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from rl_envs.tools import TINY_TOOL_CHAT_TEMPLATE
from rl_train import MetricsLogger
from rl_train.tiny import tiny_model, tiny_tokenizer
from rl_train.trl import GRPOConfig, GRPOTrainer
from rl_train.trl_env import trl_episode_reward


class SecretEnv:
    """TRL's environment class convention: the secret digit comes from the row."""

    made: list[SecretEnv] = []  # noqa: RUF012 (the test reads every instance made)

    def __init__(self) -> None:
        self.secret, self.peeks, self.rows = "", 0, []
        SecretEnv.made.append(self)

    def reset(self, **kwargs: Any) -> str | None:
        self.rows.append(kwargs)
        self.secret, self.peeks = str(kwargs["secret"]), 0
        return None

    def peek(self) -> str:
        """Reveal the secret digit.

        Returns:
            The secret digit.
        """
        self.peeks += 1
        return self.secret


def reward(environments: list[SecretEnv], completions: list[str], **kwargs: Any) -> list[float]:
    return [float(e.peeks > 0 and c == e.secret) for e, c in zip(environments, completions, strict=True)]  # fmt: skip


def test_a_trl_environment_script_trains(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    tok.chat_template = TINY_TOOL_CHAT_TEMPLATE
    data = Dataset.from_list([{"prompt": "secret?", "secret": str(i % 2)} for i in range(8)])
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=1, max_prompt_length=40,
                      max_tool_calling_iterations=1, tool_parser="compact", eval_steps=2,
                      learning_rate=1e-3, report_to="none", disable_tqdm=True)  # fmt: skip
    SecretEnv.made = []
    trainer = GRPOTrainer(tiny_model(len(tok), 0), reward, args, data, processing_class=tok,
                          environment_factory=SecretEnv)  # fmt: skip
    out = trainer.train()
    assert out.global_step == 2 and math.isfinite(out.training_loss), out
    rows = MetricsLogger.read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    played = [e for e in SecretEnv.made if e.rows]
    assert len(played) >= 2 * 8  # 2 steps x 2 prompts x 4 episodes, each its own environment
    assert all(r["prompt"] == "secret?" and r["secret"] in "01" for e in played for r in e.rows)
    assert all(len(e.rows) == 1 for e in played)  # one episode per environment, as in TRL


def test_trl_reward_functions_score_one_episode() -> None:
    env = SecretEnv()
    env.reset(prompt="p", secret="3")
    env.peek()

    def never(completions: list[str]) -> list[None]:
        return [None]

    async def length(completions: list[str], secret: list[str]) -> list[float]:
        await asyncio.sleep(0)
        return [float(len(completions[0]) + len(secret[0]))]

    def run(score: Any, *args: Any, **row: Any) -> float:  # the episode awaits the reward
        return float(asyncio.run(score(*args, **row)))

    score = trl_episode_reward([reward, never, length], [2.0, 1.0, 0.5])
    # bit-exact: 2 * 1 + 0.5 * (1 + 1) in binary fractions
    assert run(score, "3", env, prompt="p", secret="3") == 3.0
    chat = trl_episode_reward([lambda completions, **kw: [len(completions[0])]])
    assert run(chat, "3", env, prompt=[{"role": "user", "content": "p"}]) == 1.0  # one message
    with pytest.warns(RuntimeWarning, match="every reward function returned None"):
        assert run(trl_episode_reward([never]), "3", env, prompt="p") == 0.0
    with pytest.raises(ValueError, match=r"returned \[1\.0, 2\.0\] for one episode"):
        run(trl_episode_reward([lambda completions: [1.0, 2.0]]), "3", env, prompt="p")
    with pytest.raises(ValueError, match="`reward_weights` has 2 entries for 1 reward"):
        trl_episode_reward([never], [1.0, 2.0])


def test_bad_environment_settings_name_the_field() -> None:
    tok = tiny_tokenizer()
    data = Dataset.from_list([{"prompt": "p"}] * 4)
    with pytest.raises(ValueError, match="max_tool_calling_iterations is read with environment_factory"):  # fmt: skip
        GRPOTrainer(tiny_model(len(tok)), reward, GRPOConfig(max_tool_calling_iterations=2),
                    data, processing_class=tok)  # fmt: skip
    with pytest.raises(TypeError, match="environment_factory 3 is not callable"):
        GRPOTrainer(tiny_model(len(tok)), reward, GRPOConfig(), data, processing_class=tok,
                    environment_factory=3)  # type: ignore[arg-type]  # fmt: skip


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


async def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper()


def test_trl_tools_are_the_methods_of_a_stateless_environment() -> None:
    from rl_envs.tools import tool_schemas
    from rl_train.trl_env import tools_environment
    from transformers.utils.chat_template_utils import get_json_schema

    env = tools_environment([add, shout])()
    assert env.reset(prompt="p", other=1) is None
    assert tool_schemas(env) == [get_json_schema(add), get_json_schema(shout)]
    assert env.add(2, b=3) == 5
    assert asyncio.run(env.shout("hi")) == "HI"
    for bad, match in [([lambda x: x], "must be a named function"), ([add, add], "given twice"),
                       ([reward, SecretEnv.reset], "cannot be a tool name")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            tools_environment(bad)


def test_a_trl_tools_script_trains(tmp_path: Path) -> None:
    """TRL's ``tools=[...]``: the model may call ``add`` (``!(1,2)`` in the compact syntax)."""
    tok = tiny_tokenizer()
    tok.chat_template = TINY_TOOL_CHAT_TEMPLATE
    data = Dataset.from_list([{"prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(8)])

    def correct(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=2, max_prompt_length=60,
                      max_tool_calling_iterations=1, tool_parser="compact", eval_steps=2,
                      report_to="none", disable_tqdm=True)  # fmt: skip
    trainer = GRPOTrainer(tiny_model(len(tok), 0), correct, args, data, processing_class=tok,
                          tools=[add])  # fmt: skip
    assert trainer.train().global_step == 2
    with pytest.raises(ValueError, match="pass `tools` or `environment_factory`, not both"):
        GRPOTrainer(tiny_model(len(tok)), correct, args, data, processing_class=tok,
                    tools=[add], environment_factory=SecretEnv)  # fmt: skip
