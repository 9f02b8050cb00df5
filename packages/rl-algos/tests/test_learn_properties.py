"""What ``learn()`` may touch, and the bad inputs it must reject with a clear ValueError."""

from __future__ import annotations

import re

import algos_testlib as tl
import pytest

ALGOS = ["GRPO", "LLMREINFORCE", "LLMPPO"]


def _allowed_to_change(name: str, algo: str) -> bool:
    if tl.is_lora_of(name, "actor"):
        return True
    if algo == "LLMPPO":
        return tl.is_lora_of(name, "critic") or "value_head" in name
    return False


@pytest.mark.parametrize("algo", ALGOS)
def test_learn_changes_only_the_trainable_weights(algo: str) -> None:
    agent = tl.make_agent(algo)
    names = tl.named_params(agent.policy)
    actor = {n for n in names if tl.is_lora_of(n, "actor")}
    reference = {n for n in names if tl.is_lora_of(n, "reference")}
    assert actor, "no actor adapter"
    assert reference, "no reference adapter (use_separate_reference_adapter=True is the default)"
    before = tl.state_snapshot(agent.policy)

    agent.learn(tl.make_batch().experiences())

    changed = tl.changed_keys(before, agent.policy)
    state_names = set(before)
    base = {n for n in state_names if "lora_" not in n and "value_head" not in n}
    ref_state = {n for n in state_names if tl.is_lora_of(n, "reference")}
    assert not changed & base, f"base (non-LoRA) weights changed: {sorted(changed & base)}"
    assert not changed & ref_state, f"reference adapter changed: {sorted(changed & ref_state)}"
    unexpected = {n for n in changed if not _allowed_to_change(n, algo)}
    assert not unexpected, f"unexpected weights changed: {sorted(unexpected)}"
    # The actor's lora_B are perturbed, so every actor tensor has a non-zero gradient and the
    # first AdamW step (lr 1e-3) moves each of them.
    actor_state = {n for n in state_names if tl.is_lora_of(n, "actor")}
    assert actor_state <= changed, f"actor weights unchanged: {sorted(actor_state - changed)}"
    if algo == "LLMPPO":
        head = {n for n in state_names if "value_head" in n}
        assert head, "no value head in the PPO policy"
        assert head <= changed, f"value head unchanged: {sorted(head - changed)}"
    for n in reference:
        g = names[n].grad
        assert g is None or not bool(g.any()), f"reference parameter {n} has a gradient"


@pytest.mark.parametrize("algo", ALGOS)
def test_actor_parameters_are_the_actor_adapter(algo: str) -> None:
    agent = tl.make_agent(algo, perturb_seed=None)
    got = set(tl.trainable_names(agent))
    expected = {n for n in tl.named_params(agent.policy) if tl.is_lora_of(n, "actor")}
    assert got == expected


@pytest.mark.parametrize("algo", ALGOS)
def test_nan_reward_raises(algo: str) -> None:
    agent = tl.make_agent(algo)
    ids, masks, rewards = tl.make_batch().experiences()
    rewards[2] = float("nan")
    with pytest.raises(ValueError):  # noqa: PT011 - the spec fixes only the type
        agent.learn((ids, masks, rewards))


@pytest.mark.parametrize("algo", ALGOS)
def test_rewards_with_wrong_row_count_raise(algo: str) -> None:
    agent = tl.make_agent(algo)
    ids, masks, rewards = tl.make_batch().experiences()
    with pytest.raises(ValueError, match="reward"):
        agent.learn((ids, masks, rewards[:-1]))


def test_group_size_not_dividing_n_raises() -> None:
    agent = tl.make_agent("GRPO", group_size=4)  # N = 6
    with pytest.raises(ValueError, match="group_size") as info:
        agent.learn(tl.make_batch().experiences())
    # "ValueError naming group_size and N": the message also gives N = 6.
    assert re.search(r"\b6\b", str(info.value)), str(info.value)


@pytest.mark.parametrize("algo", ["GRPO", "LLMREINFORCE"])
def test_turn_level_without_turn_ids_raises(algo: str) -> None:
    agent = tl.make_agent(algo, importance_sampling_level="turn")
    with pytest.raises(ValueError, match="turn_ids"):
        agent.learn(tl.make_batch().experiences())


@pytest.mark.parametrize("level", ["trajectory", "turn"])
def test_liger_loss_with_non_token_level_raises_at_construction(level: str) -> None:
    with pytest.raises(ValueError, match=r"use_liger_loss|importance_sampling_level"):
        tl.make_agent("GRPO", use_liger_loss=True, importance_sampling_level=level)


@pytest.mark.parametrize("level", ["token", "turn"])
def test_gspo_with_another_ratio_level_raises_at_construction(level: str) -> None:
    """GSPO's ratio is one per sequence: a token or turn ratio asked for with it is refused
    (it used to be replaced by the sequence ratio without a word); unset or "trajectory" builds."""
    with pytest.raises(ValueError, match=rf"loss_type='gspo'.*importance_sampling_level='{level}'"):
        tl.make_agent("GRPO", loss_type="gspo", importance_sampling_level=level, perturb_seed=None)
    with pytest.raises(ValueError, match=rf"loss_type='gspo'.*importance_sampling_level='{level}'"):
        tl.make_agent("GSPO", importance_sampling_level=level, perturb_seed=None)
    agent = tl.make_agent("GSPO", importance_sampling_level="trajectory", perturb_seed=None)
    assert agent.importance_sampling_level == "trajectory"


def test_reinforce_liger_loss_with_turn_level_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"use_liger_loss=True.*'turn'.*use_liger_loss=False"):
        tl.make_agent("LLMREINFORCE", use_liger_loss=True, importance_sampling_level="turn")


@pytest.mark.parametrize("algo", ALGOS)
def test_completion_ids_action_masks_shape_mismatch_raises(algo: str) -> None:
    agent = tl.make_agent(algo)
    ids, masks, rewards = tl.make_batch().experiences()
    bad_masks = masks[:, :-1].clone()  # [6, 10] instead of [6, 11]
    with pytest.raises(ValueError) as info:  # noqa: PT011 - the message is checked below
        agent.learn((ids, bad_masks, rewards))
    msg = str(info.value)
    assert tl.mentions_shape(msg, ids.shape), msg
    assert tl.mentions_shape(msg, bad_masks.shape), msg


def test_errors_leave_the_weights_untouched() -> None:
    """A rejected batch (NaN reward) performs no optimizer step."""
    agent = tl.make_agent("GRPO")
    before = tl.state_snapshot(agent.policy)
    ids, masks, rewards = tl.make_batch().experiences()
    rewards[0] = float("nan")
    with pytest.raises(ValueError):  # noqa: PT011
        agent.learn((ids, masks, rewards))
    assert not tl.changed_keys(before, agent.policy)
