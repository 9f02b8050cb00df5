"""GRPO's, LLMPPO's, LLMREINFORCE's and ILQL's ``learn()`` on every device against the float64
CPU reference.

The agent runs on the device (``rl_testing.devices``: CPU here, CUDA under ``pytest -m cuda`` /
``nox -s gpu``), padded and packed (each group's prompt computed once by default, or varlen
attention per row), with gradient checkpointing and with activation offload (pinned host memory
on CUDA). The reference is
test_learn_reference's: a float64 copy of the policy on CPU, full logits, the spec's loss. The
loss and every trainable gradient agree to float32 rounding (``algos_testlib``'s tolerances).
"""

from __future__ import annotations

from typing import Any

import algos_testlib as tl
import pytest
import torch
from rl_testing.devices import DEVICES

OPTIONS = [
    pytest.param({"use_sequence_packing": False}, id="padded"),
    pytest.param({"use_sequence_packing": True}, id="packed"),  # each group's prompt once
    pytest.param({"share_prompt_prefix": False}, id="packed-unshared"),
    pytest.param({"gradient_checkpointing": True}, id="checkpointing-packed"),
    pytest.param({"gradient_checkpointing": True, "activation_offload": True}, id="ckpt-offload"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", OPTIONS)
def test_grpo_learn_on_device_matches_float64(device: str, options: dict[str, Any]) -> None:
    agent = tl.make_agent("GRPO", device=device, **options)
    names = tl.trainable_names(agent)
    twin = tl.float64_copy(agent.policy).cpu()
    batch = tl.make_batch()
    metrics = agent.learn(batch.experiences())
    assert all(p.device.type == torch.device(device).type for p in agent.actor_parameters())
    # the batch's groups repeat their prompts: packed forwards share them unless told not to
    shares = options.get("use_sequence_packing") is not False and options.get(
        "share_prompt_prefix", True
    )
    assert (agent.packing_report.shared_forwards > 0) == shares

    def reference(policy: Any) -> tl.RefLoss:
        return tl.reference_loss_grpo(
            policy, batch, group_size=tl.GROUP_SIZE, beta=tl.BETA, temperature=tl.TEMPERATURE
        )

    _assert_matches(agent, twin, reference, names, metrics)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["LLMPPO", "LLMREINFORCE"])
def test_ppo_and_reinforce_learn_on_device_match_float64(device: str, algo: str) -> None:
    """The critic's adapter and value head, GAE and REINFORCE's baseline on the device
    (test_learn_reference's cases, whose float64 reference runs on CPU)."""
    agent = tl.make_agent(algo, device=device, clip_coef=0.2)
    critic = algo == "LLMPPO"
    names = tl.trainable_names(agent, with_critic=critic)
    twin = tl.float64_copy(agent.policy).cpu()
    batch = tl.make_batch()
    metrics = agent.learn(batch.experiences())
    params = [p for p in agent.policy.parameters() if p.requires_grad]
    assert params and all(p.device.type == torch.device(device).type for p in params)

    def reference(policy: Any) -> tl.RefLoss:
        if not critic:
            return tl.reference_loss_reinforce(
                policy, batch, beta=tl.BETA, temperature=tl.TEMPERATURE, clip_coef=0.2
            )
        return tl.reference_loss_ppo(
            policy, batch, beta=tl.BETA, temperature=tl.TEMPERATURE, clip_coef=0.2,
            vf_coef=tl.PPO_KW["vf_coef"], gamma=tl.PPO_KW["gamma"],
            gae_lambda=tl.PPO_KW["gae_lambda"], cliprange_value=tl.PPO_KW["cliprange_value"],
            turn_value_reduction=agent.config.turn_value_reduction,
        )  # fmt: skip

    _assert_matches(agent, twin, reference, names, metrics)


@pytest.mark.parametrize("device", DEVICES)
def test_ilql_learn_on_device_matches_float64(device: str) -> None:
    """ILQL's Q, target-Q and value heads on the device (test_ilql's LoRA case with terminal
    rewards, its float64 reference on CPU)."""
    import copy

    agent = tl.make_ilql(two_qs=True, device=device)
    batch = tl.make_batch()
    names = tl.trainable_names(agent)
    twin = tl.float64_copy(agent.policy).cpu()
    twin_heads = copy.deepcopy(agent.heads).double().cpu()
    metrics = agent.learn(batch.experiences())
    heads = dict(agent.heads.named_parameters())
    assert all(p.device.type == torch.device(device).type for p in heads.values())
    ref = tl.reference_loss_ilql(twin, twin_heads, batch, batch.rewards)
    ref.backward()
    tl.assert_loss_close(metrics["loss"], float(ref.detach()), stages=tl.ILQL_LOSS_STAGES)
    ref_grads = tl.param_grads({n: p for n, p in twin.named_parameters() if n in names})
    got = {n: g.cpu() for n, g in tl.agent_grads(agent.policy, names).items()}
    tl.assert_grads_close(got, ref_grads, stages=tl.ILQL_GRAD_STAGES)
    head_ref = tl.param_grads(dict(twin_heads.named_parameters()))
    assert max(float(g.abs().max()) for g in head_ref.values()) > 1e-3, "degenerate test case"
    head_got = {n: g.cpu() for n, g in tl.param_grads(heads).items()}
    tl.assert_grads_close(head_got, head_ref, stages=tl.ILQL_GRAD_STAGES)


def _assert_matches(
    agent: Any,
    twin: Any,
    reference: Any,
    names: list[str],
    metrics: dict[str, float],
) -> None:
    """The agent's loss and gradients (on its device) against ``reference`` on the float64
    CPU ``twin`` of its pre-update policy."""
    ref, ref_grads = tl.reference_grads(twin, reference, names)
    assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-3, "degenerate test case"
    tl.assert_loss_close(metrics["loss"], float(ref.loss.detach()))
    got = {n: g.cpu() for n, g in tl.agent_grads(agent.policy, names).items()}
    tl.assert_grads_close(got, ref_grads)
