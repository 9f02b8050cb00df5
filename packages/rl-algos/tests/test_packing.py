"""Padding-free training: packed sequences and token-budget micro-batches equal the padded update.

The pure functions (:mod:`rl_algos.packing`) are checked on hand-made rows; the model paths on
real tiny models: the packed forward's hidden states equal the padded ones (Qwen2 and Llama,
SDPA and eager, every LoRA role), and one ``learn()`` with ``use_sequence_packing=True`` (and
token-budget or row micro-batches) leaves the same loss and the same gradient on every
trainable parameter as the plain padded ``learn()``, for each agent, with LoRA and full
fine-tuning. Both runs are float32 and differ only in how the rows are laid out, so the
tolerance is float32 rounding (``rl_testing.tolerance`` with the tiny model's sizes,
``algos_testlib.assert_loss_close`` / ``assert_grads_close``).

The ragged batch: lengths 1..L (a row of one token, a full-width row), and rows without any
action token (the "empty" rows: a prompt that got no completion).
"""

from __future__ import annotations

from typing import Any

import algos_testlib as tl
import pytest
import torch
from rl_algos import packing, varlen_attention
from rl_algos.microbatch import RowSplit, split_rows, token_budget_groups
from rl_algos.packing import pack_rows, unpack
from rl_testing.tolerance import assert_close


def assert_hidden_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Packed and padded last hidden states: 2 decoder layers and the final norm, the longest
    sum the MLP's 128 (the packed layout sums the same terms in another order)."""
    assert_close(actual, expected, reduction=tl.REDUCTION, stages=tl.LAYERS + 1, msg="hidden")


# (prompt, completion) per row, L = 12. Row 0: one token, no action; row 4: a prompt and no
# completion; row 2: the full width.
RAGGED: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((tl.BOS_ID,), ()),
    ((tl.BOS_ID, 10, 11), (30, tl.EOS_ID)),
    ((tl.BOS_ID, 10), (31, 32, 33, 34, 35, 36, 37, 38, 39, tl.EOS_ID)),
    ((tl.BOS_ID, 20, 21, 22), (40,)),
    ((tl.BOS_ID, 20), ()),
    ((tl.BOS_ID, 20, 21), (41, 42, 43, 44, 45)),
)
REWARDS = (1.0, 0.25, -0.5, 2.0, 0.0, 0.75)


def ragged_batch(rows: Any = RAGGED, width: int = tl.SEQ_LEN) -> tl.Batch:
    """Right-padded rows ``prompt + completion``; the mask marks the completion tokens."""
    ids = torch.full((len(rows), width), tl.PAD_ID, dtype=torch.long)
    masks = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    lengths = []
    for n, (prompt, completion) in enumerate(rows):
        seq = [*prompt, *completion]
        ids[n, : len(seq)] = torch.tensor(seq)
        masks[n, len(prompt) - 1 : len(seq) - 1] = True
        lengths.append(len(seq))
    return tl.Batch(ids, masks, torch.tensor(REWARDS[: len(rows)]), tuple(lengths))


# --------------------------------------------------------------------------- pure functions


def test_pack_and_unpack_round_trip() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [9, 10, 11, 12]])
    attn = (ids != 0).long()
    rows = pack_rows(ids, attn)
    assert rows.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert rows.lengths.tolist() == [3, 1, 4] and rows.cu_seqlens.tolist() == [0, 3, 4, 8]
    assert rows.max_length == 4 and rows.num_tokens == 8
    values = rows.input_ids[0].float().requires_grad_()
    back = unpack(values[:, None], rows)  # [M, L, 1]
    # bit-exact: a gather of small integers (exact in float32); zeros on the padding
    assert torch.equal(back[..., 0], ids.float())
    back.sum().backward()
    assert values.grad is not None and bool((values.grad == 1).all())


