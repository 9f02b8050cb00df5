"""One ``learn()`` call of each agent against a float64 re-derivation of the spec's math.

Each test builds an agent on a tiny model, perturbs the actor adapter (so the actor differs from
the reference and the KL term is non-trivial), takes a float64 deep copy of ``agent.policy``
BEFORE learning, runs one ``learn()`` (one epoch, one mini-batch, no gradient clipping) and
compares ``metrics["loss"]`` and the ``.grad`` left on the trainable parameters with the loss and
gradients of the reference (``algos_testlib.reference_loss_*``) at the pre-update weights.

Tolerances. The agent runs a float32 forward and computes log-probs through rl-kernels' fused
path; the reference runs a float64 forward through full logits. They agree to float32 rounding
through the tiny model (``algos_testlib.assert_loss_close`` / ``assert_grads_close``, from
``rl_testing.tolerance``), while any formula difference (aggregation, KL direction, clip bounds,
advantage scale, temperature) is orders of magnitude larger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import algos_testlib as tl
import pytest
import rl_advantages
import rl_losses
import torch


def _learn_and_compare(
    agent: Any,
    reference: Callable[[Any], tl.RefLoss],
    *,
    with_critic: bool = False,
    batch: tl.Batch | None = None,
) -> tuple[dict[str, float], tl.RefLoss]:
    """Snapshot (float64) -> learn -> compare loss and gradients with the reference."""
    b = tl.make_batch() if batch is None else batch
    names = tl.trainable_names(agent, with_critic=with_critic)
    twin = tl.float64_copy(agent.policy)  # the pre-update weights
    metrics = agent.learn(b.experiences())
    ref, ref_grads = tl.reference_grads(twin, reference, names)
    assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-3, "degenerate test case"
    tl.assert_loss_close(metrics["loss"], float(ref.loss.detach()))
    tl.assert_grads_close(tl.agent_grads(agent.policy, names), ref_grads)
    return metrics, ref


# --------------------------------------------------------------------------- GRPO family

GRPO_CASES = [
    # (class, loss_type passed to the class (None: not passed), clip_coef, extra kwargs)
    pytest.param("GRPO", "grpo", 0.2, {}, id="grpo-clip0.2"),
    pytest.param("GRPO", "grpo", tl.UNSET, {}, id="grpo-default-clip"),
    # Absolute ratio bounds. NB: with update_epochs=1 the ratio is 1 at the only step, inside
    # any valid bounds, so this checks that a tuple is accepted and unclipped, not its bounds.
    pytest.param("GRPO", "grpo", (0.8, 1.28), {}, id="grpo-tuple-clip"),
    pytest.param("GRPO", "grpo", 0.2, {"loss_aggregation": "token_mean"}, id="grpo-token-mean"),
    pytest.param("GRPO", "grpo", 0.2, {"adv_norm": "mean_only"}, id="grpo-mean-only"),
    pytest.param("GRPO", "gspo", tl.UNSET, {}, id="gspo-default-clip"),
    pytest.param("GRPO", "gspo", 0.2, {}, id="gspo-clip0.2"),
    pytest.param("GRPO", "cispo", tl.UNSET, {}, id="cispo"),
    pytest.param("GSPO", None, tl.UNSET, {}, id="GSPO-class"),
    pytest.param("CISPO", None, tl.UNSET, {}, id="CISPO-class"),
]


@pytest.mark.parametrize(("algo", "loss_type", "clip_coef", "extra"), GRPO_CASES)
def test_grpo_family_loss_and_grads_match_reference(
    algo: str, loss_type: str | None, clip_coef: Any, extra: dict[str, Any]
) -> None:
    kw = dict(extra)
    if loss_type is not None:
        kw["loss_type"] = loss_type
    if clip_coef is not tl.UNSET:
        kw["clip_coef"] = clip_coef
    agent = tl.make_agent(algo, **kw)
    effective_type = loss_type or {"GSPO": "gspo", "CISPO": "cispo"}[algo]

    def reference(policy: Any) -> tl.RefLoss:
        return tl.reference_loss_grpo(
            policy,
            tl.make_batch(),
            group_size=tl.GROUP_SIZE,
            beta=tl.BETA,
            temperature=tl.TEMPERATURE,
            loss_type=effective_type,
            clip_coef=clip_coef,
            # CISPO's paper normalises by the batch's token count; GRPO's by sequence
            aggregation=extra.get(
                "loss_aggregation",
                "token_mean" if effective_type == "cispo" else "seq_mean_token_mean",
            ),
            adv_norm=extra.get("adv_norm", "mean_std"),
        )

    _learn_and_compare(agent, reference)


def test_grpo_metrics_report_the_step() -> None:
    agent = tl.make_agent("GRPO", loss_aggregation="token_mean")

    def reference(policy: Any) -> tl.RefLoss:
        return tl.reference_loss_grpo(
            policy,
            tl.make_batch(),
            group_size=tl.GROUP_SIZE,
            beta=tl.BETA,
            temperature=tl.TEMPERATURE,
            aggregation="token_mean",
        )

    metrics, ref = _learn_and_compare(agent, reference)
    expected = {"loss", "pg_loss", "kl", "clip_fraction", "approx_kl", "entropy", "grad_norm"}
    expected.add("mean_reward")
    assert expected <= set(metrics), sorted(metrics)
    assert all(isinstance(v, float) for v in metrics.values()), metrics
    tl.assert_loss_close(metrics["pg_loss"], ref.parts["pg_loss"], msg="pg_loss")
    assert metrics["mean_reward"] == pytest.approx(sum(tl.REWARDS) / len(tl.REWARDS))


@pytest.mark.parametrize("algo", ["GRPO", "LLMREINFORCE"])
def test_kl_is_taken_against_the_reference_adapter(algo: str) -> None:
    """ref_lp comes from the "reference" adapter, not from the bare base: perturb the reference
    too (differently from the actor), so the two would give different KL terms."""
    agent = tl.make_agent(algo)
    tl.perturb_adapter(agent.policy, "reference", seed=7)

    def reference(policy: Any) -> tl.RefLoss:
        if algo == "GRPO":
            return tl.reference_loss_grpo(
                policy,
                tl.make_batch(),
                group_size=tl.GROUP_SIZE,
                beta=tl.BETA,
                temperature=tl.TEMPERATURE,
            )
        return tl.reference_loss_reinforce(
            policy, tl.make_batch(), beta=tl.BETA, temperature=tl.TEMPERATURE, clip_coef=0.2
        )

    _learn_and_compare(agent, reference)


def test_grpo_rewards_as_b_by_g_equal_flat_rewards() -> None:
    """``rewards`` [B, G] is flattened row-major to [N]: same loss and gradients."""
    batch = tl.make_batch()
    flat = tl.make_agent("GRPO")
    grid = tl.make_agent("GRPO")
    grid.policy.load_state_dict(flat.policy.state_dict())
    names = tl.trainable_names(flat)
    m_flat = flat.learn(batch.experiences())
    ids, masks, rewards = batch.experiences()
    m_grid = grid.learn((ids, masks, rewards.reshape(tl.N_PROMPTS, tl.GROUP_SIZE)))
    tl.assert_loss_close(m_grid["loss"], m_flat["loss"])
    tl.assert_grads_close(tl.agent_grads(grid.policy, names), tl.agent_grads(flat.policy, names))


def test_grpo_list_inputs_equal_padded_tensor_inputs() -> None:
    """Per-prompt ``[G, L_b]`` tensors of different widths are right-padded and concatenated."""
    batch = tl.make_batch()
    ids_list, mask_list = tl.split_groups(batch)
    assert len({t.shape[1] for t in ids_list}) > 1, "the groups should have different widths"
    dense = tl.make_agent("GRPO")
    listed = tl.make_agent("GRPO")
    listed.policy.load_state_dict(dense.policy.state_dict())
    names = tl.trainable_names(dense)
    m_dense = dense.learn(batch.experiences())
    m_list = listed.learn((ids_list, mask_list, batch.rewards.clone()))
    tl.assert_loss_close(m_list["loss"], m_dense["loss"])
    tl.assert_grads_close(tl.agent_grads(listed.policy, names), tl.agent_grads(dense.policy, names))


def test_grpo_completion_ending_in_pad_id_counts_as_action() -> None:
    """pad == eos: an action token equal to the pad id is scored like any other action."""
    completions = list(tl.COMPLETIONS)
    completions[1] = (33, 34, tl.PAD_ID)  # the final action token is the pad id
    batch = tl.make_batch(completions=completions)
    assert bool(batch.masks[1, len(tl.PROMPTS[0]) + 1])
    agent = tl.make_agent("GRPO", loss_aggregation="token_mean")

    def reference(policy: Any) -> tl.RefLoss:
        return tl.reference_loss_grpo(
            policy,
            batch,
            group_size=tl.GROUP_SIZE,
            beta=tl.BETA,
            temperature=tl.TEMPERATURE,
            aggregation="token_mean",
        )

    _learn_and_compare(agent, reference, batch=batch)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_grpo_micro_batches_match_full_batch(aggregation: str) -> None:
    """Gradient accumulation over micro-batches of 2 rows = one full-batch step (the loss is
    normalised by the whole mini-batch's token / sequence count, not per micro-batch)."""
    full = tl.make_agent("GRPO", loss_aggregation=aggregation)
    micro = tl.make_agent("GRPO", loss_aggregation=aggregation, micro_batch_size_per_gpu=2)
    micro.policy.load_state_dict(full.policy.state_dict())

    def reference(policy: Any) -> tl.RefLoss:
        return tl.reference_loss_grpo(
            policy,
            tl.make_batch(),
            group_size=tl.GROUP_SIZE,
            beta=tl.BETA,
            temperature=tl.TEMPERATURE,
            aggregation=aggregation,
        )

    names = tl.trainable_names(full)
    m_full, _ = _learn_and_compare(full, reference)
    m_micro, _ = _learn_and_compare(micro, reference)
    tl.assert_loss_close(m_micro["loss"], m_full["loss"])
    tl.assert_grads_close(tl.agent_grads(micro.policy, names), tl.agent_grads(full.policy, names))


# --------------------------------------------------------------------------- token_mean per unit


def _unit_advantages(algo: str, batch: tl.Batch, turn_ids: torch.Tensor | None) -> torch.Tensor:
    """[N, T] float64 advantages: GRPO's group-relative ones (per turn with [N, K] rewards and
    ``turn_ids``) or REINFORCE's ReBN turn returns (gamma 1)."""
    r = batch.rewards.double()
    if turn_ids is None:
        adv = rl_advantages.group_relative(r, tl.GROUP_SIZE, scale="group")
        return adv[:, None].expand(batch.masks.shape)
    turn_mask = rl_advantages.pool_to_turns(batch.masks.double(), turn_ids, r.shape[1]).mask
    if algo == "GRPO":
        fallback = rl_advantages.group_relative(r.sum(-1), tl.GROUP_SIZE, scale="group")
        per_turn = rl_advantages.group_relative_per_turn(
            r, turn_mask, tl.GROUP_SIZE, scale="group", fallback=fallback
        )
    else:
        returns = rl_advantages.discounted_returns(r, turn_mask, 1.0)
        per_turn = rl_advantages.rebn(returns, mask=turn_mask)
    adv = rl_advantages.broadcast_to_tokens(per_turn, turn_ids)
    return torch.where(batch.masks, adv, torch.zeros_like(adv))


#: Losses whose units are turns or sequences. With ``loss_aggregation="token_mean"`` every valid
#: token weighs the same: one learn() is the rl-losses function on the whole batch with
#: ``unit_weight="tokens"`` (GSPO: ``gradient="token"``) and its default normaliser.
UNIT_LEVEL_CASES = [
    # (agent, its options, multi-turn batch, the rl-losses function, its options)
    pytest.param("LLMREINFORCE", {"importance_sampling_level": "turn"}, True,
                 "clipped_surrogate",
                 {"level": "turn", "pooling": "sum", "unit_weight": "tokens", "clip_low": 0.2},
                 id="reinforce-turn"),
    pytest.param("GRPO", {"importance_sampling_level": "turn", "loss_aggregation": "token_mean"},
                 True, "clipped_surrogate",
                 {"level": "turn", "pooling": "mean", "unit_weight": "tokens", "clip_low": 0.2,
                  "clip_high": 0.2}, id="grpo-turn"),
    pytest.param("GRPO", {"importance_sampling_level": "trajectory",
                          "loss_aggregation": "token_mean"}, False, "clipped_surrogate",
                 {"level": "trajectory", "pooling": "mean", "unit_weight": "tokens",
                  "clip_low": 0.2, "clip_high": 0.2}, id="grpo-trajectory"),
    # an explicit unit weight: each sequence once, divided by the sequence count
    pytest.param("GRPO", {"importance_sampling_level": "trajectory",
                          "loss_aggregation": "token_mean", "loss_kwargs": {"unit_weight": "unit"}},
                 False, "clipped_surrogate",
                 {"level": "trajectory", "pooling": "mean", "unit_weight": "unit",
                  "clip_low": 0.2, "clip_high": 0.2}, id="grpo-trajectory-explicit-unit"),
    # the sequence means are unchanged: each turn once, divided by the sequence count
    pytest.param("GRPO", {"importance_sampling_level": "turn"}, True, "clipped_surrogate",
                 {"level": "turn", "pooling": "mean", "clip_low": 0.2, "clip_high": 0.2},
                 id="grpo-turn-seq-mean-token-mean"),
    pytest.param("GSPO", {}, False, "gspo_loss", {"clip_low": 3e-4, "clip_high": 4e-4},
                 id="gspo-seq-mean-token-mean"),
    pytest.param("GSPO", {"loss_aggregation": "token_mean"}, False, "gspo_loss",
                 {"gradient": "token", "clip_low": 3e-4, "clip_high": 4e-4}, id="gspo-class"),
    pytest.param("GRPO", {"loss_type": "gspo", "loss_aggregation": "token_mean"}, False,
                 "gspo_loss", {"gradient": "token", "clip_low": 3e-4, "clip_high": 4e-4},
                 id="grpo-gspo"),
    # an explicit sequence gradient: one unit per sequence, divided by the sequence count
    pytest.param("GSPO", {"loss_aggregation": "token_mean",
                          "loss_kwargs": {"gradient": "sequence"}}, False, "gspo_loss",
                 {"gradient": "sequence", "clip_low": 3e-4, "clip_high": 4e-4},
                 id="gspo-explicit-sequence-gradient"),
]  # fmt: skip


@pytest.mark.parametrize("micro", [None, 1], ids=["whole", "rows1"])
@pytest.mark.parametrize(("algo", "options", "multi_turn", "loss", "loss_options"),
                         UNIT_LEVEL_CASES)  # fmt: skip
def test_unit_level_loss_matches_the_whole_batch_loss(
    algo: str,
    options: dict[str, Any],
    multi_turn: bool,
    loss: str,
    loss_options: dict[str, Any],
    micro: int | None,
) -> None:
    """``token_mean`` with turn or sequence ratios weighs every valid token the same (the loss
    of its turn or sequence counted once per token) and divides by the token count, alone or
    over 1-row micro-batches: the library's whole-batch value, not its sum over units divided
    by the token count (a scale of 1 / mean tokens per unit). The sequence means divide by the
    sequence count as before."""
    turn_ids = None
    if multi_turn:
        ids, masks, rewards, turn_ids = tl.multi_turn_batch()
        batch = tl.Batch(ids, masks, rewards)
    else:
        batch = tl.make_batch()
    agent = tl.make_agent(algo, micro_batch_size_per_gpu=micro, **options)
    names = tl.trainable_names(agent)
    twin = tl.float64_copy(agent.policy)
    adv = _unit_advantages(algo, batch, turn_ids)
    aggregation = options.get("loss_aggregation", "token_mean" if algo == "LLMREINFORCE" else
                              "seq_mean_token_mean")  # fmt: skip

    def reference(policy: Any) -> tl.RefLoss:
        lp, old_lp, ref_lp, _ = tl._lp_old_ref(policy, batch, tl.TEMPERATURE)
        m = batch.masks
        kw = dict(loss_options) if turn_ids is None else {**loss_options, "turn_ids": turn_ids}
        pg = getattr(rl_losses, loss)(lp, old_lp, adv, m, aggregation=aggregation, **kw)
        kl = rl_losses.kl_penalty(lp, ref_lp, m, kind="k3", coef=tl.BETA, aggregation=aggregation)
        return tl.RefLoss(pg.loss + kl.loss, {})

    if turn_ids is None:
        metrics = agent.learn(batch.experiences())
    else:
        metrics = agent.learn(batch.experiences(), turn_ids=turn_ids.clone())
    ref, ref_grads = tl.reference_grads(twin, reference, names)
    assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-3, "degenerate test case"
    tl.assert_loss_close(metrics["loss"], float(ref.loss.detach()))
    tl.assert_grads_close(tl.agent_grads(agent.policy, names), ref_grads)


# --------------------------------------------------------------------------- REINFORCE


@pytest.mark.parametrize("clip_coef", [None, 0.2], ids=["no-clip", "clip0.2"])
def test_reinforce_loss_and_grads_match_reference(clip_coef: float | None) -> None:
    agent = tl.make_agent("LLMREINFORCE", clip_coef=clip_coef)

    def reference(policy: Any) -> tl.RefLoss:
        return tl.reference_loss_reinforce(
            policy, tl.make_batch(), beta=tl.BETA, temperature=tl.TEMPERATURE, clip_coef=clip_coef
        )

    _learn_and_compare(agent, reference)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_reinforce_reports_a_clip_fraction_only_when_it_clips(fused: bool) -> None:
    """Plain REINFORCE (``clip_coef=None``) never clips: no ``clip_fraction`` (not a constant 0)
    and, with ``beta=0``, no KL; its ``approx_kl`` is computed (the second epoch's policy has
    moved from the old one). The clipped surrogate (``clip_coef=0.2``) reports both."""
    b = tl.make_batch()
    kw = {"update_epochs": 2, "beta": 0.0, "use_liger_loss": fused}
    plain = tl.make_agent("LLMREINFORCE", clip_coef=None, **kw).learn(b.experiences())
    assert not {"clip_fraction", "kl", "mean_kl"} & set(plain), sorted(plain)
    assert plain["approx_kl"] > 1e-6, plain
    assert "mean_loss" in plain  # two steps: their mean is reported beside the last loss
    clipped = tl.make_agent("LLMREINFORCE", clip_coef=0.2, **kw).learn(b.experiences())
    assert {"clip_fraction", "approx_kl"} <= set(clipped), sorted(clipped)


# --------------------------------------------------------------------------- PPO


@pytest.mark.parametrize("reduction", ["first", "mean"])
def test_ppo_loss_and_grads_match_reference(reduction: str) -> None:
    """Actor, critic adapter and value head gradients of ``pg + vf_coef * value + beta * kl``."""
    agent = tl.make_agent("LLMPPO", turn_value_reduction=reduction, clip_coef=0.2)

    def reference(policy: Any) -> tl.RefLoss:
        kw = {**tl.PPO_KW, "turn_value_reduction": reduction}
        return tl.reference_loss_ppo(
            policy,
            tl.make_batch(),
            beta=tl.BETA,
            temperature=tl.TEMPERATURE,
            clip_coef=0.2,
            vf_coef=kw["vf_coef"],
            gamma=kw["gamma"],
            gae_lambda=kw["gae_lambda"],
            cliprange_value=kw["cliprange_value"],
            turn_value_reduction=reduction,
        )

    metrics, ref = _learn_and_compare(agent, reference, with_critic=True)
    assert "value_loss" in metrics, sorted(metrics)
    # The spec names the metric but not whether it includes vf_coef: accept either.
    value = ref.parts["value_loss"]

    def close(v: float) -> bool:
        try:
            tl.assert_loss_close(metrics["value_loss"], v, msg="value_loss")
        except AssertionError:
            return False
        return True

    assert any(close(v) for v in (value, tl.PPO_KW["vf_coef"] * value)), (
        metrics["value_loss"],
        value,
    )
