"""The lean rotary embedding (rl_adapters.lean_rotary) against transformers' own functions.

Its values and gradients must equal transformers' ``apply_rotary_pos_emb`` bit for bit, in
every float dtype and layout the decoders use; it must be swapped in only where a model's
function is the standard one, restored on exit, and give a whole model's forward and backward
bit for bit as without it.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import PolicyModel
from rl_adapters.lean_rotary import (
    _crosses,
    _laid_out_like,
    _lean_for,
    lean_rotary,
    rotary_embedding,
)
from transformers.models.qwen2 import modeling_qwen2

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _inputs(dtype: torch.dtype, seed: int = 0, d: int = 16) -> tuple[torch.Tensor, ...]:
    """q [3, 4, 7, d] (transposed, as the attention layers make it), k [3, 2, 7, d], cos/sin."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 7, 4, d, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(3, 2, 7, d, generator=g).to(dtype)
    pos = torch.arange(7, dtype=torch.float64)[None].expand(3, 7) + torch.arange(3)[:, None]
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


def _run(fn: Any, q0: torch.Tensor, k0: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
    """Outputs and input gradients of ``fn`` under a loss with distinct weights per element."""
    q, k = q0.detach().clone().requires_grad_(), k0.detach().clone().requires_grad_()
    qe, ke = fn(q, k, cos, sin)
    wq = torch.linspace(-2, 3, qe.numel(), dtype=torch.float64).view(qe.shape).to(qe.dtype)
    wk = torch.linspace(1, -1, ke.numel(), dtype=torch.float64).view(ke.shape).to(ke.dtype)
    ((qe * wq).sum() + (ke * wk).sum()).backward()
    assert q.grad is not None and k.grad is not None
    return qe.detach(), ke.detach(), q.grad, k.grad


def _lean_qwen2() -> Any:
    lean = _lean_for(modeling_qwen2.apply_rotary_pos_emb)
    assert lean is not None
    return lean


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_and_gradients_equal_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    q, k, cos, sin = _inputs(dtype)
    want = _run(modeling_qwen2.apply_rotary_pos_emb, q, k, cos, sin)
    got = _run(_lean_qwen2(), q, k, cos, sin)
    for name, w, g in zip(("q_embed", "k_embed", "dq", "dk"), want, got, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        # bit-exact: the lean rotary's documented contract against transformers' function
        assert torch.equal(g, w), f"{name} ({dtype}) differs by {(g - w).abs().max()}"


def test_no_grad_and_unsqueeze_dim_2() -> None:
    q, k, cos, sin = _inputs(torch.float32, seed=3)
    q2, k2 = q.transpose(1, 2), k.transpose(1, 2)  # [N, T, heads, D]: unsqueeze_dim=2
    with torch.no_grad():
        want = modeling_qwen2.apply_rotary_pos_emb(q2, k2, cos, sin, 2)
        got = _lean_qwen2()(q2, k2, cos, sin, 2)
    # bit-exact: the lean rotary's documented contract against transformers' function
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_cos_and_sin_are_laid_out_like_x_where_they_broadcast_inside_it() -> None:
    q, k, cos, _ = _inputs(torch.float32, seed=2)  # q [3, 4, 7, 16], memory order [3, 7, 4, 16]
    per_row, shared = cos[:, None], cos[:1, None]  # [3, 1, 7, 16] and [1, 1, 7, 16]
    # over the heads of q, which lie inside its positions in memory: materialised like q
    assert _crosses(per_row, q) and _crosses(shared, q)
    for c in (per_row, shared):
        laid = _laid_out_like(c, q)
        assert laid.shape == (c.shape[0], *q.shape[1:])
        assert laid.stride() == q[: c.shape[0]].stride()
        # bit-exact: a copy of the broadcast values
        assert torch.equal(laid, c.expand(laid.shape))
    # k is contiguous [3, 2, 7, 16]: shared positions broadcast over outer dimensions only
    assert not _crosses(shared, k) and _crosses(per_row, k)
    assert not _crosses(per_row, q[:0]) and not _crosses(cos, q)  # empty batch, fewer dims


def test_gradcheck_float64() -> None:
    q, _, cos, sin = _inputs(torch.float64, seed=1, d=6)
    x = q.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: rotary_embedding(t, cos[:, None], sin[:, None]), (x,))


def test_cos_and_sin_with_gradients_take_the_plain_formula() -> None:
    q, k, cos0, sin0 = _inputs(torch.float64, seed=2)
    grads = []
    for fn in (modeling_qwen2.apply_rotary_pos_emb, _lean_qwen2()):
        cos, sin = cos0.clone().requires_grad_(), sin0.clone().requires_grad_()
        qe, ke = fn(q, k, cos, sin)
        (qe.square().sum() + ke.sum()).backward()
        grads.append((qe.detach(), cos.grad, sin.grad))
    for w, g in zip(*grads, strict=True):
        assert torch.equal(g, w)  # bit-exact: both run transformers' plain formula


def test_mixed_dtypes_and_a_partial_rotary_run_the_original() -> None:
    q, k, cos, sin = _inputs(torch.bfloat16, seed=4)
    lean = _lean_qwen2()
    want = modeling_qwen2.apply_rotary_pos_emb(q, k, cos.float(), sin.float())
    got = lean(q, k, cos.float(), sin.float())
    # bit-exact: mixed dtypes run transformers' original function itself
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want, strict=True))
    # GPT-NeoX rotates only the first cos.shape[-1] dims inside its own function
    neox = importlib.import_module("transformers.models.gpt_neox.modeling_gpt_neox")
    lean_neox = _lean_for(neox.apply_rotary_pos_emb)
    assert lean_neox is not None  # the standard formula when cos spans the whole head
    q32, k32, cos8, sin8 = _inputs(torch.float32, seed=5, d=8)
    qf, kf = torch.cat((q32, q32), dim=-1), torch.cat((k32, k32), dim=-1)  # D = 16, rotary 8
    want = neox.apply_rotary_pos_emb(qf, kf, cos8, sin8)
    got = lean_neox(qf, kf, cos8, sin8)
    # bit-exact: a partial rotary runs the original function itself
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(
    "model", ["glm", "glm4", "ernie4_5", "cohere"]
)  # partial, interleaved or otherwise different rotaries with the standard signature
def test_variants_are_left_alone(model: str) -> None:
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    assert _lean_for(module.apply_rotary_pos_emb) is None


