"""PolicyModel and ValueHead against the spec, on tiny real Qwen2 and Llama models.

"The base" is always a fresh, never-wrapped model built from the same seed (PEFT injects LoRA
layers into the model it is given, so the wrapped model cannot serve as its own reference).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from peft import LoraConfig
from rl_adapters import PolicyModel, ValueHead
from rl_testing.tolerance import assert_close

# policy -> the model handed to it. PEFT injects the LoRA layers into that model in place, so the
# tests run forwards and name parameters through it; `_model(policy)` (the same model, per the
# spec) is checked once, in test_base_model_is_the_model_given, so that a problem there does not
# hide every other check.
_MODELS: weakref.WeakKeyDictionary[PolicyModel, Any] = weakref.WeakKeyDictionary()


def _make(model: Any, **kw: Any) -> PolicyModel:
    policy = PolicyModel(model, **kw)
    _MODELS[policy] = model
    return policy


def _model(policy: PolicyModel) -> Any:
    return _MODELS[policy]


def _policy(arch: str = "qwen2", **kw: Any) -> PolicyModel:
    kw.setdefault("lora_config", tl.lora())
    return _make(tl.base(arch), **kw)


def _inputs(policy: PolicyModel, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return tl.batch(tl.vocab_size(_model(policy)), seed=seed)


def _ref_params(policy: PolicyModel) -> dict[str, torch.nn.Parameter]:
    return tl.adapter_params(_model(policy), "reference")


def _critic_lora(policy: PolicyModel) -> list[torch.nn.Parameter]:
    assert policy.value_head is not None
    head = tl.ids(policy.value_head.parameters())
    return [p for p in policy.trainable_parameters("critic") if id(p) not in head]


def _expected_flags(policy: PolicyModel) -> dict[str, bool]:
    """The spec's trainable set outside use_role: actor (+ critic, value head) LoRA only."""
    trainable = tl.ids(policy.trainable_parameters("actor"))
    if "critic" in policy.roles:
        trainable |= tl.ids(policy.trainable_parameters("critic"))
    flags = {n: id(p) in trainable for n, p in tl.named(_model(policy)).items()}
    if policy.value_head is not None:
        flags.update({f"extra0.{n}": True for n, _ in policy.value_head.named_parameters()})
    return flags


# --------------------------------------------------------------------------- ValueHead


def test_value_head_is_linear_with_bias_and_squeezes() -> None:
    torch.manual_seed(0)
    head = ValueHead(8)
    params = dict(head.named_parameters())
    shapes = sorted(tuple(p.shape) for p in params.values())
    assert shapes == [(1,), (1, 8)]
    weight = next(p for p in params.values() if p.shape == (1, 8))
    bias = next(p for p in params.values() if p.shape == (1,))
    x = torch.randn(2, 3, 8)
    out = head(x)
    assert out.shape == (2, 3)
    assert_close(out, (x @ weight.T + bias)[..., 0], reduction=8)  # one sum over 8 features
    assert head(torch.randn(5, 8)).shape == (5,)


def test_value_head_init_is_deterministic_from_torch_rng() -> None:
    torch.manual_seed(1)
    a = ValueHead(16)
    torch.manual_seed(1)
    b = ValueHead(16)
    c = ValueHead(16)  # RNG advanced: a different draw
    sa, sb, sc = (tl.snapshot(dict(h.named_parameters())) for h in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # bit-exact: the same seeded draw
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)  # bit-exact: another draw differs


# --------------------------------------------------------------------------- construction


def test_default_lora_config_warns_and_targets_all_linear_but_lm_head() -> None:
    model = tl.base("qwen2")
    expected = {
        n for n, m in tl.base("qwen2").named_modules() if isinstance(m, torch.nn.Linear)
    } - {"lm_head"}
    with pytest.warns(UserWarning, match=r"(?i)lora"):
        policy = _make(model)
    actor = policy.trainable_parameters("actor")
    names = tl.names_of(_model(policy), actor)
    wrapped = {re.sub(r"\.lora_[AB]\..*$", "", n) for n in names}
    assert wrapped == expected
    assert all("lm_head" not in n for n in tl.named(_model(policy)) if "lora_" in n)
    for n, p in zip(names, actor, strict=True):
        assert 8 in p.shape, (n, tuple(p.shape))  # r = 8
        if ".lora_A." in n:
            assert p.shape[0] == 8


