"""ILQL agent: one learn() against a float64 reference, micro-batching, target syncs, value-guided
decoding, checkpoints with the heads, clones, and clear errors for bad offline data."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import algos_testlib as tl
import pytest
import torch
from algos_testlib import make_ilql, token_rewards
from rl_algos import ILQL
from rl_testing.tolerance import assert_close

CASES = [
    pytest.param(False, True, "terminal", id="lora-2q-terminal"),
    pytest.param(False, False, "per_token", id="lora-1q-per-token"),
    pytest.param(True, True, "per_token", id="full-2q-per-token"),
]


@pytest.mark.parametrize(("full", "two_qs", "reward_kind"), CASES)
def test_learn_matches_float64_reference(full: bool, two_qs: bool, reward_kind: str) -> None:
    agent = make_ilql(full, two_qs=two_qs)
    batch = tl.make_batch()
    rewards = batch.rewards if reward_kind == "terminal" else token_rewards(batch)
    names = tl.trainable_names(agent)
    twin = tl.float64_copy(agent.policy)
    twin_heads = copy.deepcopy(agent.heads).double()
    metrics = agent.learn((batch.ids.clone(), batch.masks.clone(), rewards.clone()))
    ref = tl.reference_loss_ilql(twin, twin_heads, batch, rewards)
    ref.backward()
    tl.assert_loss_close(metrics["loss"], float(ref.detach()), stages=tl.ILQL_LOSS_STAGES)
    ref_grads = tl.param_grads({n: p for n, p in twin.named_parameters() if n in names})
    tl.assert_grads_close(
        tl.agent_grads(agent.policy, names), ref_grads, stages=tl.ILQL_GRAD_STAGES
    )
    head_grads = tl.param_grads(dict(twin_heads.named_parameters()))
    mine = tl.param_grads(dict(agent.heads.named_parameters()))
    assert max(float(g.abs().max()) for g in head_grads.values()) > 1e-3
    tl.assert_grads_close(mine, head_grads, stages=tl.ILQL_GRAD_STAGES)
    assert metrics["target_syncs"] == 1.0
    assert metrics["mean_reward"] == pytest.approx(
        float(rewards.sum(-1).mean() if rewards.dim() == 2 else rewards.mean()), rel=1e-6
    )
    for key in ("q_loss", "v_loss", "cql_loss", "awac_loss", "q_mean", "v_mean", "grad_norm"):
        assert math.isfinite(metrics[key]), key


def test_micro_batches_give_the_same_step() -> None:
    batch = tl.make_batch()
    whole, split = make_ilql(), make_ilql(micro_batch_size_per_gpu=2)
    m1 = whole.learn(batch.experiences())
    m2 = split.learn(batch.experiences())
    tl.assert_loss_close(m1["loss"], m2["loss"], stages=tl.ILQL_LOSS_STAGES)
    for key in ("q_loss", "v_loss", "cql_loss", "awac_loss", "q_mean"):
        tl.assert_loss_close(m1[key], m2[key], stages=tl.ILQL_LOSS_STAGES, msg=key)
    names = tl.trainable_names(whole)
    tl.assert_grads_close(tl.agent_grads(whole.policy, names),
                          tl.agent_grads(split.policy, names), stages=tl.ILQL_GRAD_STAGES)  # fmt: skip


def test_target_heads_sync_every_k_steps() -> None:
    agent = make_ilql(alpha=0.5, steps_for_target_q_sync=2, batch_size=2)  # 3 steps per learn
    batch = tl.make_batch()

    def targets() -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in agent.heads.target_q_heads.state_dict().items()}

    start = targets()
    first = agent.learn(batch.experiences())  # steps 1-3: a sync after step 2
    assert agent.steps == 3 and first["target_syncs"] == 1.0
    after_first = targets()
    # bit-exact: did the sync move the targets at all
    assert any(not torch.equal(v, after_first[k]) for k, v in start.items())
    second = agent.learn(batch.experiences())  # steps 4-6: syncs after steps 4 and 6
    assert agent.steps == 6 and second["target_syncs"] == 2.0
    assert all(not p.requires_grad for p in agent.heads.target_q_heads.parameters())
    # a sync is exactly one Polyak step: set up a known state and take one
    with torch.no_grad():
        online = {k: v.clone() for k, v in agent.heads.q_heads.state_dict().items()}
        old = targets()
    agent.heads.sync_target()
    for k, v in agent.heads.target_q_heads.state_dict().items():
        assert_close(v, 0.5 * online[k] + 0.5 * old[k], msg=k)  # elementwise: no sum


def test_metrics_leave_out_constants_and_copies() -> None:
    """``awac_weight_mean`` only with ``awac_beta > 0`` (with 0 every weight is exp(0) = 1) and
    ``mean_loss`` only over several steps (over one it is ``loss``); ``target_syncs`` varies
    with the steps a call takes (test_target_heads_sync_every_k_steps)."""
    batch = tl.make_batch()
    cloning = make_ilql(awac_beta=0.0).learn(batch.experiences())  # one step per learn
    assert not {"awac_weight_mean", "mean_loss", "mean_kl"} & set(cloning), sorted(cloning)
    assert {"loss", "awac_loss", "target_syncs"} <= set(cloning), sorted(cloning)
    weighted = make_ilql(awac_beta=0.5, batch_size=2).learn(batch.experiences())  # 3 steps
    assert abs(weighted["awac_weight_mean"] - 1.0) > 1e-3, weighted
    assert weighted["mean_loss"] != weighted["loss"], weighted


# --------------------------------------------------------------------------- decoding


def manual_greedy(agent: ILQL, prompt: list[int], steps: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(steps):
        x = torch.tensor([seq])
        with torch.no_grad():
            hidden = agent.policy.hidden_states(x, torch.ones_like(x))[:, -1]
            logits = agent.policy.logits(x, torch.ones_like(x))[:, -1]
            q = agent.heads.target_q(hidden)
            v = agent.heads.values(hidden)
        scores = torch.log_softmax(logits, -1) + agent.decode_beta * (q - v[:, None])
        token = int(scores.argmax())
        out.append(token)
        seq.append(token)
        if token == tl.EOS_ID:
            break
    return out


@pytest.mark.parametrize("decode_beta", [0.0, 2.0])
def test_get_action_is_value_guided(decode_beta: float) -> None:
    agent = make_ilql(decode_beta=decode_beta, max_output_tokens=4)
    with torch.no_grad():
        for head in agent.heads.target_q_heads:
            head[-1].bias[40] += 0.4  # token 40 looks good to the target heads
    prompts = [{"input_ids": torch.tensor([[tl.BOS_ID, 10, 11]])},
               {"input_ids": torch.tensor([[tl.BOS_ID, 20]])}]  # fmt: skip
    result = agent.get_action(prompts, training=False)
    for prompt, seq, amask in zip(prompts, result.completion_ids, result.action_masks, strict=True):
        p = prompt["input_ids"][0].tolist()
        got = seq[0, len(p) :][amask[0, len(p) - 1 :]].tolist()
        assert got == manual_greedy(agent, p, 4), decode_beta
    if decode_beta > 0:  # guidance changed the answer
        assert 40 in [t for s in result.completion_ids for t in s[0].tolist()]
    sampled = agent.get_action(prompts, training=True)
    assert len(sampled.completion_ids) == 2
    assert not agent.policy.causal_lm.get_output_embeddings()._forward_pre_hooks


# --------------------------------------------------------------------------- checkpoints, clones


def test_checkpoint_round_trip_with_heads(tmp_path: Path) -> None:
    agent = make_ilql()
    batch = tl.make_batch()
    agent.learn(batch.experiences())
    path = agent.save_checkpoint(tmp_path / "ck")
    names = {p.name for p in path.iterdir()}
    assert {"ilql_heads.safetensors", "ilql_heads.json", "optimizer.safetensors"} <= names
    assert not [p for p in path.rglob("*") if p.suffix in (".pt", ".bin", ".pkl", ".pth")]

    loaded = ILQL.load(path, actor_network=tl.tiny_model(0), lora_config=tl.lora_config())
    assert isinstance(loaded, ILQL) and loaded.steps == agent.steps and loaded.gamma == 0.9
    for k, v in agent.heads.state_dict().items():
        assert torch.equal(v, loaded.heads.state_dict()[k]), k  # bit-exact: a save/load round trip
    prompts = [{"input_ids": torch.tensor([[tl.BOS_ID, 10, 11]])}]
    a = agent.get_action(prompts, training=False).completion_ids[0]
    b = loaded.get_action(prompts, training=False).completion_ids[0]
    assert torch.equal(a, b)  # bit-exact: integer token ids
    # the optimizer state came back too: one more step is identical
    m1, m2 = agent.learn(batch.experiences()), loaded.learn(batch.experiences())
    assert m1["loss"] == m2["loss"]  # bit-exact: the same kernels on the loaded (equal) state
    for k, v in agent.heads.state_dict().items():
        # bit-exact: the same step from the round-tripped weights and optimizer state
        assert torch.equal(v, loaded.heads.state_dict()[k]), k


def test_clone_has_its_own_heads() -> None:
    agent = make_ilql()
    twin = agent.clone(index=1)
    assert isinstance(twin, ILQL) and twin.heads is not agent.heads
    ids = {id(p) for p in agent.heads.parameters()}
    assert not ids & {id(p) for p in twin.heads.parameters()}
    twin.learn(tl.make_batch().experiences())
    # bit-exact: did the twin's step move its heads at all (and leave the original's alone)
    assert any(not torch.equal(v, twin.heads.state_dict()[k])
               for k, v in agent.heads.state_dict().items())  # fmt: skip
    opt_params = {id(p) for g in twin.optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in twin.heads.trainable_parameters()} <= opt_params
    assert not ids & opt_params


# --------------------------------------------------------------------------- bad data


def test_bad_offline_data_errors_name_the_argument_and_fix() -> None:
    agent = make_ilql()
    b = tl.make_batch()
    ids, masks, r = b.experiences()
    cases: list[tuple[Any, str]] = [
        ((ids, masks, r[:4]), r"`rewards` has 4 entries for 6 sequences .* one reward per sequence"),
        ((ids, masks, None), r"`rewards` is None: ILQL learns from \(sample, reward\) pairs"),
        (([], [], []), r"`completion_ids` is empty: the offline dataset has no sequences"),
        ((ids[:0], masks[:0], r[:0]), r"`completion_ids` is empty"),
        ((ids, masks, torch.tensor([])), r"`rewards` is empty but there are 6 sequences"),
        ((ids, masks, torch.where(torch.arange(6) == 2, math.nan, r)),
         r"`rewards` has NaN or inf for sequence\(s\) \[2\]: fix the reward function or drop"),
        ((ids, masks[:, :-1], r), r"`action_masks` has shape \[6, 10\] but `completion_ids` has shape \[6, 12\]"),
        ((ids, torch.zeros_like(masks), r), r"`action_masks` rows \[0, 1, 2, 3, 4\] \(6 of 6\) have no action token"),
        ((ids, masks, torch.ones(6, 5)), r"per-token `rewards` has shape \[6, 5\] but `action_masks` has shape \[6, 11\]"),
        ((ids, masks, torch.ones(6, 11)), r"per-token `rewards` are nonzero at .* non-action position"),
        ((ids, masks), r"`experiences` must be \(completion_ids"),
        ({"completion_ids": ids, "rewards": r}, r"`experiences` lacks \['action_masks'\]"),
    ]  # fmt: skip
    for experiences, message in cases:
        with pytest.raises(ValueError, match=message):
            agent.learn(experiences)
    assert agent.steps == 0  # nothing was applied


def test_non_finite_loss_is_guarded() -> None:
    """The shared optimizer step's guard: raise (weights untouched) or skip with a warning."""
    for skip in (False, True):
        agent = make_ilql(skip_nonfinite=skip)
        with torch.no_grad():
            agent.heads.v_head[-1].bias.fill_(math.nan)
        before = {k: v.clone() for k, v in agent.heads.q_heads.state_dict().items()}
        if skip:
            with pytest.warns(RuntimeWarning, match="non-finite loss or gradient"):
                metrics = agent.learn(tl.make_batch().experiences())
            assert metrics["skipped_steps"] == 1.0
        else:
            with pytest.raises(FloatingPointError, match="Pass skip_nonfinite=True"):
                agent.learn(tl.make_batch().experiences())
        assert agent.steps == 0
        for k, v in agent.heads.q_heads.state_dict().items():
            assert torch.equal(v, before[k]), k  # bit-exact: the guarded step never wrote


def test_bad_hyperparameters() -> None:
    with pytest.raises(ValueError, match=r"`beta` \(the KL coefficient .*\) must be 0 for ILQL"):
        ILQL(actor_network=tl.tiny_model(0), **tl.agent_kwargs(beta=0.1))
    with pytest.raises(ValueError, match="use the Hugging Face engine"):
        ILQL(actor_network=tl.tiny_model(0), **tl.agent_kwargs(beta=0.0, use_vllm=True))
    for kw, message in [({"tau": 1.0}, r"`tau` must be in \(0, 1\)"),
                        ({"gamma": -0.1}, r"`gamma` must be in \[0, 1\]"),
                        ({"steps_for_target_q_sync": 0}, "`steps_for_target_q_sync` must be >= 1"),
                        ({"decode_q": "both"}, "`decode_q` must be 'target' or 'online'"),
                        ({"awac_max_weight": 0.0}, "`awac_max_weight` must be > 0 or None"),
                        ({"heads_lr": -1.0}, "`heads_lr` must be >= 0 or None")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            ILQL(actor_network=tl.tiny_model(0), **tl.agent_kwargs(beta=0.0, **kw))
