"""Fast role switches (rl_adapters.roles) against peft's own model-level switches.

Each fast switch must compute what peft computes: the base-model bypass exactly what
``disable_adapter()`` gives, the per-layer ``set_adapter`` exactly what the model-level one
gives, and a merged adapter what the unmerged LoRA forward gives to float32 rounding; and each
must leave the model bit-identical, with the same modules and trainable flags, on exit.
"""

from __future__ import annotations

import copy
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from peft import LoraConfig
from rl_adapters import PolicyModel
from rl_adapters.roles import LoraSites
from rl_testing.tolerance import assert_close


def _policy(arch: str = "qwen2", **kw: Any) -> tuple[PolicyModel, Any]:
    model = tl.base(arch)
    kw.setdefault("lora_config", tl.lora())
    policy = PolicyModel(model, **kw)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    if "reference" in policy.roles and policy.reference_mode == "adapter":
        tl.perturb(tl.adapter_params(model, "reference").values(), seed=2)
    if policy.has_critic:
        head = tl.ids(policy.value_head.parameters()) if policy.value_head else set()
        tl.perturb([p for p in policy.trainable_parameters("critic") if id(p) not in head], 3)
    return policy, model


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _modules(model: torch.nn.Module) -> list[tuple[str, int]]:
    return [(n, id(m)) for n, m in model.named_modules()]


def _peft_logits(policy: PolicyModel, model: Any, role: str, ids: Any, mask: Any) -> Any:
    """Logits with peft's own model-level switch (the reference implementation)."""
    peft = policy.peft
    assert peft is not None
    with torch.no_grad():
        if role == "reference" and policy.reference_mode == "base":
            with peft.disable_adapter():
                return tl.forward_logits(model, ids, mask)
        peft.set_adapter(role)
        try:
            return tl.forward_logits(model, ids, mask)
        finally:
            peft.set_adapter("actor")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("reference", ["adapter", "base"])
def test_fast_roles_compute_what_peft_computes(arch: str, reference: str) -> None:
    policy, model = _policy(arch, reference=reference, critic=True)
    ids, mask = tl.batch(tl.vocab_size(model))
    expected = {r: _peft_logits(policy, model, r, ids, mask) for r in policy.roles}
    policy._restore()
    assert policy.lora_sites() is not None
    for role in policy.roles:
        # bit-exact: autograd on, every role runs through its LoRA layers as peft does
        got = policy.logits(ids, mask, role=role)
        torch.testing.assert_close(got, expected[role], **tl.EXACT, msg=role)
        with torch.no_grad():  # off: a frozen reference adapter runs merged
            got = policy.logits(ids, mask, role=role)
        if role != "reference" or reference == "base":
            # bit-exact: nothing merged, the same LoRA (or base) kernels as peft's
            torch.testing.assert_close(got, expected[role], **tl.EXACT, msg=role)
        else:  # merged weights against the LoRA forward: two routes
            assert_close(got, expected[role], **tl.FORWARD, msg=role)


@pytest.mark.parametrize("role", ["reference", "critic"])
def test_fast_switches_restore_modules_weights_and_flags(role: str) -> None:
    policy, model = _policy("qwen2", critic=True)
    flags = tl.grad_flags(model, policy.value_head)
    tree, state = _modules(model), _state(model)

    class BoomError(Exception):
        pass

    for grad in (True, False):
        with torch.set_grad_enabled(grad), pytest.raises(BoomError), policy.use_role(role):
            raise BoomError
        with pytest.raises(BoomError), policy.merged_for_generation():
            raise BoomError
        assert tl.grad_flags(model, policy.value_head) == flags
        assert _modules(model) == tree
        tl.assert_state_dicts_equal(model.state_dict(), state)


def test_merged_generation_equals_the_lora_forward_and_writes_nothing() -> None:
    policy, model = _policy("qwen2")
    ids, mask = tl.batch(tl.vocab_size(model))
    with torch.no_grad():
        lora = tl.forward_logits(model, ids, mask)
    tree, state = _modules(model), _state(model)
    params = {n: p.data_ptr() for n, p in model.named_parameters()}
    with torch.no_grad(), policy.merged_for_generation():
        merged = tl.forward_logits(model, ids, mask)
        # the LoRA layers are out of the forward: no LoRA parameter is reachable from it
        assert not any(".lora_" in n for n, _ in model.named_parameters())
    assert_close(merged, lora, **tl.FORWARD)
    # bit-exact: the delta is in (any difference shows)
    assert not torch.equal(merged, tl.base_logits("qwen2", ids, mask))
    assert _modules(model) == tree
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == params
    tl.assert_state_dicts_equal(model.state_dict(), state)
    with torch.no_grad(), policy.merged_for_generation(enabled=False):
        assert any(".lora_" in n for n, _ in model.named_parameters())
        # bit-exact: not merged, the same LoRA forward again
        torch.testing.assert_close(tl.forward_logits(model, ids, mask), lora, **tl.EXACT)


