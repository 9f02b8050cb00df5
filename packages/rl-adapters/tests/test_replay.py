"""Activation checkpointing replays the forward's switches (``rl_adapters.replay``).

A checkpointed forward recomputes during the backward, after the ``with`` blocks around it
have exited. A toy switch shows the failure mode and the fix; on the policy, a critic forward
(the role switch) backpropagated after ``use_role`` exits equals the unchecked one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import adapters_testlib as tl
import pytest
import torch
from peft import LoraConfig
from rl_adapters import PolicyModel
from rl_adapters.lean_lora import LoraLinearFunction
from rl_adapters.replay import (
    checkpoint_context,
    enable_checkpointing,
    recorded,
    replayable,
    replayed_checkpoint,
)
from rl_testing.tolerance import assert_close
from torch.utils.checkpoint import checkpoint


class _Scaled(torch.nn.Module):
    """``(scale * x)^2``: the backward reads ``scale * x``, which a recomputation rebuilds."""

    scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scale * x) ** 2


@contextlib.contextmanager
def _scale(module: _Scaled, value: float) -> Iterator[None]:
    saved = module.scale
    module.scale = value
    try:
        yield
    finally:
        module.scale = saved


def _grad(
    module: _Scaled, switch: bool, checkpointed: bool, twice: bool = False, reentrant: bool = False
) -> torch.Tensor:
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    enter = functools.partial(_scale, module, 3.0)
    with replayable(enter) if switch else enter():
        if checkpointed and reentrant:
            y = replayed_checkpoint(module, x)
        elif checkpointed:
            y = checkpoint(module, x, use_reentrant=False, context_fn=checkpoint_context)
        else:
            y = module(x)
    assert module.scale == 1.0 and not recorded()  # restored before the backward
    y.sum().backward(retain_graph=twice)
    if twice:  # a second recomputation replays again
        y.sum().backward()
        assert x.grad is not None
        return x.grad / 2
    assert x.grad is not None
    return x.grad


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_recomputation_replays_the_switch(reentrant: bool) -> None:
    module = _Scaled()
    want = 2 * 9.0 * torch.tensor([1.0, -2.0, 3.0])  # d/dx (3x)^2 = 18 x
    assert_close(_grad(module, switch=False, checkpointed=False), want)
    # a plain switch: the recomputation runs with scale 1. Non-reentrant, the backward reads the
    # recomputed x (scale 1) against the forward's scale 3: 6x, not 18x; reentrant, the whole
    # backward is the recomputation's: 2x
    wrong = want / 9 if reentrant else want / 3
    assert_close(_grad(module, switch=False, checkpointed=True, reentrant=reentrant), wrong)
    assert_close(_grad(module, switch=True, checkpointed=True, reentrant=reentrant), want)
    if not reentrant:  # a reentrant checkpoint's graph is freed by its first backward
        assert_close(_grad(module, switch=True, checkpointed=True, twice=True), want)


@pytest.mark.parametrize("reentrant", [False, True])
def test_enable_checkpointing_says_which_checkpoint(reentrant: bool) -> None:
    model = tl.base("qwen2")
    enable_checkpointing(model, reentrant=reentrant)
    assert model._rl_checkpoint == ("reentrant" if reentrant else "non-reentrant")
    layers = [m for m in model.modules() if getattr(m, "_gradient_checkpointing_func", None)]
    assert layers and all(
        (m._gradient_checkpointing_func is replayed_checkpoint) == reentrant for m in layers
    )
    model.train()
    ids, mask = tl.batch(tl.vocab_size(model))
    # a frozen base, frozen embeddings: only the anchor makes the checkpointed layers
    # differentiable (no input of the first layer requires grad)
    model.requires_grad_(False)
    model.model.norm.weight.requires_grad_(True)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(True)
    out = model(input_ids=ids, attention_mask=mask).logits.float().pow(2).mean()
    out.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None
    assert bool(model.model.layers[0].mlp.up_proj.weight.grad.any())


def test_recorded_lists_the_open_switches_outermost_first() -> None:
    module = _Scaled()
    outer, inner = functools.partial(_scale, module, 2.0), functools.partial(_scale, module, 5.0)
    with replayable(outer):
        with replayable(inner):
            assert recorded() == (outer, inner) and module.scale == 5.0
        assert recorded() == (outer,) and module.scale == 2.0
    assert recorded() == () and module.scale == 1.0


def _critic_grads(checkpointing: bool) -> dict[str, torch.Tensor]:
    model = tl.base("qwen2")
    policy = PolicyModel(
        model, lora_config=tl.lora(), critic=True, gradient_checkpointing=checkpointing
    )
    tl.perturb(policy.trainable_parameters("actor"), seed=1)  # actor != critic
    ids, mask = tl.batch(tl.vocab_size(model))
    policy.values(ids, mask).sum().backward()  # the backward runs after use_role("critic")
    named = tl.named(policy)
    critic = tl.ids(policy.trainable_parameters("critic"))
    return {n: p.grad for n, p in named.items() if id(p) in critic and p.grad is not None}


def test_checkpointed_critic_backward_runs_the_critic_adapter() -> None:
    plain, checkpointed = _critic_grads(False), _critic_grads(True)
    assert set(plain) == set(checkpointed) and any(".lora_A." in n for n in plain)
    for name, grad in checkpointed.items():
        if ".lora_A." in name:  # the critic's lora_B is zero: its lora_A gets exactly nothing
            assert not bool(grad.any()), name
        else:
            assert_close(grad, plain[name], **tl.GRADS, msg=name)


def _lora_backward_work(
    checkpointing: bool, monkeypatch: pytest.MonkeyPatch, lora: LoraConfig | None = None
) -> tuple[list[bool], list[torch.Tensor]]:
    """Whether each lean LoRA backward computes its input's gradient, in call order, and the
    adapter gradients, for one lean forward and backward of a LoRA policy."""
    model = tl.base("qwen2")
    policy = PolicyModel(model, lora_config=lora or tl.lora(), gradient_checkpointing=checkpointing)
    params = policy.trainable_parameters("actor")
    tl.perturb(params, seed=1)
    ids, mask = tl.batch(tl.vocab_size(model))
    needs_x: list[bool] = []
    backward = LoraLinearFunction.backward

    def spy(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        needs_x.append(bool(ctx.needs_input_grad[0]))  # type: ignore[attr-defined]
        return backward(ctx, grad)  # type: ignore[arg-type]

    monkeypatch.setattr(LoraLinearFunction, "backward", staticmethod(spy))
    with policy.lean_lora():
        tl.lm_loss(policy.logits(ids, mask), ids, mask).backward()
    monkeypatch.undo()
    return needs_x, [p.grad for p in params]


def test_checkpointed_first_layer_computes_no_input_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over frozen embeddings the first layer's projections need no input gradient; checkpointed,
    they compute none either (the anchor, not an input that requires grad, carries the graph)."""
    plain, plain_grads = _lora_backward_work(False, monkeypatch)
    checkpointed, grads = _lora_backward_work(True, monkeypatch)
    assert sorted(checkpointed) == sorted(plain)
    assert not all(plain)  # the first layer's q, k, v, gate and up: no input gradient
    for a, b in zip(grads, plain_grads, strict=True):
        assert_close(a, b, **tl.GRADS, msg="adapter gradient")


def test_checkpointed_layer_without_trainable_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """LoRA on the second layer only: the first, checkpointed layer has no parameter that needs
    a gradient and no input that requires one; the backward still runs and equals the plain."""
    only_last = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                           target_modules=list(tl.LINEAR_NAMES), layers_to_transform=[1])  # fmt: skip
    _, plain = _lora_backward_work(False, monkeypatch, only_last)
    _, checkpointed = _lora_backward_work(True, monkeypatch, only_last)
    assert plain and all(g is not None and bool(g.any()) for g in plain)
    for a, b in zip(checkpointed, plain, strict=True):
        assert_close(a, b, **tl.GRADS, msg="adapter gradient")
