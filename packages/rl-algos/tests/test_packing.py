"""Padding-free training: packed sequences and token-budget micro-batches equal the padded update.

The pure functions (:mod:`rl_algos.packing`) are checked on hand-made rows; the model paths on
real tiny models: the packed forward's hidden states equal the padded ones (Qwen2 and Llama,
SDPA and eager, every LoRA role), and one ``learn()`` with ``use_sequence_packing=True`` (and
token-budget or row micro-batches) leaves the same loss and the same gradient on every
trainable parameter as the plain padded ``learn()``, for each agent, with LoRA and full
fine-tuning. Both runs are float32 and differ only in how the rows are laid out, so the
tolerance is float32 rounding: 1e-5 relative.

The ragged batch: lengths 1..L (a row of one token, a full-width row), and rows without any
action token (the "empty" rows: a prompt that got no completion).
"""

from __future__ import annotations

from typing import Any

import algos_testlib as tl
import pytest
import torch
from rl_algos import packing
from rl_algos.packing import RowSplit, pack_rows, split_rows, token_budget_groups, unpack

SAME_LOSS_TOL: dict[str, float] = {"rel": 1e-5, "abs": 1e-7}
GRAD_REL = 1e-5  # of each gradient tensor's largest entry (float32 rounding is ~1e-7 of it)
HIDDEN_TOL: dict[str, float] = {"rtol": 1e-5, "atol": 1e-5}

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
    assert torch.equal(back[..., 0], ids.float())  # zeros on the padding
    back.sum().backward()
    assert values.grad is not None and bool((values.grad == 1).all())


def test_pack_rejects_left_padding_and_bad_shapes() -> None:
    ids = torch.tensor([[0, 5, 6], [7, 8, 0]])
    with pytest.raises(ValueError, match="right-padded rows"):
        pack_rows(ids, (ids != 0).long())
    with pytest.raises(ValueError, match="same"):
        pack_rows(ids, torch.ones(2, 2, dtype=torch.long))


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
    assert packing.attention_implementation(model) == attn
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
    assert packing.attention_implementation(model) == attn  # restored after the forward


def _check_packed_hidden(policy: Any, b: tl.Batch, role: str) -> None:
    att = tl.attention_from(b.ids, b.masks)
    real = att.bool()
    rows = pack_rows(b.ids, att)
    with torch.no_grad():
        padded = policy.hidden_states(b.ids, att, role)
        packed = packing.packed_hidden_states(policy, b.ids, att, role)  # varlen SDPA
        # transformers' own packed path: restarting position_ids, a block-diagonal mask
        masked = policy.hidden_states(rows.input_ids, None, role, position_ids=rows.position_ids)
    torch.testing.assert_close(packed[real], padded[real], **HIDDEN_TOL)
    torch.testing.assert_close(unpack(masked, rows)[real], padded[real], **HIDDEN_TOL)
    assert bool((packed[~real] == 0).all())


def test_unsupported_attention_implementation_is_refused() -> None:
    agent = tl.make_agent("GRPO", use_sequence_packing=True)
    agent.policy.causal_lm.config._attn_implementation = "my_kernel"
    with pytest.raises(ValueError, match=r"'my_kernel'.*use_sequence_packing=False"):
        agent.learn(ragged_batch().experiences())


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


def assert_grads_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Every gradient equal to ``GRAD_REL`` relative: elementwise, and in absolute terms to
    ``GRAD_REL`` times the tensor's largest entry (so entries near 0 need not agree to 1e-5 of
    themselves, which float32 sums in another order cannot promise)."""
    assert got.keys() == expected.keys()
    for name, g in expected.items():
        scale = float(g.abs().max())
        torch.testing.assert_close(got[name], g, rtol=GRAD_REL, atol=GRAD_REL * scale + 1e-12)


def _agent(algo: str, options: dict[str, Any]) -> Any:
    kw = dict(options)
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
    assert m_pack["loss"] == pytest.approx(m_pad["loss"], **SAME_LOSS_TOL)
    names = _trainable(padded)
    assert names == _trainable(packed)
    g_pad, g_pack = tl.agent_grads(padded.policy, names), tl.agent_grads(packed.policy, names)
    assert max(float(g.abs().max()) for g in g_pad.values()) > 1e-4, "degenerate test case"
    assert_grads_close(g_pack, g_pad)


@pytest.mark.parametrize(
    ("full", "packed_options"),
    [(False, {}), (False, {"micro_batch_tokens": 13}), (True, {"micro_batch_size_per_gpu": 4})],
    ids=["lora", "lora-tokens13", "full-rows4"],
)
def test_packed_ilql_learn_equals_padded(full: bool, packed_options: dict[str, Any]) -> None:
    from test_ilql import make_ilql, token_rewards

    batch = ragged_batch(tuple(r for r in RAGGED if r[1]))  # ILQL needs an action per row
    rewards = token_rewards(batch)
    padded = make_ilql(full)
    packed = make_ilql(full, use_sequence_packing=True, **packed_options)
    m_pad = padded.learn((batch.ids.clone(), batch.masks.clone(), rewards.clone()))
    m_pack = packed.learn((batch.ids.clone(), batch.masks.clone(), rewards.clone()))
    assert m_pack["loss"] == pytest.approx(m_pad["loss"], **SAME_LOSS_TOL)
    pad_params = dict(padded.policy.named_parameters()) | {
        f"heads.{n}": p for n, p in padded.heads.named_parameters()
    }
    pack_params = dict(packed.policy.named_parameters()) | {
        f"heads.{n}": p for n, p in packed.heads.named_parameters()
    }
    names = [n for n, p in pad_params.items() if p.grad is not None]
    assert names == [n for n, p in pack_params.items() if p.grad is not None]
    assert_grads_close(
        {n: pack_params[n].grad for n in names}, {n: pad_params[n].grad for n in names}
    )


def test_packed_learn_equals_padded_on_runs_of_equal_lengths() -> None:
    """Micro-batches whose rows all have one length skip packing (the same forward without its
    padding columns); mixed ones pack: both equal the padded update."""
    runs = tuple(((tl.BOS_ID, 9 + n), (30 + n,) * (2 if n < 3 else 4)) for n in range(6))
    batch = ragged_batch(runs)
    padded = _agent("GRPO", {})
    for options in ({"micro_batch_size_per_gpu": 3}, {"micro_batch_size_per_gpu": 4}):
        packed = _agent("GRPO", {**options, "use_sequence_packing": True})
        m_pad, m_pack = padded.learn(batch.experiences()), packed.learn(batch.experiences())
        assert m_pack["loss"] == pytest.approx(m_pad["loss"], **SAME_LOSS_TOL)
        names = _trainable(padded)
        g_pad = tl.agent_grads(padded.policy, names)
        assert max(float(g.abs().max()) for g in g_pad.values()) > 1e-4, "degenerate test case"
        assert_grads_close(tl.agent_grads(packed.policy, names), g_pad)
        padded = _agent("GRPO", {})
