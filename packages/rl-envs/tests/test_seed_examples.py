"""The seed documents' environment code, verbatim except for the import line."""

from __future__ import annotations

import torch
from envs_testlib import encode, tok

# agilerl.llm_envs -> rl_envs
from rl_envs import ReasoningGym, TokenObservationWrapper


def test_seed_reasoning_gym_and_multiturn_wrapper() -> None:
    tokenizer = tok()
    # --- from the seed (AgileRL LLM pages, "Training") ---
    from datasets import Dataset

    train_ds = Dataset.from_dict(
        {
            "question": ["2+2?", "Capital of France?"],
            "answer": ["4", "Paris"],
        }
    )
    test_ds = Dataset.from_dict(
        {
            "question": ["3+3?"],
            "answer": ["6"],
        }
    )

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

    # --- end of the seed code; drive both as the training loops do ---
    prompts = reasoning_env.reset()
    answers = {p["question"]: p["answer"] for p in prompts}
    completions = [
        torch.cat([p["input_ids"], torch.tensor([encode(answers[p["question"]].lower())])], dim=1)
        for p in prompts
    ]
    _, rewards = reasoning_env.step(completions)
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[1.0], [1.0]]

    wrapper = env_factory()
    obs, _ = wrapper.reset()
    assert obs["input_ids"].shape[0] == 1
    _, reward, terminated, truncated, info = wrapper.step([*encode("4"), tokenizer.eos_token_id])
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, True)