def test_explicit_lora_config_does_not_warn_about_lora(recwarn: pytest.WarningsRecorder) -> None:
    _policy("qwen2")
    lora_warnings = [
        w
        for w in recwarn
        if issubclass(w.category, UserWarning) and "lora" in str(w.message).lower()
    ]
    assert not lora_warnings


def test_target_modules_naming_nothing_is_a_value_error() -> None:
    cfg = tl.lora(targets=["no_such_proj"])
    with pytest.raises(ValueError, match="lora_config") as info:
        PolicyModel(tl.base("qwen2"), lora_config=cfg)
    assert "q_proj" in str(info.value)  # candidates are listed


_UNHONOURED = [
    # peft makes the base biases or whole module copies trainable, or rewrites the shared base
    # weights; the roles share one frozen base and train only their LoRA weights
    ({"bias": "all"}, "`lora_config.bias`"),
    ({"bias": "lora_only"}, "`lora_config.bias`"),
    ({"modules_to_save": ["norm"]}, "`lora_config.modules_to_save`"),
    ({"trainable_token_indices": [1, 2]}, "`lora_config.trainable_token_indices`"),
    ({"init_lora_weights": "pissa"}, "`lora_config.init_lora_weights`"),
    ({"init_lora_weights": "olora"}, "`lora_config.init_lora_weights`"),
    ({"target_modules": [*tl.LINEAR_NAMES, "lm_head"]}, "`lora_config.target_modules`"),
]


@pytest.mark.parametrize(("option", "named"), _UNHONOURED)
def test_lora_options_the_roles_cannot_honour_are_refused(
    option: dict[str, Any], named: str
) -> None:
    """Before, ``bias``, ``modules_to_save`` and trainable tokens were frozen again by the
    policy's trainable set (silently not trained), an init that rewrites the base weights
    rewrote them once per role (the actor no longer started at the base), and LoRA on the head
    failed at the first ``logits`` with "unsupported output head". Now: a ValueError naming the
    option, raised before peft wraps the model."""
    config = {"r": 4, "lora_alpha": 8, "target_modules": list(tl.LINEAR_NAMES), **option}
    model = tl.base("qwen2", tie_word_embeddings=False, attention_bias=True)
    with pytest.raises(ValueError, match=re.escape(named)):
        PolicyModel(model, lora_config=LoraConfig(**config))
    assert not any("lora_" in n for n, _ in model.named_parameters())  # not wrapped


def test_lora_dropout_follows_the_model_mode() -> None:
    """peft builds its LoRA dropout in training mode whatever the model's mode: a policy over
    an ``eval()`` model ran live LoRA dropout (two scorings of one batch differed, and the lean
    LoRA fell back to peft's forward on every layer without a word). The adapters now take the
    model's mode, also when rebuilt; ``train()`` still turns the dropout on."""
    model = tl.base("qwen2")
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj", "v_proj"])
    policy = _make(model, lora_config=config, critic=True)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    ids, mask = _inputs(policy)
    dropouts = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and not any(m.training for m in dropouts)
    with policy.lean_lora():
        first, second = policy.logits(ids, mask), policy.logits(ids, mask)
    # bit-exact: one deterministic forward (no dropout), the same kernels on the same inputs
    assert torch.equal(first, second)
    assert "LoraLinearFunctionBackward" in tl.graph_kinds(first)  # the lean LoRA ran
    policy.rebuild_adapters(
        LoraConfig(r=8, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj"])
    )
    assert not any(m.training for m in model.modules() if isinstance(m, torch.nn.Dropout))
    policy.train()
    tl.perturb(policy.trainable_parameters("actor"), seed=2)
    with torch.no_grad():
        first, second = policy.logits(ids, mask), policy.logits(ids, mask)
        # bit-exact: two dropout draws (p=0.5 over 64 inputs) differ almost surely
        assert not torch.equal(first, second)


@pytest.mark.parametrize("reference", ["adapter", "base"])
def test_full_finetune_rejects_lora_references(reference: str) -> None:
    with pytest.raises(ValueError, match="reference"):
        PolicyModel(tl.base("qwen2"), full_finetune=True, reference=reference)


def test_lora_mode_rejects_unknown_reference_kinds() -> None:
    for reference in ("copy", "bogus"):
        with pytest.raises(ValueError, match="reference"):
            PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), reference=reference)