def test_pack_keeps_left_padded_rows_and_rejects_holes_and_bad_shapes() -> None:
    """A left-padded row packs its contiguous span; each token keeps its column as position
    (the padded forward's default positions 0..L-1). Holes and mismatched shapes raise."""
    ids = torch.tensor([[0, 5, 6], [7, 8, 0], [0, 9, 0]])
    rows = pack_rows(ids, (ids != 0).long())
    assert rows.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert rows.position_ids.tolist() == [[1, 2, 0, 1, 1]]
    assert rows.lengths.tolist() == [2, 2, 1] and rows.cu_seqlens.tolist() == [0, 2, 4, 5]
    assert torch.equal(unpack(rows.input_ids[0], rows), ids)  # bit-exact: integer token ids
    holes = torch.tensor([[5, 0, 6]])
    with pytest.raises(ValueError, match="one contiguous span"):
        pack_rows(holes, (holes != 0).long())
    with pytest.raises(ValueError, match="same"):
        pack_rows(ids, torch.ones(3, 2, dtype=torch.long))


def test_packing_blocker_names_what_stops_packing() -> None:
    from rl_testing.models import tiny_causal_lm

    model, _ = tiny_causal_lm("qwen2", seed=0, attn_implementation="sdpa")  # type: ignore[call-overload]
    spans = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    assert packing.packing_blocker(model, spans) is None
    assert "holes" in str(packing.packing_blocker(model, torch.tensor([[1, 0, 1, 0]])))
    assert "empty" in str(packing.packing_blocker(model, torch.zeros(2, 4, dtype=torch.long)))
    model.config.sliding_window, model.config.use_sliding_window = 2, True
    assert "sliding window (2)" in str(packing.packing_blocker(model, spans))
    model.config.sliding_window = 3
    assert packing.packing_blocker(model, spans) is None  # rows within the window
    model.config._attn_implementation = "flex_attention"
    # row 1 starts (column 1) where row 0 ends: flex would read one sequence
    assert "flex_attention" in str(packing.packing_blocker(model, torch.tensor([[1, 0], [0, 1]])))
    model.config._attn_implementation = "my_kernel"
    assert "'my_kernel' cannot confine" in str(packing.packing_blocker(model, spans))


def test_token_budget_groups_fit_balance_and_errors() -> None:
    lengths = [9, 1, 4, 7, 3, 3, 8, 2]
    groups = token_budget_groups(lengths, budget=12)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 12 for g in groups)
    assert len(groups) == 4  # 37 tokens need at least 4 micro-batches of 12
    # a row limit still holds, and more groups can be asked for (every process in step)
    assert all(len(g) <= 2 for g in token_budget_groups(lengths, 12, max_rows=2))
    assert len(token_budget_groups(lengths, 100, groups=3)) == 3
    with pytest.raises(ValueError, match=r"a row has 9 tokens, more than micro_batch_tokens=8"):
        token_budget_groups(lengths, budget=8)


def test_split_rows_by_rows_and_by_tokens() -> None:
    attn = ragged_batch().ids.ne(tl.PAD_ID).long()
    attn[:, 0] = 1
    rows = torch.tensor([0, 2, 3, 5])
    assert [r.tolist() for r in split_rows(rows, attn, RowSplit(3))] == [[0, 2, 3], [5]]
    by_tokens = split_rows(rows, attn, RowSplit(micro_batch_tokens=14))
    assert sorted(int(r) for g in by_tokens for r in g) == [0, 2, 3, 5]
    assert all(int(attn[g].sum()) <= 14 for g in by_tokens)


def test_config_rejects_a_bad_budget() -> None:
    from rl_algos import GRPO

    with pytest.raises(ValueError, match="`micro_batch_tokens` must be None or an int >= 1"):
        GRPO(actor_network=tl.tiny_model(0), **tl.agent_kwargs(micro_batch_tokens=0))


def test_learn_raises_for_a_row_over_the_budget() -> None:
    agent = tl.make_agent("GRPO", micro_batch_tokens=8, use_sequence_packing=True)
    with pytest.raises(ValueError, match=r"12 tokens, more than micro_batch_tokens=8"):
        agent.learn(ragged_batch().experiences())


# --------------------------------------------------------------------------- forwards


