"""The seed documents' training snippets with the import lines changed.

``agilerl.algorithms`` -> ``rl_algos``, ``agilerl.training.train_llm`` -> ``rl_train``,
``agilerl.llm_envs`` -> ``rl_envs``, ``agilerl.utils.utils.save_llm_checkpoint`` ->
``rl_algos.save_llm_checkpoint``. A tiny local model and tokenizer stand in for the hub model,
and ``max_steps`` / ``evaluation_interval`` are cut from 2000 / 50 to keep the test short.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_algos import GRPO, save_llm_checkpoint
from rl_testing.models import tiny_causal_lm


@pytest.fixture
def agent_and_tokenizer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # the loops write runs/ under the working directory
    model, tokenizer = tiny_causal_lm("qwen2", seed=0)
    agent = GRPO(
        actor_network=model,
        pad_token_id=tokenizer.eos_token_id,
        pad_token=tokenizer.eos_token,
        device="cuda" if torch.cuda.is_available() else "cpu",
        batch_size=8,
        group_size=8,
        max_output_tokens=16,
        max_model_len=256,
        tokenizer=tokenizer,
    )
    return agent, tokenizer


def test_seed_training_snippets(agent_and_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    agent, tokenizer = agent_and_tokenizer
    # ---- the seed, imports changed ----
    from datasets import Dataset
    from rl_envs import ReasoningGym, TokenObservationWrapper
    from rl_train import finetune_llm_multiturn, finetune_llm_reasoning

    train_ds = Dataset.from_dict(
        {"question": ["2+2?", "Capital of France?"], "answer": ["4", "Paris"]}
    )
    test_ds = Dataset.from_dict({"question": ["3+3?"], "answer": ["6"]})

    def reward_fn(completion: str, answer: str, question: str) -> float:
        del question
        return float(answer.lower() in completion.lower())

    reasoning_env = ReasoningGym(
        train_dataset=train_ds,
        test_dataset=test_ds,
        tokenizer=tokenizer,
        reward_fn=reward_fn,
        conversation_template=[{"role": "user", "content": "Q: {question}\nA:"}],
        data_batch_size_per_gpu=2,
    )
    trained_pop = finetune_llm_reasoning(
        pop=[agent], env=reasoning_env, max_steps=3, evaluation_interval=2
    )

    class ToyMultiTurnEnv:
        def reset(self, seed=None):  # type: ignore[no-untyped-def]
            del seed
            return "Start: What is 2+2?", {}

        def step(self, action: str):  # type: ignore[no-untyped-def]
            reward = 1.0 if "4" in action else 0.0
            return "Done.", reward, True, False, {"correct": bool(reward)}

    def env_factory():  # type: ignore[no-untyped-def]
        return TokenObservationWrapper(
            env=ToyMultiTurnEnv(),
            tokenizer=tokenizer,
            max_turns=4,
            pad_id=tokenizer.eos_token_id,
            max_model_len=1024,
            max_output_tokens=128,
        )

    trained_pop = finetune_llm_multiturn(
        pop=[agent], max_turns=4, env_factory=env_factory, max_steps=2, evaluation_interval=2
    )
    save_llm_checkpoint(agent, "path/to/checkpoint")
    # ---- end of the seed ----
    assert trained_pop[0] is agent
    assert agent.steps >= 3
    assert (tmp_path / "path" / "to" / "checkpoint").is_dir()
    assert (tmp_path / "runs" / "reasoning" / "metrics.csv").is_file()
    assert (tmp_path / "runs" / "multiturn" / "reward_curve.png").is_file()