def test_a_lean_function_is_never_wrapped_again() -> None:
    assert _lean_for(_lean_qwen2()) is None
    assert _lean_for(len) is None  # a callable without the standard signature


@pytest.mark.parametrize("bad", ["odd", "cos"])
def test_bad_shapes_name_the_argument(bad: str) -> None:
    q, _, cos, sin = _inputs(torch.float32)
    if bad == "odd":
        with pytest.raises(ValueError, match="even last dimension"):
            rotary_embedding(q[..., :15], cos[:, None, :, :15], sin[:, None, :, :15])
    else:
        with pytest.raises(ValueError, match="`cos`"):
            rotary_embedding(q, cos[:, None, :, :8], sin[:, None])


def test_swap_is_scoped_reentrant_and_restored() -> None:
    original = modeling_qwen2.apply_rotary_pos_emb
    model = tl.base("qwen2")
    with lean_rotary(model) as outer:
        assert outer == [modeling_qwen2.__name__]
        inside = modeling_qwen2.apply_rotary_pos_emb
        assert inside is not original and inside.lean_rotary_of is original  # type: ignore[attr-defined]
        with lean_rotary(model) as inner:
            assert inner == []  # already lean: the enclosing block owns the swap
        assert modeling_qwen2.apply_rotary_pos_emb is inside
    assert modeling_qwen2.apply_rotary_pos_emb is original
    with lean_rotary(model, enabled=False) as none:
        assert none == [] and modeling_qwen2.apply_rotary_pos_emb is original
    with pytest.raises(RuntimeError, match="boom"), lean_rotary(model):
        raise RuntimeError("boom")
    assert modeling_qwen2.apply_rotary_pos_emb is original


def _never(model: Any, enabled: bool = True) -> Any:
    return lean_rotary(model, enabled=False)


def _record(seen: list[Any], module: Any, *_: Any) -> None:
    seen.append(module.apply_rotary_pos_emb)


@pytest.mark.parametrize("arch", tl.ARCHS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_policy_forward_and_backward_equal_without_it(
    arch: str, checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LoRA policy's logits and adapter gradients, bit for bit with and without the swap
    (which ``PolicyModel.hidden_states`` and ``lean_lora()`` enter by themselves)."""
    import rl_adapters.policy as policy_module

    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    original = module.apply_rotary_pos_emb
    results = []
    for lean in (False, True):
        if not lean:  # the reference run: the policy's swap turned off
            monkeypatch.setattr(policy_module, "lean_rotary", _never)
        model = tl.base(arch)
        policy = PolicyModel(model, lora_config=tl.lora(), gradient_checkpointing=checkpointing)
        seen: list[Any] = []
        for layer in policy.causal_lm.model.layers:
            layer.self_attn.register_forward_pre_hook(functools.partial(_record, seen, module))
        params = policy.trainable_parameters("actor")
        tl.perturb(params, seed=1)
        ids, mask = tl.batch(tl.vocab_size(model))
        with policy.lean_lora():  # lean LoRA in both runs: only the rotary differs
            logits = policy.logits(ids, mask)
            tl.lm_loss(logits, ids, mask).backward()
        assert seen and all((f is not original) is lean for f in seen)
        results.append((logits.detach(), *[p.grad for p in params]))
        monkeypatch.undo()
    assert module.apply_rotary_pos_emb is original
    for w, g in zip(*results, strict=True):
        # bit-exact: the lean rotary's documented contract, so the whole forward and backward
        assert g is not None and w is not None and torch.equal(g, w)