@pytest.mark.parametrize(
    ("arch", "attn"), [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa")]
)
def test_packed_hidden_states_equal_padded(arch: str, attn: str) -> None:
    from rl_adapters import PolicyModel
    from rl_testing.models import tiny_causal_lm

    model, _ = tiny_causal_lm(arch, seed=0, attn_implementation=attn)  # type: ignore[call-overload]
    assert varlen_attention.attention_implementation(model) == attn
    policy = PolicyModel(model, lora_config=tl.lora_config(), critic=True, seed=3)
    tl.perturb_adapter(policy, "actor", seed=1)
    tl.perturb_adapter(policy, "critic", seed=2)
    # ragged, and runs of equal lengths (batched in one SDPA call each)
    runs = tuple(((tl.BOS_ID, 9 + n), (30 + n,) * (2 if n < 3 else 4)) for n in range(6))
    for b, role in [
        (ragged_batch(), "actor"),
        (ragged_batch(runs), "actor"),
        (ragged_batch(runs[:3]), "actor"),  # no padding once trimmed: the unpadded path
        (ragged_batch(), "reference"),
        (ragged_batch(), "critic"),
    ]:
        _check_packed_hidden(policy, b, role)
    _check_left_padded_hidden(policy)
    assert varlen_attention.attention_implementation(model) == attn  # restored after the forward


def _check_left_padded_hidden(policy: Any) -> None:
    """Left-padded rows (each row's span shifted right): packed equals padded at every real
    token, positions included (the padded forward's default 0..L-1)."""
    b = ragged_batch()
    att = tl.attention_from(b.ids, b.masks)
    shift = (att.shape[1] - att.sum(1)).tolist()
    ids, left = torch.full_like(b.ids, tl.PAD_ID), torch.zeros_like(att)
    for n, s in enumerate(shift):
        ids[n] = b.ids[n].roll(s)
        left[n] = att[n].roll(s)
    assert bool(left[:, 0].eq(0).any()), "no row is left-padded"
    with torch.no_grad():
        padded = policy.hidden_states(ids, left, "actor")
        packed = packing.packed_hidden_states(policy, ids, left, "actor")
    real = left.bool()
    assert_hidden_close(packed[real], padded[real])
    assert bool((packed[~real] == 0).all())


def _check_packed_hidden(policy: Any, b: tl.Batch, role: str) -> None:
    att = tl.attention_from(b.ids, b.masks)
    real = att.bool()
    rows = pack_rows(b.ids, att)
    with torch.no_grad():
        padded = policy.hidden_states(b.ids, att, role)
        packed = packing.packed_hidden_states(policy, b.ids, att, role)  # varlen SDPA
        # transformers' own packed path: restarting position_ids, a block-diagonal mask
        masked = policy.hidden_states(rows.input_ids, None, role, position_ids=rows.position_ids)
    assert_hidden_close(packed[real], padded[real])
    assert_hidden_close(unpack(masked, rows)[real], padded[real])
    assert bool((packed[~real] == 0).all())


def test_unsupported_attention_implementation_is_refused() -> None:
    agent = tl.make_agent("GRPO", use_sequence_packing=True)
    agent.policy.causal_lm.config._attn_implementation = "my_kernel"
    with pytest.raises(ValueError, match=r"'my_kernel'.*use_sequence_packing=False"):
        agent.learn(ragged_batch().experiences())


def test_packing_is_the_default_and_equals_padded() -> None:
    """``use_sequence_packing`` defaults to None ("auto"): every forward of ``learn()`` runs
    packed (the report counts them) and the update equals the explicit padded one."""
    from rl_algos import AgentConfig

    assert AgentConfig().use_sequence_packing is None
    assert AgentConfig(use_sequence_packing="auto").use_sequence_packing is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`use_sequence_packing` must be None or 'auto'"):
        AgentConfig(use_sequence_packing="yes")  # type: ignore[arg-type]
    batch = ragged_batch()
    auto = _agent("GRPO", {"micro_batch_tokens": 14, "use_sequence_packing": None})
    padded = _agent("GRPO", {"micro_batch_tokens": 14})
    m_auto, m_pad = auto.learn(batch.experiences()), padded.learn(batch.experiences())
    report = auto.packing_report
    assert report.packed_forwards >= 2 and report.padded_forwards == 0 and report.reason is None
    assert padded.packing_report.packed_forwards == 0  # False: never consulted
    tl.assert_loss_close(m_auto["loss"], m_pad["loss"])
    names = _trainable(padded)
    tl.assert_grads_close(tl.agent_grads(auto.policy, names), tl.agent_grads(padded.policy, names))


def test_default_runs_padded_with_one_warning_where_packing_cannot() -> None:
    """An attention implementation that cannot confine attention: the default trains padded
    (the same update), warns once, and says why on ``agent.packing_report``."""
    import warnings

    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    # a custom kernel (SDPA under another name) that rl_algos cannot know to be packable
    AttentionInterface.register("my_kernel", sdpa_attention_forward)
    AttentionMaskInterface.register("my_kernel", sdpa_mask)
    batch = ragged_batch()
    auto = _agent("GRPO", {"use_sequence_packing": None})
    auto.policy.causal_lm.config._attn_implementation = "my_kernel"
    padded = _agent("GRPO", {})
    with pytest.warns(RuntimeWarning, match=r"running padded, .*'my_kernel' cannot confine"):
        m_auto = auto.learn(batch.experiences())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # once: the second learn() is silent
        auto.learn(batch.experiences())
    report = auto.packing_report
    assert report.packed_forwards == 0 and report.padded_forwards >= 2
    assert report.reason is not None and "'my_kernel'" in report.reason
    auto.policy.causal_lm.config._attn_implementation = "sdpa"
    tl.assert_loss_close(m_auto["loss"], padded.learn(batch.experiences())["loss"])


# --------------------------------------------------------------------------- learn(): packed == padded

PACKED_CASES = [
    # (agent class, agent options for both runs, packed-run options)
    pytest.param("GRPO", {}, {}, id="grpo"),
    pytest.param("GRPO", {}, {"micro_batch_size_per_gpu": 2}, id="grpo-rows2"),
    pytest.param("GRPO", {}, {"micro_batch_tokens": 14}, id="grpo-tokens14"),
    # one row per forward: every micro-batch takes the unpadded path (no padding to pack)
    pytest.param("GRPO", {}, {"micro_batch_size_per_gpu": 1}, id="grpo-rows1"),
    pytest.param("GRPO", {"use_liger_loss": True}, {"micro_batch_tokens": 20}, id="grpo-fused"),
    pytest.param(
        "GRPO", {"update_epochs": 2, "lr": 0.0}, {"micro_batch_tokens": 16}, id="grpo-scored-old"
    ),
    pytest.param("GRPO", {"full_finetune": True}, {"micro_batch_tokens": 14}, id="grpo-full"),
    pytest.param("GSPO", {}, {"micro_batch_tokens": 14}, id="gspo-tokens14"),
    pytest.param("CISPO", {}, {"micro_batch_size_per_gpu": 4}, id="cispo-rows4"),
    # the GRPO presets (rl_algos.presets): GRPO with other defaults
    pytest.param("dr_grpo", {}, {"micro_batch_tokens": 14}, id="dr_grpo-tokens14"),
    pytest.param("dapo", {}, {"micro_batch_tokens": 14}, id="dapo-tokens14"),
    pytest.param("rloo", {}, {}, id="rloo"),
    pytest.param("reinforce_pp", {}, {"micro_batch_size_per_gpu": 2}, id="reinforce_pp-rows2"),
    pytest.param("LLMREINFORCE", {}, {"micro_batch_tokens": 14}, id="reinforce"),
    pytest.param("LLMPPO", {}, {}, id="ppo-critic-adapter"),
    pytest.param("LLMPPO", {}, {"micro_batch_tokens": 13}, id="ppo-critic-adapter-tokens"),
    pytest.param(
        "LLMPPO",
        {"critic_mode": "shared", "full_finetune": True},
        {"micro_batch_size_per_gpu": 4},
        id="ppo-shared-full",
    ),
]


def _agent(algo: str, options: dict[str, Any]) -> Any:
    """The agent; padded (``use_sequence_packing=False``) unless ``options`` say otherwise."""
    kw = {"use_sequence_packing": False, **options}
    if algo.islower():  # a preset: GRPO with the preset's defaults under the options
        from rl_algos.presets import get_preset

        kw, algo = get_preset(algo).resolve({"group_size": tl.GROUP_SIZE, **kw}), "GRPO"
    if kw.get("full_finetune"):
        kw["lora_config"] = None
        return tl.make_agent(algo, perturb_seed=None, **kw)
    return tl.make_agent(algo, **kw)


def _trainable(agent: Any) -> list[str]:
    return tl.names_of(agent.policy, agent.learner.trainable())


@pytest.mark.parametrize(("algo", "common", "packed_options"), PACKED_CASES)
def test_packed_learn_equals_padded(
    algo: str, common: dict[str, Any], packed_options: dict[str, Any]
) -> None:
    batch = ragged_batch()
    padded = _agent(algo, common)
    packed = _agent(algo, {**common, **packed_options, "use_sequence_packing": True})
    m_pad, m_pack = padded.learn(batch.experiences()), packed.learn(batch.experiences())
    tl.assert_loss_close(m_pack["loss"], m_pad["loss"])
    names = _trainable(padded)
    assert names == _trainable(packed)
    g_pad, g_pack = tl.agent_grads(padded.policy, names), tl.agent_grads(packed.policy, names)
    assert max(float(g.abs().max()) for g in g_pad.values()) > 1e-4, "degenerate test case"
    tl.assert_grads_close(g_pack, g_pad)


@pytest.mark.parametrize(
    ("full", "packed_options"),
    [(False, {}), (False, {"micro_batch_tokens": 13}), (True, {"micro_batch_size_per_gpu": 4})],
    ids=["lora", "lora-tokens13", "full-rows4"],
)
def test_packed_ilql_learn_equals_padded(full: bool, packed_options: dict[str, Any]) -> None:
    batch = ragged_batch(tuple(r for r in RAGGED if r[1]))  # ILQL needs an action per row
    rewards = tl.token_rewards(batch)
    padded = tl.make_ilql(full, use_sequence_packing=False)
    packed = tl.make_ilql(full, use_sequence_packing=True, **packed_options)
    m_pad = padded.learn((batch.ids.clone(), batch.masks.clone(), rewards.clone()))
    m_pack = packed.learn((batch.ids.clone(), batch.masks.clone(), rewards.clone()))
    tl.assert_loss_close(m_pack["loss"], m_pad["loss"])
    pad_params = dict(padded.policy.named_parameters()) | {
        f"heads.{n}": p for n, p in padded.heads.named_parameters()
    }
    pack_params = dict(packed.policy.named_parameters()) | {
        f"heads.{n}": p for n, p in packed.heads.named_parameters()
    }
    names = [n for n, p in pad_params.items() if p.grad is not None]
    assert names == [n for n, p in pack_params.items() if p.grad is not None]
    tl.assert_grads_close(
        {n: pack_params[n].grad for n in names}, {n: pad_params[n].grad for n in names}
    )


# --------------------------------------------------------------------------- multi-turn batches

#: Agents on the multi-turn batch (per-turn rewards and ``turn_ids``): turn-level and
#: trajectory-level ratios, per-turn advantages, REINFORCE's and PPO's turn returns.
MULTI_TURN_BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo-turn-ratio": ("GRPO", {"importance_sampling_level": "turn"}),
    # Dr. GRPO's constant normaliser without max_length_norm: the width of the turn-level loss
    "grpo-turn-ratio-sum-norm": (
        "GRPO",
        {"importance_sampling_level": "turn", "loss_aggregation": "seq_mean_token_sum_norm"},
    ),
    "grpo-turn-advantages": ("GRPO", {"advantage_granularity": "turn"}),
    "grpo-trajectory-ratio": ("GRPO", {"importance_sampling_level": "trajectory"}),
    "reinforce": ("LLMREINFORCE", {}),
    "reinforce-turn-ratio": ("LLMREINFORCE", {"importance_sampling_level": "turn"}),
    "ppo-critic-adapter": ("LLMPPO", {}),
    "ppo-shared-head": ("LLMPPO", {"critic_mode": "shared"}),
}
#: Neutral options (and combinations of them) on the multi-turn bases; the base runs padded.
MULTI_TURN_OPTIONS: dict[str, dict[str, Any]] = {
    "rows1": {"micro_batch_size_per_gpu": 1},  # a micro-batch of row 2 holds one turn
    "packed-tokens14": {"use_sequence_packing": None, "micro_batch_tokens": 14},
    "packed-shared-checkpointing": {"use_sequence_packing": None, "gradient_checkpointing": True},
    "fused-checkpointing-tokens14": {
        "use_sequence_packing": None,
        "use_liger_loss": True,
        "gradient_checkpointing": True,
        "micro_batch_tokens": 14,
    },
    "offload-checkpointing-rows2": {
        "gradient_checkpointing": True,
        "activation_offload": True,
        "micro_batch_size_per_gpu": 2,
    },
    "lean-off-checkpointing": {"lean_forwards": False, "gradient_checkpointing": True},
}


