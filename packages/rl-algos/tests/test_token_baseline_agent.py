"""verl's optimal token baseline from the agents: ``GRPO(advantage_estimator=
"optimal_token_baseline")``.

Phase 3 scores ``sum_v pi(v)^2`` at every action token in the forward of the old log-probs
(``Scores.sum_pi_squared``), for every row however the forwards are cut (packed or padded,
split by a token budget; the update in micro-batches of rows); phase 4 calls
``rl_advantages.optimal_token_baseline`` with each row's reward on its last action token, the
old log-probs, those sums, ``G`` and the rollout correction's weights. The references
recompute everything from the full logits of a float64 copy of the policy (no rl-kernels
code), so the agent's advantages (float32, fused head) agree with them to float32 rounding.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import algos_testlib as tl
import pytest
import rl_advantages
import rl_algos
import rl_losses
import torch
from rl_algos.batch import Scores
from rl_algos.estimators import GroupAdvantage, group_advantages, resolve_estimator_name
from rl_testing.tolerance import assert_close

OTB = "optimal_token_baseline"
F64 = torch.float64
#: The tiny model's logits are nearly flat (std ~0.2): at the tests' usual temperature every
#: sum_pi_squared is ~1/V and the baseline barely depends on it. At 0.1 they range ~0.1-0.6,
#: so a wrong sum changes the advantages.
TEMPERATURE = 0.1


@cache
def _recording() -> type:
    """GRPO that records phase 3's ``Scores`` and phase 4's ``Estimates`` of each learn()."""

    def parts(self: Any, batch: Any) -> Any:
        out = rl_algos.GRPO.parts(self, batch)

        def recorded(b: Any, scores: Any) -> Any:
            est = out.estimate(b, scores)
            self.seen.append((scores, est))
            return est

        return dataclasses.replace(out, estimate=recorded)

    return type("GRPORecording", (rl_algos.GRPO,), {"parts": parts, "algo_name": "grpo-otb-rec"})


def _agent(**kw: Any) -> Any:
    agent = _recording()(
        actor_network=tl.tiny_model(0),
        **tl.agent_kwargs(
            group_size=tl.GROUP_SIZE,
            advantage_estimator=OTB,
            beta=0.0,
            temperature=TEMPERATURE,
            **kw,
        ),
    )
    tl.perturb_adapter(agent.policy, "actor", seed=1)
    agent.seen = []
    return agent


def _reference(policy: Any, batch: tl.Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprobs, sum_pi_squared, token_rewards)`` [N, T] in float64 from the full logits."""
    twin = tl.float64_copy(policy)
    att = tl.attention_from(batch.ids, batch.masks)
    with torch.no_grad():
        z = twin.logits(batch.ids, att, role="actor")[:, :-1] / TEMPERATURE
    p = torch.softmax(z, dim=-1)
    lp = torch.log_softmax(z, dim=-1).gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    spi = (p * p).sum(-1)
    rewards = torch.zeros(batch.masks.shape, dtype=F64)
    for n in range(batch.n):
        last = int(batch.masks[n].nonzero().max())
        rewards[n, last] = float(batch.rewards[n])
    return lp, spi, rewards


def _logit_scale(agent: Any) -> float:
    """The size of the terms a log-prob is the difference of: the largest ``|z / tau|``."""
    batch = tl.make_batch()
    with torch.no_grad():
        z = agent.policy.logits(batch.ids, tl.attention_from(batch.ids, batch.masks))
    return max(1.0, float(z.abs().max()) / TEMPERATURE)


def _tol(scale: float) -> dict[str, Any]:
    """Float32 rounding through the model (its layers and the head) and the baseline's sums."""
    return {"reduction": tl.REDUCTION, "stages": tl.LOSS_STAGES + 1, "scale": scale}


FORWARDS = [
    pytest.param({"use_sequence_packing": False}, id="padded"),
    pytest.param({"use_sequence_packing": True}, id="packed"),
    pytest.param({"micro_batch_tokens": 24}, id="token-budget"),
    pytest.param({"micro_batch_size_per_gpu": 2, "use_sequence_packing": False}, id="rows"),
]


