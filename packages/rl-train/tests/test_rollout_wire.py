"""What crosses the trainer/worker boundary: packed tensors, collated batches, weight pushes.

No worker process here (those runs are in ``tests_integration/test_async.py``): these check
that the bytes decode to the very tensors ``learn`` and ``Engine.update_weights`` would get.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from rl_algos.batch import parse_experiences
from rl_train.demo import DemoConfig, build_agent, build_env
from rl_train.experience import collect
from rl_train.rollout_worker import (
    Packed,
    RolloutBatch,
    actor_named_parameters,
    actor_tensors,
    apply_weights,
    encode_experience,
    weight_update,
)
from rl_train.tiny import tiny_model, tiny_tokenizer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.long, torch.bool])
def test_packed_round_trips_every_dtype_and_shape(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g), torch.randn(0, 2)]
    tensors = [(t > 0) if dtype == torch.bool else (t * 10).to(dtype) for t in tensors]
    back = pickle.loads(pickle.dumps(Packed.of(tensors))).unpack()
    assert [b.dtype for b in back] == [dtype] * 3
    for a, b in zip(tensors, back, strict=True):
        assert b.shape == a.shape and torch.equal(a, b)  # bit-exact: a pickle round trip
    back[0].zero_()  # writable (the trainer's optimizer and copy_ may write into them)
    assert Packed.of([]).unpack() == []


def test_a_sampled_batch_decodes_to_the_batch_learn_parses_from_the_blocks() -> None:
    tok = tiny_tokenizer()
    demo = DemoConfig(prompts_per_step=3, group_size=4, n_train=12, n_test=4)
    agent = build_agent(demo, tiny_model(len(tok)), tok)
    env = build_env(demo, tok)
    prompts = env.reset(reset_dataloaders=True)
    state = agent._rng.getstate()
    experience, _ = collect(agent, env, prompts)
    payload = encode_experience(experience)
    agent._rng.setstate(state)  # the same seed again: the same samples, as blocks
    env.reset(reset_dataloaders=True)
    result = agent.get_action(prompts)
    _, rewards = env.step(result.completion_ids)
    wire = RolloutBatch(0, 0, payload, None, 0, state, 0.0, 0.0).experience().rollout
    assert isinstance(wire.input_ids, torch.Tensor) and wire.input_ids.dim() == 2
    pad = agent.pad_token_id
    direct = parse_experiences(
        (result.completion_ids, result.action_masks, rewards),
        pad_token_id=pad,
        sampling_logps=result.sampling_logprobs,
    )
    sent = parse_experiences(wire, pad_token_id=pad)
    for field in ("input_ids", "attention_mask", "mask", "rewards", "sampling_logprobs"):
        a, b = getattr(direct, field), getattr(sent, field)
        # bit-exact: the same parse of the same tensors, sent as bytes
        assert a.dtype == b.dtype and torch.equal(a, b), field


def test_a_weight_push_with_the_cached_names_carries_the_current_weights() -> None:
    tok = tiny_tokenizer()
    demo = DemoConfig()
    trainer = build_agent(demo, tiny_model(len(tok), seed=0), tok)
    worker = build_agent(demo, tiny_model(len(tok), seed=1), tok)
    named = actor_named_parameters(trainer)
    with torch.no_grad():  # an update in place after the names were looked up
        for p in trainer.actor_parameters():
            p.add_(1.0)
    update = weight_update(trainer, 7, named)
    assert update.version == 7
    tensors = actor_tensors(trainer).values()
    assert update.tensor_bytes == sum(t.numel() * t.element_size() for t in tensors)
    apply_weights(worker, update)
    mine = dict(worker.policy.causal_lm.named_parameters())
    for name, p in trainer.policy.causal_lm.named_parameters():
        assert torch.equal(mine[name], p), name  # bit-exact: weights copied as bytes
