"""Shared prompts: a packed forward that computes each group's prompt once equals the padded one.

The layout (:func:`rl_algos.shared_prefix.shared_prefix_rows`) is checked by hand and as a
property (every padded position reads its own token and position back, every row's attention
layout holds its own tokens, the packed tokens are the real ones less the followers'
prefixes); the model paths on real tiny models: hidden states and their gradients equal the
padded forward's (Qwen2 and Llama, SDPA and eager, every LoRA role, left padding), and one
``learn()`` with ``share_prompt_prefix=True`` leaves the loss and every trainable gradient of
``share_prompt_prefix=False`` (GRPO, PPO with a critic adapter, ILQL; with gradient
checkpointing and token micro-batches). Float32 throughout; the routes sum the same terms in
other orders, so the tolerance is float32 rounding (``rl_testing.tolerance`` with the tiny
model's sizes, as in ``test_packing.py``).
"""

from __future__ import annotations

from typing import Any

import algos_testlib as tl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_algos import packing, shared_prefix, varlen_attention
from rl_algos.packing import row_spans
from rl_algos.shared_prefix import prompt_lengths, shared_prefix_rows, unshare
from rl_testing.tolerance import assert_close
from test_packing import ragged_batch

B = tl.BOS_ID
# groups of three completions of one prompt (rows 0-2, 3-5), ragged, with a prompt that got no
# completion (row 4: its prompt is its whole row) and a completion that starts like another
SHARED: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((B, 10, 11), (30, tl.EOS_ID)),
    ((B, 10, 11), (30, 31, 32, 33, 34, 35, 36, 37, tl.EOS_ID)),
    ((B, 10, 11), (40,)),
    ((B, 20), (41, 42, 43)),
    ((B, 20), ()),
    ((B, 20), (44, 45, 46, 47, 48, 49, tl.EOS_ID)),
)


def _layout(ids: torch.Tensor, att: torch.Tensor, prefix: torch.Tensor) -> Any:
    starts, lengths = row_spans(att)
    return shared_prefix_rows(ids, starts, lengths, prefix)


# --------------------------------------------------------------------------- the layout


def test_prompt_lengths_by_hand() -> None:
    att = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    scored = torch.tensor(
        [
            [False, True, True, False],  # token 2 is the first scored: 2 prompt tokens
            [False, False, True, True],  # left-padded: columns 1-2 are its prompt
            [False, False, False, False],  # nothing scored: the whole row
            [True, True, True, True],  # token 1 is the first scored
        ]
    )
    assert prompt_lengths(att, scored).tolist() == [2, 2, 2, 1]
    with pytest.raises(ValueError, match=r"`scored` must be \[M, L - 1\]"):
        prompt_lengths(att, scored[:, :3])


def test_layout_by_hand() -> None:
    # rows 0-2 share the prompt B 10 11 (row 2 is that prompt alone), row 3 has its own
    ids = torch.tensor(
        [[B, 10, 11, 30, 2], [B, 10, 11, 31, 0], [B, 10, 11, 0, 0], [B, 20, 40, 41, 0]]
    )
    att = (ids != 0).long()
    layout = _layout(ids, att, torch.tensor([3, 3, 3, 2]))
    assert layout.input_ids.tolist() == [[B, 10, 11, 30, 2, 31, B, 20, 40, 41]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2, 3]]
    S = layout.num_tokens
    assert layout.source.view(4, 5).tolist() == [
        [0, 1, 2, 3, 4],
        [0, 1, 2, 5, S],
        [0, 1, 2, S, S],
        [6, 7, 8, 9, S],
    ]
    # the attention's buckets: rows 0, 1 and 3 (lengths 5, 4, 4: at least 0.8 of 5), row 2
    assert [r.tolist() for r in layout.rows] == [
        [[0, 1, 2, 3, 4], [0, 1, 2, 5, 0], [6, 7, 8, 9, 0]],
        [[0, 1, 2]],
    ]
    assert layout.take.tolist() == [0, 1, 2, 3, 4, 8, 10, 11, 12, 13]
    assert layout.padded
    # nothing to share: rows with other prompts, other prefix lengths or other first columns
    assert _layout(ids[[0, 3]], att[[0, 3]], torch.tensor([3, 2])) is None
    assert _layout(ids[:2], att[:2], torch.tensor([3, 2])) is None
    assert _layout(ids[:2], att[:2], torch.tensor([0, 0])) is None
    # min_saved: the two followers share 6 tokens
    starts, lengths = row_spans(att)
    assert shared_prefix_rows(ids, starts, lengths, torch.tensor([3, 3, 3, 2]), 6) is not None
    assert shared_prefix_rows(ids, starts, lengths, torch.tensor([3, 3, 3, 2]), 7) is None


