"""The sampling log-probs of ``get_action`` reach ``learn()`` from the loops, and the
rollout-mismatch correction changes the loss when sampler and trainer disagree.

The HF engine records the log-probs of the distribution it sampled from, after top-k / top-p
processing. With ``top_k=2`` that truncated distribution differs from the trainer's full
softmax, so the correction's weights ``exp(trainer - sampler)`` differ from 1; with
``top_k=0, top_p=1`` at the trained temperature they agree and the weights are ~1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rl_algos import Rollout
from rl_envs import TokenObservationWrapper
from rl_envs.tasks import GuessTheNumberEnv
from rl_testing.tolerance import assert_close
from rl_train import finetune_llm_multiturn, finetune_llm_reasoning
from rl_train.builder import build_agent
from rl_train.demo import DemoConfig, build_env
from rl_train.tiny import tiny_model, tiny_tokenizer

# Sampler (cached decode) and trainer (one full forward) log-probs are two routes to one number:
# float32 rounding through the tiny model (rl_testing.tolerance), whose longest sum is the MLP's
# intermediate size 128, and whose chain to a log-prob is 2 decoder layers and the head with its
# log-softmax.
REDUCTION = 128
LOGPROB_STAGES = 3


def _setup(correction: bool, top_k: int, tmp_path: Path, max_model_len: int = 64):  # type: ignore[no-untyped-def]
    demo = DemoConfig(prompts_per_step=4, group_size=4, n_train=40, n_test=8,
                      max_model_len=max_model_len)  # fmt: skip
    config = demo.run_config(tmp_path)
    config.agent.update(top_k=top_k, vllm_importance_sampling_correction=correction)
    tok = tiny_tokenizer()
    agent = build_agent(config, tiny_model(len(tok), seed=0), tok)
    env = build_env(demo, tok)
    env.reward_fns, env.reward_weights = [_varied_reward], [1.0]
    return agent, env, tok


def _varied_reward(completion: str, answer: str, question: str) -> float:
    """A reward that differs within groups of the untrained model (non-zero advantages)."""
    del answer, question
    return sum(map(ord, completion)) % 5 / 4


def _trainer_logprobs(agent: Any, ids: torch.Tensor) -> torch.Tensor:
    """[N, L - 1] the trainer's full-softmax log-probs of tokens 1..L-1 (before the update)."""
    with torch.no_grad():
        logits = agent.policy.logits(ids, torch.ones_like(ids)).float() / agent.temperature
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]


def _spy(agent: Any) -> list[dict[str, Any]]:
    """Record what ``learn`` receives (and the trainer's log-probs then)."""
    calls: list[dict[str, Any]] = []
    real = agent.learn

    def learn(experiences: Any, turn_ids: Any = None, sampling_logps: Any = None) -> Any:
        if isinstance(experiences, Rollout):  # the loops pass one flat rollout
            ids, masks, samp = (
                experiences.input_ids,
                experiences.mask,
                experiences.sampling_logprobs,
            )
        else:
            ids, masks, samp = experiences[0], experiences[1], sampling_logps
        ids = torch.cat(list(ids)) if isinstance(ids, list) else ids
        masks = torch.cat(list(masks)) if isinstance(masks, list) else masks
        if isinstance(samp, list):
            samp = torch.cat(samp)
        calls.append(
            {"ids": ids, "mask": masks.bool(), "sampling": samp,
             "trainer": _trainer_logprobs(agent, ids)}
        )  # fmt: skip
        out = real(experiences, turn_ids=turn_ids, sampling_logps=sampling_logps)
        calls[-1]["metrics"] = out
        return out

    agent.learn = learn
    return calls


def _one_step(agent: Any, env: Any, tmp_path: Path) -> None:
    finetune_llm_reasoning([agent], env, max_steps=1, evaluation_interval=1, run_dir=tmp_path,
                           verbose=False, plot=False, tensorboard=False)  # fmt: skip


