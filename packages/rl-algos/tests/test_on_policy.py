"""The on-policy update skips the old-log-prob forward and computes the same step.

``learn()`` takes one optimizer step from the weights that produced the batch when it runs one
epoch of one minibatch without a mismatch correction (``LLMAlgorithm.on_policy``); the old
log-probs are then the loss's own, detached, and phase 3 does not score them unless the parts
read them (``AgentParts.needs_old_logprobs``). Each test compares with the same agent made to
score them (an ``on_policy`` override, the documented extension point): loss and every gradient
agree to float32 rounding, and the phase-3 ``Scores`` say which path ran.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import algos_testlib as tl
import pytest
import rl_algos
import torch


@cache
def _recording(algo: str, scored: bool) -> type:
    """``rl_algos.<algo>`` that records phase 3's ``Scores`` (and, with ``scored``, is never
    treated as on-policy, so the old log-probs are always scored)."""
    base = getattr(rl_algos, algo)

    def parts(self: Any, batch: Any) -> Any:
        out = base.parts(self, batch)
        estimate = out.estimate

        def recorded(b: Any, scores: Any) -> Any:
            self.seen.append(scores)
            return estimate(b, scores)

        return rl_algos.AgentParts(recorded, out.objective, out.extra_loss, out.needs_old_logprobs)

    body: dict[str, Any] = {"parts": parts, "algo_name": f"{base.algo_name}-rec{int(scored)}"}
    if scored:
        body["on_policy"] = lambda self, batch: False
    return type(f"{algo}Recording{int(scored)}", (base,), body)


def _agent(algo: str, scored: bool, **kw: Any) -> Any:
    extra: dict[str, Any] = {"group_size": tl.GROUP_SIZE} if algo == "GRPO" else {}
    agent = _recording(algo, scored)(
        actor_network=tl.tiny_model(0), **tl.agent_kwargs(**{**extra, **kw})
    )
    tl.perturb_adapter(agent.policy, "actor", seed=1)
    agent.seen = []
    return agent


CASES = [
    pytest.param("GRPO", {}, id="grpo"),
    pytest.param("GRPO", {"use_liger_loss": True}, id="grpo-fused"),
    pytest.param("GRPO", {"micro_batch_size_per_gpu": 3}, id="grpo-micro-batched"),
    pytest.param("GRPO", {"loss_type": "gspo"}, id="gspo"),
    pytest.param("LLMREINFORCE", {}, id="reinforce"),
]


@pytest.mark.parametrize(("algo", "kw"), CASES)
def test_on_policy_step_equals_the_scored_step(algo: str, kw: dict[str, Any]) -> None:
    batch = tl.make_batch()
    fast, scored = _agent(algo, False, **kw), _agent(algo, True, **kw)
    names = tl.trainable_names(fast)
    m_fast = fast.learn(batch.experiences())
    m_scored = scored.learn(batch.experiences())
    assert fast.seen[0].old_logprobs is None  # the forward was skipped
    assert scored.seen[0].old_logprobs is not None
    tl.assert_loss_close(m_fast["loss"], m_scored["loss"])
    grads = tl.agent_grads(fast.policy, names)
    assert max(float(g.abs().max()) for g in grads.values()) > 1e-3, "degenerate test case"
    # The step's gradients, not the weights after it: Adam's first step moves each weight by
    # about lr * sign(grad), so a near-zero gradient whose sign differs by rounding moves the
    # two routes' weights up to 2 * lr apart.
    tl.assert_grads_close(grads, tl.agent_grads(scored.policy, names))


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"update_epochs": 2}, "a second epoch steps from moved weights"),
        ({"batch_size": 4}, "a second minibatch steps from moved weights"),
        ({"use_kl_advantage_shaping": True}, "the advantages read old - ref"),
        ({"advantage_estimator": "reinforce_pp_baseline"}, "REINFORCE++ puts the KL in the reward"),
    ],
)
def test_old_logprobs_are_scored_when_the_update_reads_them(kw: dict[str, Any], why: str) -> None:
    agent = _agent("GRPO", False, **kw)
    agent.learn(tl.make_batch().experiences())
    assert agent.seen[0].old_logprobs is not None, why


def test_scores_are_ordinary_tensors() -> None:
    # phase 3 runs its forwards in inference mode; what it returns must still be usable where
    # autograd saves it for the backward (an inference tensor cannot be)
    agent = _agent("GRPO", True, beta=0.1)
    agent.learn(tl.make_batch().experiences())
    scores = agent.seen[0]
    assert scores.old_logprobs is not None and scores.ref_logprobs is not None
    for t in (scores.old_logprobs, scores.ref_logprobs):
        assert not t.is_inference()
        x = torch.ones_like(t, requires_grad=True)
        (x * t).sum().backward()  # mul saves ``t`` for x's gradient
        # bit-exact: that gradient is ``t`` times a gradient of ones
        assert torch.equal(x.grad, t)


@pytest.mark.parametrize("fused", [False, True])
def test_on_policy_correction_equals_the_scored_correction(fused: bool) -> None:
    # The mismatch correction weighs tokens by min(exp(old - sampler), cap). On-policy the
    # plain loss takes `old` from each micro-batch's own log-probs; the fused loss needs them
    # scored. Either way: the same loss and gradients as the scored step.
    batch = tl.make_batch()
    gen = torch.Generator().manual_seed(3)
    sampling = -(torch.rand(batch.masks.shape, generator=gen) * 8.0)  # weights above and below cap
    kw: dict[str, Any] = {"use_liger_loss": fused, "micro_batch_size_per_gpu": 3}
    fast, scored = _agent("GRPO", False, **kw), _agent("GRPO", True, **kw)
    plain = _agent("GRPO", False, vllm_importance_sampling_correction=False, **kw)
    names = tl.trainable_names(fast)
    m_fast = fast.learn(batch.experiences(), sampling_logps=sampling.clone())
    m_scored = scored.learn(batch.experiences(), sampling_logps=sampling.clone())
    m_plain = plain.learn(batch.experiences(), sampling_logps=sampling.clone())
    assert (fast.seen[0].old_logprobs is not None) == fused
    assert plain.seen[0].old_logprobs is None  # no correction: nothing reads them
    tl.assert_loss_close(m_fast["loss"], m_scored["loss"])
    assert m_fast["loss"] != pytest.approx(m_plain["loss"], rel=1e-3)  # the weights matter
    grads = tl.agent_grads(fast.policy, names)
    tl.assert_grads_close(grads, tl.agent_grads(scored.policy, names))


def test_reading_unscored_old_logprobs_names_the_fix() -> None:
    scores = rl_algos.Scores(None, None)
    with pytest.raises(ValueError, match="needs_old_logprobs=True"):
        scores.old()


def test_clip_against_sampler_takes_the_old_logprobs_from_the_sampler() -> None:
    # clip_against_sampler: the sampler's log-probs are the old ones (no forward, no mismatch
    # weights), so the clipped ratio is pi / sampler. Sampled by the trainer's own weights, the
    # step is the scored on-policy one; sampled by a policy e times less likely on every action,
    # the clip cuts the positive-advantage tokens and the step changes.
    batch = tl.make_batch()
    scored = _agent("GRPO", True)
    m_scored = scored.learn(batch.experiences())
    own = scored.seen[0].old_logprobs
    mask = torch.as_tensor(batch.masks, dtype=torch.bool)
    same = _agent("GRPO", False, clip_against_sampler=True)
    m_same = same.learn(batch.experiences(), sampling_logps=own.clone())
    assert torch.equal(same.seen[0].old_logprobs, own)  # bit-exact: passed through, not computed
    tl.assert_loss_close(m_same["loss"], m_scored["loss"])
    names = tl.trainable_names(same)
    tl.assert_grads_close(tl.agent_grads(same.policy, names), tl.agent_grads(scored.policy, names))
    far = _agent("GRPO", False, clip_against_sampler=True)
    m_far = far.learn(batch.experiences(), sampling_logps=own - mask.float())
    assert m_same["clip_fraction"] == 0.0 < m_far["clip_fraction"]
    assert m_far["loss"] != pytest.approx(m_same["loss"], rel=1e-3)


def test_scored_old_logprobs_are_the_update_s_own_to_the_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # phase 3 scores through the same lean LoRA forward as the update (no autograd node, the
    # same operations), so before the step the ratio new / old is exactly 1
    agent = _agent("GRPO", True)
    seen: list[torch.Tensor] = []
    scorer_type = type(agent.scorer)
    real = scorer_type.logprobs

    def recorded(self: Any, *args: Any, **kw: Any) -> torch.Tensor:
        out = real(self, *args, **kw)
        if torch.is_grad_enabled():  # the update's forward
            seen.append(out.detach())
        return out

    monkeypatch.setattr(scorer_type, "logprobs", recorded)
    agent.learn(tl.make_batch().experiences())
    old = agent.seen[0].old_logprobs
    assert old is not None and len(seen) == 1
    # bit-exact: the same kernels on the same inputs, in inference mode and with autograd
    assert torch.equal(seen[0], old)