def _multi_turn_update(agent: Any) -> tuple[float, dict[str, torch.Tensor]]:
    ids, masks, rewards, turn_ids = tl.multi_turn_batch()
    metrics = agent.learn((ids, masks, rewards), turn_ids=turn_ids)
    return metrics["loss"], tl.agent_grads(agent.policy, _trainable(agent))


@pytest.fixture(scope="module")
def multi_turn_plain() -> dict[str, tuple[float, dict[str, torch.Tensor]]]:
    """Each multi-turn base's own update (padded, whole batch), computed once."""
    return {}


@pytest.mark.parametrize("option", list(MULTI_TURN_OPTIONS))
@pytest.mark.parametrize("base", list(MULTI_TURN_BASES))
def test_multi_turn_learn_equals_plain(
    base: str, option: str, multi_turn_plain: dict[str, tuple[float, dict[str, torch.Tensor]]]
) -> None:
    """Micro-batches, packing, shared prompts, checkpointing, the fused loss, offload and
    lean forwards give a multi-turn batch's plain update; the fused loss with a turn or
    trajectory ratio is refused when the agent is built, naming both options."""
    algo, options = MULTI_TURN_BASES[base]
    extra = MULTI_TURN_OPTIONS[option]
    level = options.get("importance_sampling_level", "token")
    if extra.get("use_liger_loss") and level != "token":
        with pytest.raises(ValueError, match=r"use_liger_loss=True.*importance_sampling_level"):
            _agent(algo, {**options, **extra})
        return
    if base not in multi_turn_plain:
        multi_turn_plain[base] = _multi_turn_update(_agent(algo, options))
    loss, grads = multi_turn_plain[base]
    assert max(float(g.abs().max()) for g in grads.values()) > 1e-4, "degenerate test case"
    got_loss, got_grads = _multi_turn_update(_agent(algo, {**options, **extra}))
    tl.assert_loss_close(got_loss, loss)
    tl.assert_grads_close(got_grads, grads)