@st.composite
def grouped_rows(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded rows in groups that repeat a prompt (some rows left-padded), and each row's
    prompt length; tokens from a vocabulary of 4 so that completions often start alike."""
    width = draw(st.integers(2, 9))
    left = draw(st.booleans())
    rows: list[list[int]] = []
    prefix: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        p = draw(st.lists(st.integers(1, 4), min_size=1, max_size=width))
        for _ in range(draw(st.integers(1, 4))):
            c = draw(st.lists(st.integers(1, 4), max_size=width - len(p)))
            rows.append(p + c)
            prefix.append(len(p))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for n, r in enumerate(rows):
        if left:
            ids[n, width - len(r) :] = torch.tensor(r)
        else:
            ids[n, : len(r)] = torch.tensor(r)
    return ids, (ids != 0).long(), torch.tensor(prefix)


@settings(max_examples=200, deadline=None)
@given(grouped_rows())
def test_layout_reads_every_row_back(case: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    ids, att, prefix = case
    starts, lengths = row_spans(att)
    layout = shared_prefix_rows(ids, starts, lengths, prefix)
    real = att.bool()
    same = [
        n > 0
        and int(starts[n]) == int(starts[n - 1])
        and int(prefix[n]) == int(prefix[n - 1])
        and ids[n, : int(starts[n] + prefix[n])].equal(ids[n - 1, : int(starts[n] + prefix[n])])
        for n in range(ids.shape[0])
    ]
    if not any(same):
        assert layout is None
        return
    assert layout is not None
    # the packed tokens: the real ones less each following row's prefix
    assert layout.num_tokens == int(lengths.sum()) - sum(
        int(p) for p, s in zip(prefix, same, strict=True) if s
    )
    # every real position reads its own token and its column back; the padding reads zeros
    back = unshare(layout.input_ids[..., None].float(), layout)[..., 0]
    assert back.equal(torch.where(real, ids, 0).float())  # bit-exact: integers gathered
    pos = unshare(layout.position_ids[..., None].float(), layout)[..., 0]
    cols = torch.arange(ids.shape[1]).expand_as(ids)
    assert pos.equal(torch.where(real, cols, 0).float())  # bit-exact: integers gathered
    # the attention's buckets: rows at least BUCKET_RATIO as long as the bucket's longest,
    # each row's own tokens right-aligned from 0
    flat = torch.cat([r.reshape(-1) for r in layout.rows])
    buckets, offsets = shared_prefix._buckets(lengths.tolist())
    assert [tuple(r.shape) for r in layout.rows] == [(len(b), int(lengths[b[0]])) for b in buckets]
    for bucket in buckets:
        width = int(lengths[bucket[0]])
        assert all(shared_prefix.BUCKET_RATIO * width <= lengths[k] <= width for k in bucket)
    for n in range(ids.shape[0]):
        length, start = int(lengths[n]), int(starts[n])
        got = layout.input_ids[0][flat[offsets[n] : offsets[n] + length]]
        assert got.tolist() == ids[n, start : start + length].tolist()
    assert sum(r.shape[0] for r in layout.rows) == ids.shape[0]
    # each packed token is read from a row that holds it
    assert flat[layout.take].tolist() == list(range(layout.num_tokens))
    assert layout.padded == (not bool(real.all()))


def test_attention_refuses_other_layouts() -> None:
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="rl_shared_prefix_sdpa runs shared-prefix packed rows"):
        shared_prefix.shared_prefix_attention(torch.nn.Module(), q, q, q, None)


def test_shares_previous_by_hand() -> None:
    ids = torch.tensor(
        [[B, 10, 11, 30, 2], [B, 10, 11, 31, 0], [B, 10, 12, 31, 0], [B, 10, 12, 0, 0]]
    )
    att = (ids != 0).long()
    scored = torch.zeros(4, 4, dtype=torch.bool)
    scored[0, 2:4] = scored[1, 2] = scored[2, 1:3] = True  # row 2's prompt: B 10
    # row 1: row 0's prompt B 10 11; row 2: another length; row 3: no action, its whole row
    assert shared_prefix.shares_previous(ids, att, scored).tolist() == [False, True, False, False]


def test_token_budget_keeps_shared_prompts_together() -> None:
    """Runs of rows that share a prompt go into one micro-batch where they fit, are cut into
    consecutive pieces where they do not, and are placed row by row when more micro-batches
    are wanted than there are runs."""
    from rl_algos.microbatch import token_budget_groups

    lengths, together = [5, 5, 5, 4, 4, 4], [False, True, True, False, True, True]
    # without together the balanced fill mixes the groups
    assert token_budget_groups(lengths, 15) == [[0, 2, 5], [1, 3, 4]]
    assert token_budget_groups(lengths, 15, together=together) == [[0, 1, 2], [3, 4, 5]]
    assert token_budget_groups(lengths, 10) == [[0, 3], [1, 4], [2, 5]]
    assert token_budget_groups(lengths, 10, together=together) == [[0, 1], [2, 5], [3, 4]]
    assert token_budget_groups(lengths, 15, max_rows=2, together=together) == [
        [0, 1],
        [2, 5],
        [3, 4],
    ]
    assert token_budget_groups(lengths, 15, groups=4, together=together) == token_budget_groups(
        lengths, 15, groups=4
    )
    with pytest.raises(ValueError, match="`together` has 2 flags for 6 rows"):
        token_budget_groups(lengths, 15, together=[False, True])


# --------------------------------------------------------------------------- forwards


def assert_hidden_close(actual: torch.Tensor, expected: torch.Tensor, msg: str) -> None:
    """2 decoder layers and the final norm, the longest sum the MLP's 128 (as in
    ``test_packing.assert_hidden_close``); gradients twice as deep."""
    assert_close(actual, expected, reduction=tl.REDUCTION, stages=tl.LAYERS + 1, msg=msg)


def _inputs(left: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, scored)`` of :data:`SHARED`; ``left``: the prompts
    left-padded to one width and the completions after them, as a batch of generations is."""
    width = 4 if left else 0
    ids = torch.full((len(SHARED), tl.SEQ_LEN + width), tl.PAD_ID, dtype=torch.long)
    scored = torch.zeros((len(SHARED), tl.SEQ_LEN + width - 1), dtype=torch.bool)
    for n, (prompt, completion) in enumerate(SHARED):
        start = width - len(prompt) if left else 0
        seq = [*prompt, *completion]
        ids[n, start : start + len(seq)] = torch.tensor(seq)
        scored[n, start + len(prompt) - 1 : start + len(seq) - 1] = True
    return ids, (ids != tl.PAD_ID).long(), scored