@pytest.mark.parametrize("kw", FORWARDS)
def test_advantages_are_the_baseline_of_the_float64_recomputation(kw: dict[str, Any]) -> None:
    batch = tl.make_batch()
    agent = _agent(**kw)
    lp64, spi64, rewards64 = _reference(agent.policy, batch)
    zscale = _logit_scale(agent)
    before = {n: p.detach().clone() for n, p in agent.policy.named_parameters() if p.requires_grad}
    metrics = agent.learn(batch.experiences())
    ((scores, est),) = agent.seen
    mask = batch.masks
    assert scores.sum_pi_squared is not None and scores.old_logprobs is not None
    # every row scored, whatever the forwards: the sums at the actions, 0 elsewhere
    assert_close(scores.sum_pi_squared, torch.where(mask, spi64, 0.0), **_tol(1.0))
    assert_close(scores.old_logprobs, torch.where(mask, lp64, 0.0), **_tol(zscale))
    expected = rl_advantages.optimal_token_baseline(rewards64, mask, lp64, spi64, tl.GROUP_SIZE)
    assert_close(est.advantages, expected.advantages, **_tol(float(rewards64.abs().max())))
    # the baseline varies along a row: not GRPO's one number per sequence
    assert len({round(float(a), 4) for a in est.advantages[2][mask[2]]}) > 1
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # bit-exact: any change at all shows the update moved a weight
    moved = [n for n, p in agent.policy.named_parameters() if n in before]
    assert any(not torch.equal(dict(agent.policy.named_parameters())[n], before[n]) for n in moved)


def test_the_rollout_correction_weighs_the_paths() -> None:
    """With sampler log-probs and the correction on, the baseline takes the correction's
    weights ``min(pi_old / pi_sampler, cap)`` (verl's ``rollout_is_weights``) and the loss
    gets the same weights."""
    batch = tl.make_batch()
    agent = _agent()
    lp64, spi64, rewards64 = _reference(agent.policy, batch)
    gen = torch.Generator().manual_seed(5)
    sampling = torch.where(
        batch.masks, lp64.float() + 0.3 * torch.randn(lp64.shape, generator=gen), 0.0
    )
    agent.learn(batch.experiences(), sampling_logps=sampling.clone())
    ((_, est),) = agent.seen
    rho = rl_losses.rollout_correction(lp64, sampling.double(), batch.masks, cap=2.0).weights
    expected = rl_advantages.optimal_token_baseline(
        rewards64, batch.masks, lp64, spi64, tl.GROUP_SIZE, is_weights=rho
    )
    scale = float(rewards64.abs().max())
    assert_close(est.advantages, expected.advantages, **_tol(scale))
    unweighted = rl_advantages.optimal_token_baseline(
        rewards64, batch.masks, lp64, spi64, tl.GROUP_SIZE
    )
    assert float((expected.advantages - unweighted.advantages).abs().max()) > 1e-3


def test_clip_against_sampler_scores_the_sums_and_takes_the_sampler_logprobs() -> None:
    """With ``clip_against_sampler`` the old log-probs are the sampler's (no mismatch weights);
    the actor's forward still runs, for ``sum_pi_squared``."""
    batch = tl.make_batch()
    agent = _agent(clip_against_sampler=True)
    lp64, spi64, _ = _reference(agent.policy, batch)
    sampling = torch.where(batch.masks, lp64.float() - 0.05, 0.0)
    metrics = agent.learn(batch.experiences(), sampling_logps=sampling.clone())
    ((scores, _),) = agent.seen
    assert torch.equal(scores.old_logprobs, sampling)  # bit-exact: passed through
    assert_close(scores.sum_pi_squared, torch.where(batch.masks, spi64, 0.0), **_tol(1.0))
    assert torch.isfinite(torch.tensor(metrics["loss"]))


def test_module_path_of_a_trainable_partitioned_head_gives_the_same_sums() -> None:
    """The ZeRO-3 path with a trainable head (``Scorer._by_module``: chunked logits through the
    output module, ``rl_kernels.sum_pi_squared``) equals the fused head's sums and log-probs."""
    agent = _agent()
    batch = agent.parse(tl.make_batch().experiences(), None, None)
    agent.policy.lm_head_weight.requires_grad_(True)
    module_path = dataclasses.replace(agent.scorer, zero_stage=3, chunk_rows=4)
    assert module_path.trainable_partitioned_head()
    args = (batch.input_ids, batch.attention_mask, batch.mask)
    with torch.no_grad():
        fused = agent.scorer.logprobs_and_sum_pi_squared(*args)
        plain = module_path.logprobs_and_sum_pi_squared(*args)
    scale = _logit_scale(agent)  # both are differences of O(|z / tau|) terms
    for got, want in zip(plain, fused, strict=True):
        assert_close(got, want, reduction=tl.REDUCTION, stages=2, scale=scale)


def test_the_estimator_is_no_longer_refused_and_names_what_it_reads() -> None:
    assert resolve_estimator_name(OTB) == OTB
    agent = _agent()
    parts = agent.parts(agent.parse(tl.make_batch().experiences(), None, None))
    assert parts.needs_sum_pi_squared and parts.needs_old_logprobs
    batch = agent.parse(tl.make_batch().experiences(), None, None)
    unscored = Scores(torch.zeros(batch.mask.shape), None)
    with pytest.raises(ValueError, match=r"needs_sum_pi_squared=True"):
        group_advantages(GroupAdvantage(OTB, tl.GROUP_SIZE), batch, unscored)