def test_merged_generation_samples_with_generate() -> None:
    policy, model = _policy("qwen2")
    ids, mask = tl.batch(tl.vocab_size(model), n=2, t=5)
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        with policy.merged_for_generation():
            merged = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    # bit-exact: integer token ids (greedy: rounding-level logit changes keep the argmax)
    assert torch.equal(plain, merged)


def test_unmergeable_layers_keep_their_lora_forward() -> None:
    # DoRA is a LoRA variant whose merge is not W + scaling * B @ A: it stays unmerged
    dora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
    policy, model = _policy("qwen2", lora_config=dora)
    sites = policy.lora_sites()
    assert sites is not None and len(sites) > 0
    assert sites.mergeable("actor") == []
    ids, mask = tl.batch(tl.vocab_size(model))
    with torch.no_grad():
        lora = tl.forward_logits(model, ids, mask)
        with policy.merged_for_generation():
            # bit-exact: nothing mergeable, the same DoRA forward runs
            torch.testing.assert_close(tl.forward_logits(model, ids, mask), lora, **tl.EXACT)


def test_full_finetune_has_no_sites_and_merging_is_a_no_op() -> None:
    model = tl.base("qwen2")
    policy = PolicyModel(model, full_finetune=True, reference=None)
    assert policy.lora_sites() is None
    ids, mask = tl.batch(tl.vocab_size(model))
    with torch.no_grad():
        before = tl.forward_logits(model, ids, mask)
        with policy.merged_for_generation():
            # bit-exact: a no-op, the same forward on the same weights
            torch.testing.assert_close(tl.forward_logits(model, ids, mask), before, **tl.EXACT)


def test_sites_are_recorded_again_after_rebuilding_adapters() -> None:
    policy, model = _policy("qwen2")
    first = policy.lora_sites()
    policy.rebuild_adapters(tl.lora(r=8))
    second = policy.lora_sites()
    assert first is not None and second is not None and second is not first
    assert {id(s.layer) for s in second.sites}.isdisjoint({id(s.layer) for s in first.sites})
    ids, mask = tl.batch(tl.vocab_size(model))
    tl.perturb(policy.trainable_parameters("actor"), seed=5)
    with torch.no_grad():
        lora = tl.forward_logits(model, ids, mask)
        with policy.merged_for_generation():
            assert_close(tl.forward_logits(model, ids, mask), lora, **tl.FORWARD)


def test_a_deep_copy_switches_its_own_layers() -> None:
    policy, _ = _policy("qwen2")
    policy.lora_sites()  # recorded before the copy
    clone = copy.deepcopy(policy)
    sites = clone.lora_sites()
    assert isinstance(sites, LoraSites)
    own = {id(m) for m in clone.modules()}
    assert all(id(s.layer) in own and id(s.parent) in own for s in sites.sites)


def test_unmergeable_reference_adapter_runs_itself_without_gradient() -> None:
    # DoRA layers cannot be merged: the frozen reference forward must still run the reference
    # adapter in them (not the actor, the layers' active adapter outside the switch)
    dora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
    policy, model = _policy("qwen2", lora_config=dora)
    ids, mask = tl.batch(tl.vocab_size(model))
    expected = _peft_logits(policy, model, "reference", ids, mask)
    actor = _peft_logits(policy, model, "actor", ids, mask)
    policy._restore()
    flags = tl.grad_flags(model, policy.value_head)
    with torch.no_grad():
        got = policy.logits(ids, mask, role="reference")
    assert not torch.allclose(expected, actor)  # the two adapters differ
    # bit-exact: the unmerged reference runs its own DoRA layers, as peft does
    torch.testing.assert_close(got, expected, **tl.EXACT)
    assert tl.grad_flags(model, policy.value_head) == flags


def test_a_zero_reference_delta_runs_the_base_model_until_it_changes() -> None:
    model = tl.base("qwen2")
    policy = PolicyModel(model, lora_config=tl.lora())  # the reference: a copy of a fresh actor
    sites = policy.lora_sites()
    assert sites is not None and sites.delta_is_zero("reference")
    tl.perturb(policy.trainable_parameters("actor"), seed=1)  # the actor moves, not the reference
    assert sites.delta_is_zero("reference") and not sites.delta_is_zero("actor")
    ids, mask = tl.batch(tl.vocab_size(model))
    base = tl.base_logits("qwen2", ids, mask)
    with torch.no_grad():  # bit-exact: W + s * 0 @ A is W, the base model's own kernels run
        torch.testing.assert_close(policy.logits(ids, mask, role="reference"), base, **tl.EXACT)
    policy.sync_reference()  # written in place: the cached answer is recomputed
    assert not sites.delta_is_zero("reference")
    expected = _peft_logits(policy, model, "reference", ids, mask)
    policy._restore()
    with torch.no_grad():
        got = policy.logits(ids, mask, role="reference")
    assert not torch.allclose(got, base)
    assert_close(got, expected, **tl.FORWARD)
    with torch.no_grad():  # zeroed again (e.g. a loaded checkpoint): the bypass is back
        for p in tl.adapter_params(model, "reference").values():
            p.zero_()
    assert sites.delta_is_zero("reference")