# --------------------------------------------------------------------------- options combined

#: Rewards of the ragged batch with group 0 all equal: DAPO's dynamic sampling filters it out.
FILTERED_REWARDS = (1.0, 1.0, 1.0, 2.0, 0.0, 0.75)
_DAPO = {"filter_zero_adv": True, "loss_aggregation": "token_mean", "clip_coef_high": 0.28}
_CKPT = {"gradient_checkpointing": True}
_AUTO = {"use_sequence_packing": None}

COMBINED_CASES = [
    # (agent, options of both runs, the combined options, the rewards)
    pytest.param("GRPO", {}, {**_AUTO, **_CKPT, "lean_forwards": False}, REWARDS,
                 id="grpo-lora-lean-off-checkpointing"),
    pytest.param("GRPO", {"full_finetune": True}, {**_AUTO, **_CKPT, "lean_forwards": False},
                 REWARDS, id="grpo-full-lean-off-checkpointing"),
    pytest.param("GRPO", {}, {**_AUTO, **_CKPT, "share_prompt_prefix": True,
                              "micro_batch_tokens": 20}, REWARDS,
                 id="grpo-packed-shared-checkpointing-tokens"),
    pytest.param("GRPO", {}, {**_AUTO, **_CKPT, "activation_offload": True,
                              "use_liger_loss": True, "micro_batch_size_per_gpu": 2}, REWARDS,
                 id="grpo-fused-offload-checkpointing-rows"),
    pytest.param("GRPO", _DAPO, {"micro_batch_size_per_gpu": 1}, FILTERED_REWARDS,
                 id="dapo-filtered-rows1"),
    pytest.param("GRPO", _DAPO, {**_AUTO, "micro_batch_size_per_gpu": 3, "use_liger_loss": True},
                 FILTERED_REWARDS, id="dapo-filtered-fused-rows3"),
    pytest.param("GRPO", _DAPO, {**_AUTO, **_CKPT, "micro_batch_tokens": 14}, FILTERED_REWARDS,
                 id="dapo-filtered-packed-checkpointing-tokens"),
    pytest.param("GRPO", {**_DAPO, "loss_aggregation": "seq_mean_token_mean"},
                 {**_AUTO, "micro_batch_size_per_gpu": 3}, FILTERED_REWARDS,
                 id="dapo-filtered-sequence-mean-rows3"),
    pytest.param("GRPO", {"loss_type": "gspo"}, {**_AUTO, **_CKPT, "micro_batch_size_per_gpu": 1},
                 REWARDS, id="gspo-packed-checkpointing-rows1"),
    pytest.param("LLMPPO", {}, {**_AUTO, **_CKPT, "lean_forwards": False,
                                "micro_batch_tokens": 14}, REWARDS,
                 id="ppo-critic-lean-off-checkpointing-tokens"),
    pytest.param("LLMPPO", {}, {"use_sequence_packing": True, **_CKPT, "activation_offload": True,
                                "micro_batch_size_per_gpu": 2}, REWARDS,
                 id="ppo-critic-packed-offload-checkpointing-rows"),
    pytest.param("LLMPPO", {"critic_mode": "shared", "full_finetune": True},
                 {**_AUTO, **_CKPT, "use_liger_loss": True, "lean_forwards": False}, REWARDS,
                 id="ppo-shared-full-fused-lean-off-checkpointing"),
    pytest.param("LLMREINFORCE", {}, {**_AUTO, **_CKPT, "use_liger_loss": True,
                                      "micro_batch_tokens": 14}, REWARDS,
                 id="reinforce-fused-checkpointing-tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("algo", "common", "combined", "rewards"), COMBINED_CASES)
def test_combined_options_give_the_plain_update(
    algo: str, common: dict[str, Any], combined: dict[str, Any], rewards: tuple[float, ...]
) -> None:
    """Pairs and triples of neutral options (the integration matrix pairs each with
    checkpointing) give the padded whole-batch update, also with DAPO filtering a group out."""
    batch = ragged_batch()
    ids, masks, _ = batch.experiences()
    plain = _agent(algo, common)
    options = _agent(algo, {**common, **combined})
    m_plain = plain.learn((ids.clone(), masks.clone(), torch.tensor(rewards)))
    m_options = options.learn((ids.clone(), masks.clone(), torch.tensor(rewards)))
    if "filter_zero_adv" in common:  # group 0 left the loss in both runs
        assert m_plain["kept_groups"] == m_options["kept_groups"] == 1.0
    tl.assert_loss_close(m_options["loss"], m_plain["loss"])
    names = _trainable(plain)
    assert names == _trainable(options)
    g_plain = tl.agent_grads(plain.policy, names)
    assert max(float(g.abs().max()) for g in g_plain.values()) > 1e-4, "degenerate test case"
    tl.assert_grads_close(tl.agent_grads(options.policy, names), g_plain)


def test_packed_learn_equals_padded_on_runs_of_equal_lengths() -> None:
    """Micro-batches whose rows all have one length skip packing (the same forward without its
    padding columns); mixed ones pack: both equal the padded update."""
    runs = tuple(((tl.BOS_ID, 9 + n), (30 + n,) * (2 if n < 3 else 4)) for n in range(6))
    batch = ragged_batch(runs)
    padded = _agent("GRPO", {})
    for options in ({"micro_batch_size_per_gpu": 3}, {"micro_batch_size_per_gpu": 4}):
        packed = _agent("GRPO", {**options, "use_sequence_packing": True})
        m_pad, m_pack = padded.learn(batch.experiences()), packed.learn(batch.experiences())
        tl.assert_loss_close(m_pack["loss"], m_pad["loss"])
        names = _trainable(padded)
        g_pad = tl.agent_grads(padded.policy, names)
        assert max(float(g.abs().max()) for g in g_pad.values()) > 1e-4, "degenerate test case"
        tl.assert_grads_close(tl.agent_grads(packed.policy, names), g_pad)
        padded = _agent("GRPO", {})


@pytest.mark.parametrize(
    ("algo", "options"),
    [
        pytest.param("GRPO", {"use_sequence_packing": None}, id="grpo-packed-default"),
        pytest.param("LLMPPO", {"use_sequence_packing": False}, id="ppo-critic-adapter-padded"),
    ],
)
def test_checkpointed_learn_equals_plain(algo: str, options: dict[str, Any]) -> None:
    """``gradient_checkpointing=True`` recomputes each layer in the backward with the forward's
    attention implementation (packed: the varlen switch) and role (the critic adapter), so the
    update equals the one without checkpointing."""
    batch = ragged_batch()
    plain = _agent(algo, options)
    checkpointed = _agent(algo, {**options, "gradient_checkpointing": True})
    m_plain, m_ckpt = plain.learn(batch.experiences()), checkpointed.learn(batch.experiences())
    tl.assert_loss_close(m_ckpt["loss"], m_plain["loss"])
    names = _trainable(plain)
    g_plain = tl.agent_grads(plain.policy, names)
    g_ckpt = tl.agent_grads(checkpointed.policy, names)
    for name in names:  # the critic's lora_B starts at zero: its lora_A gets exactly nothing
        if ".critic." in name and ".lora_A." in name:
            assert not bool(g_ckpt[name].any()), name
    tl.assert_grads_close(g_ckpt, g_plain)


def test_row_runs_reads_each_boundaries_tensor_once() -> None:
    """Every layer of a packed forward gets the same ``cu_seq_lens``: the runs are read to the
    host for the first layer only, and again for another tensor or after an in-place change."""
    bounds = torch.tensor([0, 3, 6, 8, 12])
    first = varlen_attention.row_runs(bounds)
    assert first == [(0, 2, 3), (6, 1, 2), (8, 1, 4)]
    assert varlen_attention.row_runs(bounds) is first  # the cached list, no second read
    other = torch.tensor([0, 3, 6, 8, 12])
    assert varlen_attention.row_runs(other) == first
    assert varlen_attention.row_runs(other) is not first
    other[2] = 5  # in place: a new version of the same tensor
    assert varlen_attention.row_runs(other) == [(0, 1, 3), (3, 1, 2), (5, 1, 3), (8, 1, 4)]


def test_row_runs_of_an_inference_tensor() -> None:
    """A packed forward in ``torch.inference_mode`` (the scoring forwards) makes inference
    tensors, which have no version counter: each is read once all the same."""
    with torch.inference_mode():
        bounds = torch.tensor([0, 2, 4, 9])
        first = varlen_attention.row_runs(bounds)
        assert first == [(0, 2, 2), (4, 1, 5)]
        assert varlen_attention.row_runs(bounds) is first
    assert varlen_attention.row_runs(bounds) is first  # also outside the mode


def test_attention_arguments_sdpa_cannot_apply_are_refused() -> None:
    """A logit soft-cap (Gemma 2's ``attn_logit_softcapping``) is a reason not to pack under
    SDPA/eager (the default then runs padded); the packed attention functions refuse it and
    attention sinks, naming the argument, rather than ignore them."""
    from rl_algos import shared_prefix

    agent = tl.make_agent("GRPO")
    batch = ragged_batch()
    att = tl.attention_from(batch.ids, batch.masks)
    model = agent.policy.causal_lm
    assert packing.packing_blocker(model, att) is None
    model.config.attn_logit_softcapping = 30.0
    reason = packing.packing_blocker(model, att)
    assert reason is not None and "attn_logit_softcapping" in reason
    q = torch.zeros(1, 2, 4, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    for key in ("softcap", "s_aux"):
        with pytest.raises(ValueError, match=rf"rl_varlen_sdpa .*`{key}`: pass use_sequence"):
            varlen_attention.varlen_sdpa_attention(
                torch.nn.Module(), q, q, q, None, cu_seq_lens_q=cu, **{key: 1.0}
            )
        with pytest.raises(ValueError, match=rf"rl_shared_prefix_sdpa .*`{key}`: pass share"):
            shared_prefix.shared_prefix_attention(torch.nn.Module(), q, q, q, None, **{key: 1.0})
