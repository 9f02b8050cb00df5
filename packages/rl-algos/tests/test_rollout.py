"""The flat rollout: generation builds it, ``learn`` reads it, AgileRL's blocks are its views."""

from __future__ import annotations

import algos_testlib as tl
import pytest
import torch
from algos_testlib import GROUP_SIZE, make_agent
from rl_algos import Rollout
from rl_algos.batch import as_rollout


def prompts() -> list[dict[str, torch.Tensor]]:
    rows = [[1, 10, 11, 12], [1, 20, 21]]
    return [
        {"input_ids": torch.tensor([r]), "attention_mask": torch.ones(1, len(r), dtype=torch.long)}
        for r in rows
    ]


def test_get_action_is_one_flat_rollout_and_its_blocks_are_views() -> None:
    agent = make_agent("GRPO", max_output_tokens=5, perturb_seed=None)
    result = agent.get_action(prompts())
    rollout = result.rollout
    N, L = rollout.input_ids.shape
    assert N == 2 * GROUP_SIZE and rollout.group_size == GROUP_SIZE
    assert rollout.mask.shape == (N, L - 1) and rollout.rewards is None
    assert rollout.prompt_lengths.tolist() == [4] * GROUP_SIZE + [3] * GROUP_SIZE
    assert rollout.group_index.tolist() == [0] * GROUP_SIZE + [1] * GROUP_SIZE
    comp, masks = result
    for b, (c, m) in enumerate(zip(comp, masks, strict=True)):
        rows = slice(b * GROUP_SIZE, (b + 1) * GROUP_SIZE)
        width = c.shape[1]
        assert c.data_ptr() == rollout.input_ids[rows].data_ptr()  # a view, not a copy
        # bit-exact: the blocks are slices of the rollout's own tensors
        assert torch.equal(c, rollout.input_ids[rows, :width])
        assert torch.equal(m, rollout.mask[rows, : width - 1])
        assert not rollout.input_ids[rows, width:].ne(agent.pad_token_id).any()  # only padding
    # bit-exact: the blocks stack back to the rollout itself (token ids and booleans copied)
    back = as_rollout((comp, masks, torch.zeros(N)), pad_token_id=agent.pad_token_id)
    assert torch.equal(back.input_ids, rollout.input_ids)
    assert torch.equal(back.mask, rollout.mask)  # bit-exact: booleans
    assert back.group_size == GROUP_SIZE


def test_learn_from_the_rollout_equals_learn_from_agilerls_tuple() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.5]])  # [B, G]
    out = {}
    for form in ("rollout", "tuple"):
        agent = make_agent("GRPO", max_output_tokens=5, vllm_importance_sampling_correction=True)
        result = agent.get_action(prompts())
        if form == "rollout":
            metrics = agent.learn(result.rollout.with_rewards(rewards))
        else:
            metrics = agent.learn(
                (result.completion_ids, result.action_masks, rewards),
                sampling_logps=result.sampling_logprobs,
            )
        out[form] = (metrics, tl.state_snapshot(agent.policy))
    assert out["rollout"][0] == out["tuple"][0]  # bit-exact: the same batch, the same step
    for name, value in out["rollout"][1].items():
        assert torch.equal(value, out["tuple"][1][name]), name


def test_a_rollout_checks_its_shapes_and_names_both() -> None:
    ids = torch.zeros(4, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"\(4, 4\).*\(4, 6\)"):
        Rollout(ids, torch.zeros(4, 4, dtype=torch.bool), torch.ones(4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="group_size"):
        Rollout(ids, torch.zeros(4, 5, dtype=torch.bool), torch.ones(4, dtype=torch.long), 3)
    rollout = Rollout(ids, torch.ones(4, 5, dtype=torch.bool), torch.ones(4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="no rewards"):
        rollout.to_batch(0)
    with pytest.raises(ValueError, match="rewards"):
        rollout.with_rewards(torch.zeros(3))
    batch = rollout.with_rewards(torch.zeros(2, 2)).to_batch(0)
    assert batch.rewards.shape == (4,)
