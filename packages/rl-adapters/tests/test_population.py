"""SharedBasePopulation against the spec: N LoRA agents on one frozen base.

Forwards "inside member(i)" are plain calls of the model handed to the population: PEFT injects
the agents' LoRA layers into that model in place and the spec allows no copy of the base.
"""

from __future__ import annotations

import itertools

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import PolicyModel, SharedBasePopulation
from rl_testing.tolerance import assert_close

N = 4


def _population(arch: str = "qwen2", **kw: object) -> tuple[SharedBasePopulation, torch.nn.Module]:
    model = tl.base(arch)
    kw.setdefault("lora_config", tl.lora())
    return SharedBasePopulation(model, N, **kw), model  # type: ignore[arg-type]


def _perturb_all(pop: SharedBasePopulation) -> None:
    for i in range(N):
        tl.perturb(pop.parameters(i), seed=100 + i)


def _flags(model: torch.nn.Module) -> dict[str, bool]:
    return tl.grad_flags(model)


def _expected_flags(model: torch.nn.Module) -> dict[str, bool]:
    return {n: "lora_" in n and ".agent_" in n for n in tl.named(model)}


@torch.no_grad()
def _all_logits(
    pop: SharedBasePopulation, ids: torch.Tensor, mask: torch.Tensor
) -> list[torch.Tensor]:
    return [pop.logits(i, ids, mask) for i in range(N)]


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_agents_start_equal_to_the_base(arch: str) -> None:
    pop, model = _population(arch)
    ids, mask = tl.batch(tl.vocab_size(model))
    expected = tl.base_logits(arch, ids, mask)
    logits = _all_logits(pop, ids, mask)
    weight = model.get_output_embeddings().weight
    for i, got in enumerate(logits):
        assert got.shape == (*ids.shape, tl.vocab_size(model))
        assert_close(got, expected, **tl.FORWARD, msg=f"agent {i}")
        # bit-exact: B = 0 for every agent, the same kernels on the same weights
        torch.testing.assert_close(got, logits[0], **tl.EXACT, msg=f"agent {i}")
        with torch.no_grad():
            hidden = pop.hidden_states(i, ids, mask)
        assert hidden.shape == (*ids.shape, 64)
        assert_close(hidden @ weight.T, got, **tl.HEAD, msg=f"agent {i}")


def test_agents_are_named_disjoint_and_trainable() -> None:
    pop, model = _population()
    per_agent = [pop.parameters(i) for i in range(N)]
    for i, params in enumerate(per_agent):
        assert params
        assert all(p.requires_grad for p in params)
        names = tl.names_of(model, params)
        assert all("lora_" in n and f".agent_{i}." in n for n in names), names[:2]
    for a, b in itertools.combinations(per_agent, 2):
        assert not tl.ids(a) & tl.ids(b)
        assert len(a) == len(b)
    assert not any(p.requires_grad for p in tl.base_params(model).values())
    assert _flags(model) == _expected_flags(model)


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_training_agent_0_moves_only_agent_0(arch: str) -> None:
    pop, model = _population(arch)
    ids, mask = tl.batch(tl.vocab_size(model))
    before = _all_logits(pop, ids, mask)
    agents = [dict(enumerate(pop.parameters(i))) for i in range(N)]
    snaps = [tl.snapshot(a) for a in agents]
    base_p = tl.base_params(model)
    base_snap = tl.snapshot(base_p)

    opt = torch.optim.Adam(pop.parameters(0), lr=1e-2)
    tl.lm_loss(pop.logits(0, ids, mask), ids, mask).backward()
    opt.step()

    assert tl.changed(snaps[0], agents[0])
    for i in range(1, N):
        assert not tl.changed(snaps[i], agents[i]), f"agent {i} moved"
        assert all(p.grad is None or not p.grad.any() for p in agents[i].values())
    assert not tl.changed(base_snap, base_p)
    after = _all_logits(pop, ids, mask)
    assert not torch.equal(after[0], before[0])  # bit-exact: agent 0 moved
    for i in range(1, N):
        # bit-exact: the other agents' weights did not move; the same kernels run
        torch.testing.assert_close(after[i], before[i], **tl.EXACT, msg=f"agent {i}")
    assert _flags(model) == _expected_flags(model)