def test_full_finetune_rejects_critic() -> None:
    with pytest.raises(ValueError, match=r"(?i)full"):
        PolicyModel(tl.base("qwen2"), full_finetune=True, reference="copy", critic=True)


@pytest.mark.parametrize(
    ("kw", "roles"),
    [
        ({}, ("actor", "reference")),
        ({"critic": True}, ("actor", "reference", "critic")),
        ({"reference": "base"}, ("actor", "reference")),
        ({"reference": None}, ("actor",)),
        ({"reference": None, "critic": True}, ("actor", "critic")),
        ({"full_finetune": True, "reference": "copy", "lora_config": None}, ("actor", "reference")),
        ({"full_finetune": True, "reference": None, "lora_config": None}, ("actor",)),
    ],
)
def test_roles(kw: dict[str, object], roles: tuple[str, ...]) -> None:
    policy = _policy("qwen2", **kw)
    assert tuple(policy.roles) == roles
    assert (policy.value_head is not None) == ("critic" in roles)


@pytest.mark.parametrize("full_finetune", [False, True])
def test_base_model_is_the_model_given(full_finetune: bool) -> None:
    from transformers import PreTrainedModel

    model = tl.base("qwen2")
    if full_finetune:
        policy = PolicyModel(model, full_finetune=True, reference="copy")
    else:
        policy = PolicyModel(model, lora_config=tl.lora(), critic=True)
    assert isinstance(policy.base_model, PreTrainedModel)
    assert tl.ids(policy.base_model.parameters()) == tl.ids(model.parameters())
    if not full_finetune:
        assert any("lora_" in n for n, _ in policy.base_model.named_parameters())


def test_value_head_matches_hidden_size() -> None:
    policy = _policy("qwen2", critic=True)
    assert isinstance(policy.value_head, ValueHead)
    assert tl.names_of(policy.value_head, policy.value_head.parameters())
    assert any(p.shape[-1] == 64 for p in policy.value_head.parameters())


# --------------------------------------------------------------------------- trainable sets


def test_trainable_parameters_partition() -> None:
    policy = _policy("qwen2", critic=True)
    model = _model(policy)
    actor = policy.trainable_parameters("actor")
    critic = policy.trainable_parameters("critic")
    everything = policy.trainable_parameters()
    assert policy.value_head is not None
    head = list(policy.value_head.parameters())
    ref = list(_ref_params(policy).values())
    assert actor
    assert all(p.requires_grad for p in everything)
    assert tl.ids(everything) == tl.ids(actor) | tl.ids(critic)
    assert not tl.ids(actor) & tl.ids(critic)
    assert tl.ids(head) <= tl.ids(critic)
    # LoRA only: every actor/critic parameter (but the head) is a LoRA weight, none is the base's
    # or the reference's, and each adapter has one weight per wrapped position.
    assert all("lora_" in n for n in tl.names_of(model, actor))
    assert all("lora_" in n for n in tl.names_of(model, _critic_lora(policy)))
    assert not (tl.ids(actor) | tl.ids(critic)) & (
        tl.ids(ref) | tl.ids(tl.base_params(model).values())
    )
    assert set(tl.by_lora_module(model, actor)) == set(tl.by_lora_module(model, ref))
    assert set(tl.by_lora_module(model, _critic_lora(policy))) == set(tl.by_lora_module(model, ref))
    assert tl.grad_flags(model, policy.value_head) == _expected_flags(policy)