def test_reasoning_loop_passes_sampling_logprobs_to_learn(tmp_path: Path) -> None:
    agent, env, _ = _setup(True, 0, tmp_path)
    calls = _spy(agent)
    _one_step(agent, env, tmp_path)
    assert len(calls) == 1
    call = calls[0]
    assert call["sampling"] is not None, "the sampling log-probs did not reach learn()"
    assert call["sampling"].shape == call["mask"].shape
    m = call["mask"]
    assert bool((call["sampling"][m] < 0).all())
    # sampler (top_k=0, top_p=1, temperature as trained) and trainer agree: the weights
    # exp(trainer - sampler) are 1 to the log-probs' rounding
    assert_close(call["trainer"][m], call["sampling"][m], reduction=REDUCTION,
                 stages=LOGPROB_STAGES, msg="trainer vs sampler log-probs")  # fmt: skip


def test_correction_changes_the_loss_when_sampler_and_trainer_disagree(tmp_path: Path) -> None:
    losses = {}
    for correction in (True, False):
        agent, env, _ = _setup(correction, 2, tmp_path / str(correction))
        calls = _spy(agent)
        _one_step(agent, env, tmp_path / str(correction))
        call = calls[0]
        m = call["mask"]
        weights = (call["trainer"][m] - call["sampling"][m]).exp()
        assert float((weights - 1).abs().max()) > 1e-2  # top-k=2 truncation: they disagree
        losses[correction] = call["metrics"]["pg_loss"]
        ids = call["ids"]
    assert losses[True] != pytest.approx(losses[False], abs=1e-6), losses
    # identical seeds: the same completions were sampled in both runs
    assert ids.shape == calls[0]["ids"].shape


def test_correction_is_a_no_op_when_sampler_and_trainer_agree(tmp_path: Path) -> None:
    losses = {}
    for correction in (True, False):
        agent, env, _ = _setup(correction, 0, tmp_path / str(correction))
        calls = _spy(agent)
        _one_step(agent, env, tmp_path / str(correction))
        losses[correction] = calls[0]["metrics"]["pg_loss"]
        m = calls[0]["mask"]
        scale = float(calls[0]["trainer"][m].abs().max())  # the log-probs' size
    # The weights are 1 to the log-probs' rounding; the loss's mean adds one more reduction and
    # the advantages (group-normalised, ~1) carry that error into it.
    assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), reduction=REDUCTION,
                 stages=LOGPROB_STAGES + 1, scale=scale, msg="pg_loss")  # fmt: skip


def test_multiturn_loop_aligns_sampling_logprobs_with_the_generated_tokens(
    tmp_path: Path,
) -> None:
    agent, _, tok = _setup(True, 0, tmp_path, max_model_len=160)
    calls = _spy(agent)

    def env_factory() -> TokenObservationWrapper:
        return TokenObservationWrapper(GuessTheNumberEnv(0, 3, max_guesses=3), tok, max_turns=3,
                                       pad_id=tok.pad_token_id, max_model_len=128,
                                       max_output_tokens=2)  # fmt: skip

    finetune_llm_multiturn([agent], max_turns=3, env_factory=env_factory, max_steps=1,
                           evaluation_interval=1, batch_size=2, group_size=2, run_dir=tmp_path,
                           verbose=False, plot=False, tensorboard=False)  # fmt: skip
    call = calls[0]
    assert call["sampling"] is not None and call["sampling"].shape == call["mask"].shape
    m = call["mask"]
    assert int(m.sum()) > 4  # several turns of generated tokens
    assert bool((call["sampling"][~m] == 0).all())
    # each generated token carries the log-prob it was sampled with (agreeing sampler)
    assert_close(call["sampling"][m], call["trainer"][m], reduction=REDUCTION,
                 stages=LOGPROB_STAGES, msg="sampler vs trainer log-probs")  # fmt: skip