@pytest.mark.parametrize(
    ("arch", "attn"), [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa")]
)
def test_shared_hidden_states_equal_padded(arch: str, attn: str) -> None:
    """Values at every real token (every role), and the gradient of every parameter, equal the
    padded forward's; left-padded rows too; the attention implementation is restored."""
    from rl_adapters import PolicyModel
    from rl_testing.models import tiny_causal_lm

    model, _ = tiny_causal_lm(arch, seed=0, attn_implementation=attn)  # type: ignore[call-overload]
    policy = PolicyModel(model, lora_config=tl.lora_config(), critic=True, seed=3)
    tl.perturb_adapter(policy, "actor", seed=1)
    tl.perturb_adapter(policy, "critic", seed=2)
    weights = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    for left in (False, True):
        ids, att, mask = _inputs(left)
        real = att.bool()
        for role in ("actor", "reference", "critic"):
            report = packing.PackingReport()
            with torch.no_grad():
                padded = policy.hidden_states(ids, att, role)
                shared = packing.packed_hidden_states(
                    policy, ids, att, role, scored=mask, report=report
                )
            assert report.shared_forwards == 1
            assert_hidden_close(shared[real], padded[real], f"{role}, left={left}")
            assert bool((shared[~real] == 0).all())
        grads = []
        for share in (False, True):
            policy.zero_grad(set_to_none=True)
            if share:
                hidden = packing.packed_hidden_states(policy, ids, att, scored=mask)
            else:
                hidden = policy.hidden_states(ids, att, "actor")
            (hidden[real] @ weights).square().mean().backward()
            grads.append(
                {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
            )
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for name, g in grads[0].items():
            assert_close(
                grads[1][name],
                g,
                reduction=tl.REDUCTION,
                stages=2 * (tl.LAYERS + 1),
                msg=f"grad {name}, left={left}",
            )
    assert varlen_attention.attention_implementation(model) == attn  # restored after forward


# --------------------------------------------------------------------------- learn()


def _agent(algo: str, share: bool | None, **options: Any) -> Any:
    if algo == "ILQL":
        return tl.make_ilql(share_prompt_prefix=share, **options)
    return tl.make_agent(algo, share_prompt_prefix=share, **options)


def _experiences(algo: str) -> Any:
    if algo == "ILQL":  # offline rows, each with an action
        batch = ragged_batch(tuple(r for r in SHARED if r[1]))
        return batch.ids, batch.masks, tl.token_rewards(batch)
    return ragged_batch(SHARED).experiences()


@pytest.mark.parametrize(
    ("algo", "options"),
    [
        pytest.param("GRPO", {}, id="grpo"),
        pytest.param("GRPO", {"gradient_checkpointing": True}, id="grpo-checkpointing"),
        pytest.param("GRPO", {"micro_batch_tokens": 20}, id="grpo-tokens20"),
        pytest.param("GRPO", {"use_liger_loss": True}, id="grpo-fused"),
        pytest.param("LLMPPO", {"gradient_checkpointing": True}, id="ppo-critic-checkpointing"),
        pytest.param("ILQL", {}, id="ilql"),
    ],
)
def test_shared_learn_equals_unshared(algo: str, options: dict[str, Any]) -> None:
    plain = _agent(algo, False, **options)
    shared = _agent(algo, True, **options)
    m_plain = plain.learn(_experiences(algo))
    m_shared = shared.learn(_experiences(algo))
    assert plain.packing_report.shared_forwards == 0
    assert shared.packing_report.shared_forwards >= 1
    tl.assert_loss_close(m_shared["loss"], m_plain["loss"])
    g_plain, g_shared = _grads(plain), _grads(shared)
    assert g_plain.keys() == g_shared.keys()
    tl.assert_grads_close(g_shared, g_plain)


def _grads(agent: Any) -> dict[str, torch.Tensor]:
    """The gradient of every trainable parameter (the policy's and ILQL's heads), by name."""
    named = dict(agent.policy.named_parameters())
    heads = getattr(agent, "heads", None)
    if heads is not None:
        named |= {f"heads.{n}": p for n, p in heads.named_parameters()}
    names = {id(p): n for n, p in named.items()}
    out = {}
    for p in agent.learner.trainable():
        assert p.grad is not None, names[id(p)]
        out[names[id(p)]] = p.grad.detach().clone()
    return out


def test_default_shares_where_it_saves_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """``None`` shares ragged rows wherever a token is saved, and rows that all have one length
    (a plain batch otherwise) only where the saved work reaches ``MIN_SAVED_WORK``: not on the
    tiny model (64 hidden, two layers), and on it too once the threshold is its saving."""
    from rl_algos import AgentConfig

    assert AgentConfig().share_prompt_prefix is None
    ragged = tl.make_agent("GRPO")
    ragged.learn(ragged_batch(SHARED).experiences())
    assert ragged.packing_report.shared_forwards >= 2
    # two groups of three rows of 6 tokens, each group repeating a prompt of 3
    uniform = ragged_batch(
        tuple(((B, 10 + g, 11), (30 + n, 31, tl.EOS_ID)) for g in range(2) for n in range(3))
    )
    assert len(set(uniform.lengths)) == 1
    default = tl.make_agent("GRPO")
    default.learn(uniform.experiences())
    assert default.packing_report.packed_forwards >= 2
    assert default.packing_report.shared_forwards == 0
    model = default.policy.causal_lm
    per_token = shared_prefix.body_parameters(model)
    embeddings = model.get_input_embeddings().weight.numel()
    assert per_token == sum(p.numel() for p in model.parameters()) - embeddings  # tied head
    # each group's two followers share 3 tokens: 12 in all
    monkeypatch.setattr("rl_algos.scoring.MIN_SAVED_WORK", 12 * per_token)
    enough = tl.make_agent("GRPO")
    enough.learn(uniform.experiences())
    assert enough.packing_report.shared_forwards >= 2
    monkeypatch.setattr("rl_algos.scoring.MIN_SAVED_WORK", 12 * per_token + 1)
    short = tl.make_agent("GRPO")
    short.learn(uniform.experiences())
    assert short.packing_report.shared_forwards == 0


def test_bad_settings_are_refused() -> None:
    from rl_algos import AgentConfig

    assert AgentConfig(share_prompt_prefix="auto").share_prompt_prefix is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`share_prompt_prefix` must be None or 'auto'"):
        AgentConfig(share_prompt_prefix="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"share_prompt_prefix=True .*use_sequence_packing=False"):
        tl.make_agent("GRPO", share_prompt_prefix=True, use_sequence_packing=False)
    agent = tl.make_agent("GRPO", share_prompt_prefix=True)
    agent.policy.causal_lm.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match=r"share_prompt_prefix=True needs SDPA or eager"):
        agent.learn(ragged_batch(SHARED).experiences())
