"""The lean LoRA training forward (rl_adapters.lean_lora) against peft's own LoRA forward.

Inside ``PolicyModel.lean_lora()`` every plain LoRA linear layer runs as one autograd node;
its values must equal peft's (to float32 rounding: a scale that is not a power of two rounds,
and on CPU the rank products run transposed) and so must the gradients of the adapter weights;
anything it does not cover must fall back to peft's forward, and the model must come back with
the same modules on exit.
"""

from __future__ import annotations

from typing import Any

import adapters_testlib as tl
import pytest
import torch
from peft import LoraConfig
from rl_adapters import PolicyModel, lean_lora
from rl_adapters.lean_lora import LeanLora, LoraLinearFunction
from rl_testing.tolerance import assert_close


def _policy(lora: LoraConfig | None = None, **kw: Any) -> tuple[PolicyModel, Any]:
    model = tl.base("qwen2")
    policy = PolicyModel(model, lora_config=lora or tl.lora(), **kw)
    tl.perturb(policy.trainable_parameters("actor"), seed=1)  # B != 0: the delta counts
    return policy, model


def _loss_and_grads(policy: PolicyModel, model: Any, lean: bool) -> tuple[Any, ...]:
    ids, mask = tl.batch(tl.vocab_size(model))
    params = policy.trainable_parameters("actor")
    for p in params:
        p.grad = None
    with policy.lean_lora(enabled=lean):
        logits = policy.logits(ids, mask)
        tl.lm_loss(logits, ids, mask).backward()
    return (logits.detach(), *[p.grad.clone() for p in params])


def _lean_layers(model: torch.nn.Module) -> int:
    return sum(isinstance(m, LeanLora) for m in model.modules())


@pytest.mark.parametrize("alpha", [8, 6])
def test_lean_forward_and_gradients_equal_peft(alpha: int) -> None:
    # r = 4: alpha 8 gives scaling 2 (exact in float), alpha 6 gives 1.5 (rounding differs)
    policy, model = _policy(tl.lora(r=4, alpha=alpha))
    seen: list[int] = []
    hook = torch.nn.Module.register_forward_hook  # count the lean layers that really ran
    handles = []
    with policy.lean_lora():
        assert _lean_layers(model) == len(policy.lora_sites() or ())
        for m in model.modules():
            if isinstance(m, LeanLora):
                handles.append(hook(m, lambda *_: seen.append(1)))
        lean = _loss_and_grads(policy, model, lean=True)
    for h in handles:
        h.remove()
    assert seen and _lean_layers(model) == 0
    plain = _loss_and_grads(policy, model, lean=False)
    assert len(lean) == len(plain) > 1
    # the logits and gradients to rounding (x A^T is summed by another kernel on CPU; the input
    # gradient of a layer is summed in another order: g W + g_u A inside the node)
    assert_close(lean[0], plain[0], **tl.FORWARD, msg="logits")
    for a, b in zip(lean[1:], plain[1:], strict=True):
        assert_close(a, b, **tl.GRADS, msg="gradient")


def test_lean_forward_without_grad_runs_the_same_operations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # scoring (no grad, inference mode) runs the lean layers without an autograd node: the
    # same operations as the training forward, so the same numbers to the bit
    policy, model = _policy(tl.lora(r=4, alpha=6))
    ids, mask = tl.batch(tl.vocab_size(model))
    calls, nodes = [0], [0]
    real, apply = lean_lora._lora_linear, LoraLinearFunction.apply

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    def node(*args: Any) -> Any:
        nodes[0] += 1
        return apply(*args)

    monkeypatch.setattr(lean_lora, "_lora_linear", counted)
    monkeypatch.setattr(LoraLinearFunction, "apply", node)
    sites = len(policy.lora_sites() or ())
    with policy.lean_lora():
        trained = policy.logits(ids, mask)
        assert trained.requires_grad and calls[0] == nodes[0] == sites
        for mode in (torch.no_grad, torch.inference_mode):
            calls[0] = nodes[0] = 0
            with mode():
                scored = policy.logits(ids, mask)
            assert calls[0] == sites and nodes[0] == 0 and not scored.requires_grad
            # bit-exact: the same kernels on the same inputs, with and without autograd
            assert torch.equal(scored, trained.detach())


def test_function_gradients_against_float64_autograd() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w, b = (
        torch.randn(4, 6, generator=gen, dtype=torch.float64),
        torch.randn(4, dtype=torch.float64),
    )
    a = torch.randn(3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    bb = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda x, a, bb: LoraLinearFunction.apply(x, w, b, a, bb, 0.7), (x, a, bb)
    )
    y = LoraLinearFunction.apply(x, w, b, a, bb, 0.7)
    # two chained sums, over 6 inputs then 3 ranks
    assert_close(y, x @ w.T + b + 0.7 * (x @ a.T) @ bb.T, reduction=6, stages=2)


def test_lean_falls_back_to_peft_where_it_does_not_apply() -> None:
    # dropout in training mode, a DoRA variant, a disabled adapter: peft's own forward runs
    policy, model = _policy(tl.lora(r=4, alpha=8))
    dora_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True)
    dora, _ = _policy(dora_config)
    ids, mask = tl.batch(tl.vocab_size(model))
    calls: list[str] = []

    def spy(layer: Any) -> None:
        original = layer.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            calls.append("peft")
            return original(*args, **kwargs)

        layer.forward = forward

    for p in (policy, dora):
        for site in p.lora_sites().sites:  # type: ignore[union-attr]
            spy(site.layer)
    with policy.lean_lora():
        policy.logits(ids, mask)
    assert not calls  # plain LoRA, eval-mode dropout: all lean
    with dora.lean_lora():
        dora.logits(ids, mask)
    assert calls  # DoRA: peft's forward
    calls.clear()
    first = policy.lora_sites().sites[0].layer  # type: ignore[union-attr]
    first.lora_dropout["actor"] = torch.nn.Dropout(0.5).train()
    with policy.lean_lora():
        policy.logits(ids, mask)
    assert calls == ["peft"]  # only the layer whose dropout is live