def test_reference_adapter_starts_equal_to_actor() -> None:
    policy = _policy("qwen2")
    model = _model(policy)
    actor = tl.by_lora_module(model, policy.trainable_parameters("actor"))
    ref = tl.by_lora_module(model, _ref_params(policy).values())
    assert actor.keys() == ref.keys()
    assert all(torch.equal(actor[k], ref[k]) for k in actor)  # bit-exact: a copy of the actor
    assert not any(p.requires_grad for p in ref.values())


# --------------------------------------------------------------------------- logits per role


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_every_role_computes_the_base_logits_at_init(arch: str) -> None:
    policy = _policy(arch, critic=True)
    ids, mask = _inputs(policy)
    expected = tl.base_logits(arch, ids, mask)
    with torch.no_grad():
        per_role = {r: policy.logits(ids, mask, role=r) for r in policy.roles}
    for role, logits in per_role.items():
        assert logits.shape == (*ids.shape, tl.vocab_size(_model(policy)))
        assert_close(logits, expected, **tl.FORWARD, msg=role)
        # bit-exact: B = 0, identical code path for every role, so bit-identical to the actor
        torch.testing.assert_close(logits, per_role["actor"], **tl.EXACT, msg=role)
    for role in policy.roles:
        with policy.use_role(role):
            # bit-exact: B = 0 adds exact zeros to the base model's own kernels
            torch.testing.assert_close(
                tl.forward_logits(_model(policy), ids, mask), expected, **tl.EXACT, msg=role
            )


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_base_reference_is_exactly_the_unwrapped_base(arch: str) -> None:
    policy = _policy(arch, reference="base")
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    expected = tl.base_logits(arch, ids, mask)
    with policy.use_role("reference"):
        # bit-exact: the adapters are disabled, the base model's own kernels run
        torch.testing.assert_close(
            tl.forward_logits(_model(policy), ids, mask), expected, **tl.EXACT
        )
    with torch.no_grad():
        ref = policy.logits(ids, mask, role="reference")
        actor = policy.logits(ids, mask, role="actor")
    assert_close(ref, expected, **tl.FORWARD)
    assert not torch.allclose(actor, expected, atol=1e-4)
    # the actor is active again afterwards
    assert_close(tl.forward_logits(_model(policy), ids, mask), actor, **tl.FORWARD)


def test_use_role_runs_forwards_with_that_roles_weights() -> None:
    policy = _policy("qwen2", critic=True)
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    tl.perturb(_ref_params(policy).values(), seed=2)
    tl.perturb(_critic_lora(policy), seed=3)
    with torch.no_grad():
        per_role = {r: policy.logits(ids, mask, role=r) for r in policy.roles}
    assert not torch.allclose(per_role["actor"], per_role["reference"], atol=1e-4)
    assert not torch.allclose(per_role["actor"], per_role["critic"], atol=1e-4)
    for role in policy.roles:
        with policy.use_role(role):
            inside = tl.forward_logits(_model(policy), ids, mask)
        assert_close(inside, per_role[role], **tl.FORWARD, msg=role)
    assert_close(tl.forward_logits(_model(policy), ids, mask), per_role["actor"], **tl.FORWARD)