def test_clone_copies_exactly_and_does_not_alias() -> None:
    pop, model = _population()
    ids, mask = tl.batch(tl.vocab_size(model))
    _perturb_all(pop)
    before = _all_logits(pop, ids, mask)
    assert not torch.allclose(before[0], before[2], atol=1e-4)
    pop.clone(0, 2)
    after = _all_logits(pop, ids, mask)
    torch.testing.assert_close(after[2], after[0], **tl.EXACT)  # bit-exact: copied weights
    for i in (0, 1, 3):
        # bit-exact: untouched agents, the same kernels on the same weights
        torch.testing.assert_close(after[i], before[i], **tl.EXACT, msg=f"agent {i}")
    src = tl.by_lora_module(model, pop.parameters(0))
    dst = tl.by_lora_module(model, pop.parameters(2))
    assert src.keys() == dst.keys()
    # bit-exact: a copy of the source's parameters
    assert all(torch.equal(src[k], dst[k]) and src[k] is not dst[k] for k in src)
    assert all(p.requires_grad for p in pop.parameters(2))
    assert _flags(model) == _expected_flags(model)
    # a copy, not an alias: moving agent 0 again leaves agent 2 where it was
    tl.perturb(pop.parameters(0), seed=7)
    # bit-exact: agent 2 did not move; the same kernels on the same weights
    torch.testing.assert_close(pop.logits(2, ids, mask).detach(), after[2], **tl.EXACT)
    assert not torch.equal(pop.logits(0, ids, mask).detach(), after[0])  # bit-exact: it moved


def test_member_runs_agent_and_restores_state() -> None:
    pop, model = _population()
    ids, mask = tl.batch(tl.vocab_size(model))
    _perturb_all(pop)
    logits = _all_logits(pop, ids, mask)
    outside = tl.forward_logits(model, ids, mask)
    flags = _flags(model)
    assert flags == _expected_flags(model)
    for i in range(N):
        with pop.member(i):
            assert_close(tl.forward_logits(model, ids, mask), logits[i], **tl.FORWARD)
        # bit-exact: the same forward on the same (restored) weights
        torch.testing.assert_close(tl.forward_logits(model, ids, mask), outside, **tl.EXACT)
        assert _flags(model) == flags
    with pop.member(1):
        with pop.member(3):
            assert_close(tl.forward_logits(model, ids, mask), logits[3], **tl.FORWARD)
        assert_close(tl.forward_logits(model, ids, mask), logits[1], **tl.FORWARD)
    # bit-exact: the same forward on the same (restored) weights
    torch.testing.assert_close(tl.forward_logits(model, ids, mask), outside, **tl.EXACT)

    class BoomError(Exception):
        pass

    with pytest.raises(BoomError), pop.member(2):
        raise BoomError
    # bit-exact: the same forward on the same (restored) weights
    torch.testing.assert_close(tl.forward_logits(model, ids, mask), outside, **tl.EXACT)
    assert _flags(model) == flags


def test_member_allows_training_that_agent() -> None:
    pop, model = _population()
    ids, mask = tl.batch(tl.vocab_size(model))
    agents = [dict(enumerate(pop.parameters(i))) for i in range(N)]
    snaps = [tl.snapshot(a) for a in agents]
    opt = torch.optim.Adam(pop.parameters(3), lr=1e-2)
    with pop.member(3):
        tl.lm_loss(model(input_ids=ids, attention_mask=mask).logits, ids, mask).backward()
    opt.step()
    assert tl.changed(snaps[3], agents[3])
    assert not any(tl.changed(snaps[i], agents[i]) for i in range(3))


def test_population_shares_one_base() -> None:
    cfg = {"r": 4, "targets": ["q_proj", "v_proj"]}
    policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(**cfg), reference=None)  # type: ignore[arg-type]
    pop = SharedBasePopulation(tl.base("qwen2"), N, lora_config=tl.lora(**cfg))  # type: ignore[arg-type]
    single = tl.unique_storage_bytes(tl.reachable_tensors(policy))
    population = tl.unique_storage_bytes(tl.reachable_tensors(pop))
    base_bytes = tl.unique_storage_bytes(tl.base("qwen2").parameters())
    assert single >= base_bytes
    assert population >= base_bytes
    assert population <= 1.3 * single, (population, single, base_bytes)


def test_population_refuses_lora_options_it_cannot_train() -> None:
    """``bias="all"`` made the base biases trainable in peft, then ``_restore`` froze them again
    (silently untrained, and shared by every agent): refused, naming the option."""
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], bias="all")
    with pytest.raises(ValueError, match=r"`lora_config\.bias`"):
        SharedBasePopulation(tl.base("qwen2"), N, lora_config=config)


def test_agents_lora_dropout_follows_the_model_mode() -> None:
    """Agents added to an ``eval()`` model have their LoRA dropout off (peft builds it in
    training mode): two forwards of one agent are the same."""
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj", "v_proj"])
    pop, model = _population(lora_config=config)
    _perturb_all(pop)
    assert not any(m.training for m in model.modules() if isinstance(m, torch.nn.Dropout))
    ids, mask = tl.batch(tl.vocab_size(model))
    with torch.no_grad():
        # bit-exact: no dropout, the same kernels on the same inputs
        assert torch.equal(pop.logits(N - 1, ids, mask), pop.logits(N - 1, ids, mask))