def test_lean_rechecks_a_layer_whose_base_changed() -> None:
    # the static check is remembered per layer while its base layer and weight stay the same
    policy, model = _policy(tl.lora(r=4, alpha=8))
    sites = policy.lora_sites()
    assert sites is not None
    with policy.lean_lora():
        lean = _lean_layers(model)
    assert lean == len(sites)

    class OtherLinear(torch.nn.Linear):  # not a plain nn.Linear: peft's forward runs
        pass

    layer = sites.sites[0].layer
    old = layer.base_layer
    new = OtherLinear(old.in_features, old.out_features, bias=old.bias is not None)
    new.load_state_dict(old.state_dict())
    new.requires_grad_(False)
    layer.base_layer = new
    with policy.lean_lora():
        assert _lean_layers(model) == lean - 1
    layer.base_layer = old
    with policy.lean_lora():
        assert _lean_layers(model) == lean


def test_each_body_follows_what_changed_since_the_last() -> None:
    # a layer's plan is kept from body to body while it holds: a new scale, a replaced adapter
    # weight, a trained base or another dtype since the last body must all be followed
    policy, model = _policy(tl.lora(r=4, alpha=8))
    ids, mask = tl.batch(tl.vocab_size(model))
    layer = policy.lora_sites().sites[0].layer  # type: ignore[union-attr]

    def lean_equals_peft() -> None:
        with torch.no_grad():
            plain = policy.logits(ids, mask)
        with policy.lean_lora():
            lean = policy.logits(ids, mask)
        assert_close(lean, plain, **tl.FORWARD, msg="logits")

    lean_equals_peft()  # the plans are made
    layer.scaling["actor"] = 3.0
    lean_equals_peft()
    old = layer.lora_B["actor"].weight
    layer.lora_B["actor"].weight = torch.nn.Parameter(torch.randn_like(old))
    lean_equals_peft()
    layer.base_layer.weight.requires_grad_(True)  # a trained base: peft's forward there
    with policy.lean_lora():
        lean = policy.logits(ids, mask)
        assert layer.base_layer.weight.requires_grad
    lean.sum().backward()
    assert layer.base_layer.weight.grad is not None  # the lean node gives the base no gradient
    layer.base_layer.weight.requires_grad_(False)
    model.double()
    ids64, mask64 = ids, mask
    with torch.no_grad():
        plain = policy.logits(ids64, mask64)
    with policy.lean_lora():
        lean = policy.logits(ids64, mask64)
    assert lean.dtype == plain.dtype == torch.float64
    assert_close(lean, plain, **tl.FORWARD, msg="float64 logits")
    # every layer decided again for float64, none left to peft's forward
    assert _lean_nodes(lean) == len(policy.lora_sites() or ())


def _lean_nodes(out: torch.Tensor) -> int:
    """How many lean LoRA nodes ``out``'s graph holds."""
    seen, todo, count = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == "LoraLinearFunctionBackward"
        todo.extend(n for n, _ in node.next_functions)
    return count


def test_lean_nests_with_role_switches_and_restores_the_model() -> None:
    policy, model = _policy(reference="base", critic=True)
    tree = [(n, id(m)) for n, m in model.named_modules()]
    ids, mask = tl.batch(tl.vocab_size(model))
    with torch.no_grad():
        ref = policy.logits(ids, mask, role="reference")
        critic = policy.values(ids, mask)

    class BoomError(Exception):
        pass

    def body() -> None:
        lean = _lean_layers(model)
        with torch.no_grad():
            assert_close(policy.logits(ids, mask, role="reference"), ref, **tl.FORWARD)
            assert _lean_layers(model) == lean  # the bypass put the lean layers back
            assert_close(policy.values(ids, mask), critic, **tl.FORWARD)
        raise BoomError

    with pytest.raises(BoomError), policy.lean_lora():
        body()
    assert [(n, id(m)) for n, m in model.named_modules()] == tree


def test_lean_under_activation_checkpointing_recomputes_the_same_gradients() -> None:
    policy, model = _policy(tl.lora(r=4, alpha=8), gradient_checkpointing=True)
    lean = _loss_and_grads(policy, model, lean=True)
    plain = _loss_and_grads(policy, model, lean=False)
    assert_close(lean[0], plain[0], **tl.FORWARD, msg="logits")
    for a, b in zip(lean[1:], plain[1:], strict=True):
        assert_close(a, b, **tl.GRADS, msg="gradient")


def test_lean_falls_back_to_peft_under_cpu_autocast() -> None:
    """Autocast of the input's device (here the CPU's, bfloat16) runs peft's forward, which
    autocast casts; the lean node would mix dtypes. Logits equal the plain run's."""
    policy, model = _policy(tl.lora(r=4, alpha=8))
    ids, mask = tl.batch(tl.vocab_size(model))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        plain = policy.logits(ids, mask)
        with policy.lean_lora():
            lean = policy.logits(ids, mask)
    assert lean.dtype == plain.dtype == torch.bfloat16
    # bit-exact: under autocast both runs are peft's forward, the same kernels on the same inputs
    assert torch.equal(lean, plain)