@pytest.mark.parametrize("role", ["reference", "critic", "actor"])
def test_use_role_restores_actor_and_exact_trainable_set_even_on_error(role: str) -> None:
    policy = _policy("qwen2", critic=True)
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    tl.perturb(_ref_params(policy).values(), seed=2)
    tl.perturb(_critic_lora(policy), seed=3)
    actor = tl.forward_logits(_model(policy), ids, mask)
    flags = tl.grad_flags(_model(policy), policy.value_head)
    assert flags == _expected_flags(policy)

    class BoomError(Exception):
        pass

    with pytest.raises(BoomError), policy.use_role(role):
        raise BoomError
    assert tl.grad_flags(_model(policy), policy.value_head) == flags
    # bit-exact: the same forward on the same (restored) weights
    torch.testing.assert_close(tl.forward_logits(_model(policy), ids, mask), actor, **tl.EXACT)

    with policy.use_role(role):
        pass
    assert tl.grad_flags(_model(policy), policy.value_head) == flags
    # bit-exact: the same forward on the same (restored) weights
    torch.testing.assert_close(tl.forward_logits(_model(policy), ids, mask), actor, **tl.EXACT)


def test_convenience_methods_leave_actor_active_and_trainable_set_intact() -> None:
    policy = _policy("qwen2", critic=True)
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    tl.perturb(_critic_lora(policy), seed=3)
    actor = tl.forward_logits(_model(policy), ids, mask)
    flags = tl.grad_flags(_model(policy), policy.value_head)
    with torch.no_grad():
        policy.logits(ids, mask, role="reference")
        policy.hidden_states(ids, mask, role="critic")
        policy.values(ids, mask)
    policy.logits(ids, mask, role="critic").sum().backward()
    assert tl.grad_flags(_model(policy), policy.value_head) == flags
    # bit-exact: the same forward on the same (restored) weights
    torch.testing.assert_close(tl.forward_logits(_model(policy), ids, mask), actor, **tl.EXACT)


def test_unknown_role_is_a_value_error_listing_roles() -> None:
    policy = _policy("qwen2")  # no critic
    for bad in ("critic", "policy"):
        with pytest.raises(ValueError, match="role") as info, policy.use_role(bad):
            pass
        assert "actor" in str(info.value)
        assert "reference" in str(info.value)
    ids, mask = _inputs(policy)
    with pytest.raises(ValueError, match="role"):
        policy.logits(ids, mask, role="policy")
    assert tl.grad_flags(_model(policy)) == _expected_flags(policy)


