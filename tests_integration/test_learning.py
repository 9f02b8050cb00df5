"""Every algorithm learns from scratch: the embedded tiny model on a built-in task, on CPU.

Each case trains a freshly built 78k-parameter Qwen2 (full fine-tuning) with fixed seeds and
must reach greedy test accuracy >= 0.9 within 300 steps (8 prompts x 8 samples per step;
REINFORCE: 64 prompts), stopping early once it gets there. Accuracy starts at 0.0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_train import MetricsLogger, finetune_llm_reasoning
from rl_train.demo import (
    DemoConfig,
    build_agent,
    build_env,
    greedy_accuracy,
    tiny_model,
    tiny_tokenizer,
)

ALGOS = ["grpo", "gspo", "cispo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce"]
TARGET, BUDGET = 0.9, 300


@pytest.mark.parametrize("algo", ALGOS)
def test_algorithm_learns_successor_digit(algo: str, tmp_path: Path) -> None:
    config = DemoConfig(algo=algo, seed=0)
    tok = tiny_tokenizer()
    env = build_env(config, tok)
    agent = build_agent(config, tiny_model(len(tok), seed=0), tok)
    assert greedy_accuracy(agent, env) <= 0.1
    finetune_llm_reasoning(
        [agent],
        env,
        max_steps=BUDGET,
        evaluation_interval=25,
        run_dir=tmp_path,
        verbose=False,
        plot=False,
        tensorboard=False,
        max_reward=None,
        eval_fn=lambda a: {"eval_accuracy": greedy_accuracy(a, env)},
    )
    history = MetricsLogger.read(tmp_path / "metrics.jsonl")
    accuracy = [r["eval_accuracy"] for r in history if "eval_accuracy" in r]
    assert max(accuracy) >= TARGET, accuracy
    assert greedy_accuracy(agent, env) >= TARGET