# --------------------------------------------------------------------------- hidden states


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_hidden_states_of_packed_rows(arch: str) -> None:
    """Two rows packed into one [1, S] sequence with restarting position_ids and no mask
    (transformers' packed layout) give each row's own hidden states."""
    policy = _policy(arch)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    packed = torch.tensor([[1, 5, 6, 7, 8, 1, 9, 10]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    with torch.no_grad():
        padded = policy.hidden_states(ids, mask)
        out = policy.hidden_states(packed, None, position_ids=positions)
    assert_close(out[0, :5], padded[0], **tl.FORWARD, msg="row 0")
    assert_close(out[0, 5:], padded[1, :3], **tl.FORWARD, msg="row 1")


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_hidden_states_times_lm_head_is_logits(arch: str) -> None:
    policy = _policy(arch, critic=True)
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    tl.perturb(_critic_lora(policy), seed=3)
    weight = policy.lm_head_weight
    assert weight.shape == (tl.vocab_size(_model(policy)), 64)
    assert policy.lm_head_bias is None
    with torch.no_grad():
        for role in policy.roles:
            hidden = policy.hidden_states(ids, mask, role=role)
            assert hidden.shape == (*ids.shape, 64)
            with policy.use_role(role):
                full = tl.forward_logits(_model(policy), ids, mask)
            assert_close(hidden @ weight.T, full, **tl.HEAD, msg=role)
            assert_close(policy.logits(ids, mask, role=role), full, **tl.FORWARD, msg=role)
        # default role is the actor
        # bit-exact: the same call twice
        torch.testing.assert_close(
            policy.hidden_states(ids, mask),
            policy.hidden_states(ids, mask, role="actor"),
            **tl.EXACT,
        )


def test_untied_lm_head_with_bias() -> None:
    def build() -> torch.nn.Module:
        model = tl.base("llama", tie_word_embeddings=False)
        gen = torch.Generator().manual_seed(5)
        head = torch.nn.Linear(64, tl.vocab_size(model), bias=True)
        with torch.no_grad():
            head.weight.copy_(0.1 * torch.randn(head.weight.shape, generator=gen))
            head.bias.copy_(torch.randn(head.bias.shape, generator=gen))
        model.lm_head = head
        return model

    reference = build()
    policy = _make(build(), lora_config=tl.lora())
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    assert torch.equal(policy.lm_head_weight, reference.lm_head.weight)  # bit-exact: same init
    # bit-exact: another tensor altogether
    assert not torch.equal(policy.lm_head_weight, reference.model.embed_tokens.weight)
    bias = policy.lm_head_bias
    assert bias is not None
    assert torch.equal(bias, reference.lm_head.bias)  # bit-exact: the same seeded init
    with torch.no_grad():
        hidden = policy.hidden_states(ids, mask)
        full = tl.forward_logits(_model(policy), ids, mask)
    assert_close(hidden @ policy.lm_head_weight.T + bias, full, **tl.HEAD)


def test_tied_lm_head_weight_is_the_embedding() -> None:
    policy = _policy("qwen2")
    embed = _model(policy).get_input_embeddings().weight
    assert torch.equal(policy.lm_head_weight, embed)  # bit-exact: the tied tensor itself


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_values_come_from_the_critic_adapter(arch: str) -> None:
    policy = _policy(arch, critic=True)
    ids, mask = _inputs(policy)
    head = policy.value_head
    assert head is not None
    with torch.no_grad():
        v0 = policy.values(ids, mask)
        assert v0.shape == ids.shape
        assert_close(v0, head(policy.hidden_states(ids, mask, role="critic")), **tl.FORWARD)
        tl.perturb(policy.trainable_parameters("actor"), seed=1)
        tl.perturb(_ref_params(policy).values(), seed=2)
        # bit-exact: the critic's weights and kernels are unchanged
        torch.testing.assert_close(policy.values(ids, mask), v0, **tl.EXACT)
        tl.perturb(_critic_lora(policy), seed=3)
        v1 = policy.values(ids, mask)
    assert not torch.allclose(v1, v0, atol=1e-5)
    with torch.no_grad():
        assert_close(v1, head(policy.hidden_states(ids, mask, role="critic")), **tl.FORWARD)


def test_values_gradients_reach_critic_and_head_only() -> None:
    policy = _policy("qwen2", critic=True)
    ids, mask = _inputs(policy)
    tl.perturb(_critic_lora(policy), seed=3)
    policy.values(ids, mask).pow(2).mean().backward()
    assert all(p.grad is not None for p in policy.trainable_parameters("critic"))
    assert all(p.grad is None or not p.grad.any() for p in policy.trainable_parameters("actor"))
    assert all(p.grad is None for p in tl.base_params(_model(policy)).values())


def test_values_without_critic_is_an_error() -> None:
    policy = _policy("qwen2")
    ids, mask = _inputs(policy)
    with pytest.raises((ValueError, RuntimeError)):
        policy.values(ids, mask)
    assert policy.value_head is None
    assert policy.trainable_parameters("actor")


# --------------------------------------------------------------------------- sync_reference


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_sync_reference_is_exact(arch: str) -> None:
    policy = _policy(arch)
    ids, mask = _inputs(policy)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    with torch.no_grad():
        assert not torch.allclose(
            policy.logits(ids, mask, role="reference"), policy.logits(ids, mask), atol=1e-4
        )
    flags = tl.grad_flags(_model(policy))
    policy.sync_reference()
    assert tl.grad_flags(_model(policy)) == flags
    # bit-exact: with autograd on, the reference runs through its LoRA layers as the actor does
    torch.testing.assert_close(
        policy.logits(ids, mask, role="reference"), policy.logits(ids, mask), **tl.EXACT
    )
    # without, its (frozen) delta is merged into the weights: equal to float32 rounding
    with torch.no_grad():
        merged = policy.logits(ids, mask, role="reference")
        assert_close(merged, policy.logits(ids, mask), **tl.FORWARD)
    model = _model(policy)
    actor = tl.by_lora_module(model, policy.trainable_parameters("actor"))
    ref = tl.by_lora_module(model, _ref_params(policy).values())
    assert all(torch.equal(actor[k], ref[k]) for k in actor)  # bit-exact: a copy of the actor
    assert all(actor[k] is not ref[k] for k in actor)
    # a copy, not an alias: moving the actor again leaves the synced reference behind
    before = tl.snapshot(ref)
    tl.perturb(policy.trainable_parameters("actor"), seed=4)
    assert not tl.changed(before, ref)


@pytest.mark.parametrize("reference", ["base", None])
def test_sync_reference_without_reference_adapter_is_a_value_error(reference: str | None) -> None:
    policy = _policy("qwen2", reference=reference)
    with pytest.raises(ValueError, match=r"(?i)sync|base|reference"):
        policy.sync_reference()


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_one_adam_step_moves_only_the_actor(arch: str) -> None:
    policy = _policy(arch, critic=True)
    model = _model(policy)
    ids, mask = _inputs(policy)
    actor = dict(enumerate(policy.trainable_parameters("actor")))
    critic = dict(enumerate(policy.trainable_parameters("critic")))
    base_p, ref_p = tl.base_params(model), _ref_params(policy)
    snaps = [tl.snapshot(d) for d in (actor, critic, base_p, ref_p)]
    with torch.no_grad():
        ref_logits = policy.logits(ids, mask, role="reference")
    opt = torch.optim.Adam(list(actor.values()), lr=1e-2)
    loss = tl.lm_loss(policy.logits(ids, mask), ids, mask)
    loss.backward()
    opt.step()
    moved = tl.changed(snaps[0], actor)
    assert moved, "the actor did not move"
    names = tl.names_of(model, [actor[k] for k in moved])
    assert all(".lora_B." in n for n in names)  # B = 0 at init: A has no gradient on step 1
    assert not tl.changed(snaps[1], critic)
    assert not tl.changed(snaps[2], base_p)
    assert not tl.changed(snaps[3], ref_p)
    assert all(p.grad is None for p in ref_p.values())
    assert all(p.grad is None for p in base_p.values())
    with torch.no_grad():
        # bit-exact: the reference's weights did not move; the same kernels run
        torch.testing.assert_close(
            policy.logits(ids, mask, role="reference"), ref_logits, **tl.EXACT
        )
        assert not torch.equal(policy.logits(ids, mask), ref_logits)  # bit-exact: the actor moved
        # bit-exact: critic untouched (still B = 0), an exact zero delta as the reference's
        torch.testing.assert_close(policy.logits(ids, mask, role="critic"), ref_logits, **tl.EXACT)
    assert tl.grad_flags(model, policy.value_head) == _expected_flags(policy)


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    grads = []
    for gc in (False, True):
        torch.manual_seed(0)  # same LoRA A init in both policies
        policy = _policy("qwen2", gradient_checkpointing=gc)
        _model(policy).train()
        ids, mask = _inputs(policy)
        tl.perturb(policy.trainable_parameters("actor"), seed=1)
        tl.lm_loss(policy.logits(ids, mask), ids, mask).backward()
        params = policy.trainable_parameters("actor")
        assert all(p.grad is not None for p in params)
        grads.append([p.grad.clone() for p in params if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, **tl.GRADS)


# --------------------------------------------------------------------------- full fine-tuning


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_full_finetune_with_frozen_copy(arch: str) -> None:
    policy = _make(tl.base(arch), full_finetune=True, reference="copy")
    model = _model(policy)
    ids, mask = _inputs(policy)
    base0 = tl.base_logits(arch, ids, mask)
    actor = policy.trainable_parameters("actor")
    assert tl.ids(actor) == tl.ids(model.parameters())
    assert tl.ids(policy.trainable_parameters()) == tl.ids(actor)
    assert all(p.requires_grad for p in actor)
    assert not any("lora_" in n for n in tl.named(model))
    # every other parameter the policy holds (the copy) is frozen and separate storage
    others = [
        t
        for t in tl.reachable_tensors(policy)
        if isinstance(t, torch.nn.Parameter) and id(t) not in tl.ids(actor)
    ]
    assert others, "no reference copy found"
    assert not any(p.requires_grad for p in others)
    actor_ptrs = {p.untyped_storage().data_ptr() for p in actor}
    assert not {p.untyped_storage().data_ptr() for p in others} & actor_ptrs
    with torch.no_grad():
        for role in policy.roles:
            assert_close(policy.logits(ids, mask, role=role), base0, **tl.FORWARD, msg=role)

    before_others = tl.snapshot(others)
    opt = torch.optim.Adam(actor, lr=1e-2)
    tl.lm_loss(policy.logits(ids, mask), ids, mask).backward()
    opt.step()
    opt.zero_grad()
    assert not tl.changed(before_others, dict(enumerate(others)))
    assert all(p.grad is None for p in others)
    with torch.no_grad():
        ref = policy.logits(ids, mask, role="reference")
        new = policy.logits(ids, mask)
    assert_close(ref, base0, **tl.FORWARD)
    assert not torch.allclose(new, base0, atol=1e-4)

    policy.sync_reference()
    with torch.no_grad():
        # bit-exact: the synced copy runs the same kernels on the same weights
        torch.testing.assert_close(policy.logits(ids, mask, role="reference"), new, **tl.EXACT)
    assert all(p.requires_grad for p in policy.trainable_parameters("actor"))
    # re-copied, not aliased: another actor step leaves the reference behind
    tl.lm_loss(policy.logits(ids, mask), ids, mask).backward()
    opt.step()
    with torch.no_grad():
        # bit-exact: the synced copy runs the same kernels on the same weights
        torch.testing.assert_close(policy.logits(ids, mask, role="reference"), new, **tl.EXACT)
        assert not torch.equal(policy.logits(ids, mask), new)  # bit-exact: the actor moved


def test_full_finetune_without_reference() -> None:
    policy = _make(tl.base("qwen2"), full_finetune=True, reference=None)
    assert tuple(policy.roles) == ("actor",)
    with pytest.raises(ValueError, match="role"), policy.use_role("reference"):
        pass
    with pytest.raises(ValueError, match=r"(?i)sync|reference"):
        policy.sync_reference()


@pytest.mark.parametrize("full_finetune", [False, True])
def test_gradient_checkpointing_recomputes_in_eval_mode(full_finetune: bool) -> None:
    # The policy stays in eval() (dropout off); transformers checkpoints a layer only when
    # the layer's own `training` flag is set, so the policy must set it for the backward.
    calls: dict[bool, list[int]] = {}
    for gc in (False, True):
        kw: dict[str, Any] = {"full_finetune": True, "reference": None} if full_finetune else {}
        policy = _policy("qwen2", gradient_checkpointing=gc, **kw)
        policy.eval()
        ids, mask = _inputs(policy)
        attention = [m for n, m in _model(policy).named_modules() if n.endswith("self_attn")]
        count = [0] * len(attention)

        def tick(i: int, count: list[int] = count) -> Callable[..., None]:
            def hook(*_: Any) -> None:
                count[i] += 1

            return hook

        hooks = [a.register_forward_hook(tick(i)) for i, a in enumerate(attention)]
        tl.lm_loss(policy.logits(ids, mask), ids, mask).backward()
        calls[gc] = list(count)
        with torch.no_grad():  # scoring and generation: no recomputation, KV cache kept
            count[:] = [0] * len(attention)
            policy.logits(ids, mask)
            assert count == [1] * len(attention)
        for h in hooks:
            h.remove()
        assert not any(m.training for m in _model(policy).modules())  # dropout stays off
    assert len(attention) >= 2
    assert calls[False] == [1] * len(attention)
    # each layer but the last recomputed in the backward (PolicyModel._checkpointing)
    assert calls[True] == [2] * (len(attention) - 1) + [1]
