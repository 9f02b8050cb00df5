"""The lean RMSNorm (rl_adapters.lean_norm) against transformers' own modules.

Its values and input gradients must equal transformers' RMSNorm forward bit for bit in every
float dtype; it must be swapped in only where a module's class computes that formula, leave
everything else to the module, be restored on exit, and give a whole LoRA policy the same
logits (bit for bit) and adapter gradients (to float rounding: the norm's input gradient is
one sum here, and autograd adds it to the residual stream's gradient in another order).
"""

from __future__ import annotations

import importlib
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import PolicyModel
from rl_adapters.lean_norm import _eps_name, _probe, lean_rms_norm, rms_norm
from rl_testing.tolerance import assert_close
from torch import nn

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
CLASSES = (
    ("qwen2", "Qwen2RMSNorm"),
    ("llama", "LlamaRMSNorm"),
    ("mistral", "MistralRMSNorm"),
    ("qwen3", "Qwen3RMSNorm"),
)


def _norm(arch: str, name: str, size: int = 16, dtype: torch.dtype = torch.float32) -> Any:
    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    norm = getattr(module, name)(size, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, size))
    return norm.to(dtype).requires_grad_(False)


def _run(fn: Any, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and input gradient of ``fn`` under a loss with distinct weights per element."""
    x = x0.detach().clone().requires_grad_()
    y = fn(x)
    w = torch.linspace(-2, 3, y.numel(), dtype=torch.float64).view(y.shape).to(y.dtype)
    (y * w).sum().backward()
    assert x.grad is not None
    return y.detach(), x.grad


def _x(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("arch", "name"), CLASSES)
def test_values_and_input_gradients_equal_transformers_bit_for_bit(
    arch: str, name: str, dtype: torch.dtype
) -> None:
    norm = _norm(arch, name, dtype=dtype)
    for shape in ((3, 7, 16), (2, 4, 5, 16)):  # [N, T, H] and Qwen3's per-head [N, h, T, D]
        x = _x(shape, dtype)
        want = _run(norm, x)
        got = _run(lambda t: rms_norm(t, norm.weight, norm.variance_epsilon), x)
        for what, w, g in zip(("values", "dx"), want, got, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, what
            # bit-exact: the lean norm's documented contract against the module it replaces
            assert torch.equal(g, w), f"{what} ({dtype}, {shape}) differ by {(g - w).abs().max()}"
        assert got[0].dtype == want[0].dtype


def test_mixed_dtypes_float32_weight_bfloat16_input() -> None:
    norm = _norm("qwen2", "Qwen2RMSNorm")  # float32 weight
    x = _x((3, 7, 16), torch.bfloat16, seed=4)
    want = _run(norm, x)
    got = _run(lambda t: rms_norm(t, norm.weight, norm.variance_epsilon), x)
    assert want[0].dtype == torch.float32 and want[1].dtype == torch.bfloat16
    # bit-exact: the lean norm's documented contract against the module it replaces
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_no_grad_equals_too() -> None:
    norm = _norm("llama", "LlamaRMSNorm")
    x = _x((4, 16), torch.float32, seed=2)
    with torch.no_grad():
        # bit-exact: the lean norm's documented contract against the module it replaces
        assert torch.equal(rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))


def test_input_gradient_matches_the_float64_derivative() -> None:
    """dx = r (g w) - x r^3 sum(g w x) / D, r = (mean(x^2) + eps)^(-1/2), in float64.

    (The formula computes in float32 whatever the input dtype, so gradcheck in float64 cannot
    apply; the derivative is checked against its closed form instead.)
    """
    eps = 1e-6
    w = torch.linspace(0.5, 1.5, 24)
    x = _x((5, 24), torch.float32, seed=1)
    y, dx = _run(lambda t: rms_norm(t, w, eps), x)
    g = torch.linspace(-2, 3, y.numel(), dtype=torch.float64).view(y.shape)
    x64, w64 = x.double(), w.double()
    r = (x64.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    u = g * w64
    want = r * u - x64 * r.pow(3) * (u * x64).sum(-1, keepdim=True) / x.shape[-1]
    # float32 against float64: the mean of squares and sum(g w x) over D = 24, chained
    assert_close(dx, want, reduction=x.shape[-1], stages=2, msg="dx")
    assert_close(y, w64 * x64 * r, reduction=x.shape[-1], msg="y")


def test_a_trained_weight_and_autocast_take_the_plain_formula() -> None:
    norm = _norm("qwen2", "Qwen2RMSNorm").requires_grad_(True)
    x = _x((3, 16), torch.float32, seed=3).requires_grad_()
    y = rms_norm(x, norm.weight, norm.variance_epsilon)
    assert y.grad_fn is not None and "RMSNorm" not in type(y.grad_fn).__name__
    y.sum().backward()
    want_w = norm.weight.grad
    norm.weight.grad = None
    norm(x).sum().backward()
    # bit-exact: a trained weight takes the plain formula, the module's own kernels
    assert want_w is not None and torch.equal(want_w, norm.weight.grad)
    frozen = norm.weight.detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = rms_norm(x, frozen, 1e-5)
    assert z.grad_fn is not None and "RMSNorm" not in type(z.grad_fn).__name__
    lean = rms_norm(x, frozen, 1e-5)
    assert lean.grad_fn is not None and "RMSNorm" in type(lean.grad_fn).__name__


def test_a_second_derivative_raises_instead_of_being_wrong() -> None:
    x = _x((3, 8), torch.float32, seed=6).requires_grad_()
    y = rms_norm(x, torch.linspace(0.5, 1.5, 8), 1e-6)
    (dx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dx.sum().backward()


def test_a_bad_weight_names_the_argument() -> None:
    with pytest.raises(ValueError, match="`weight`"):
        rms_norm(torch.randn(2, 8), torch.ones(4), 1e-6)


class _ClampedRMSNorm(nn.Module):  # an RMSNorm by name, another formula: not ours to replace
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x / x.abs().amax(-1, keepdim=True).clamp(min=self.variance_epsilon)


def test_variants_are_left_alone() -> None:
    gemma = _norm("gemma", "GemmaRMSNorm")  # scales by (1 + w)
    assert _eps_name(gemma) == "eps" and _probe(gemma, gemma.eps) == frozenset()
    clamped = _ClampedRMSNorm(8)
    assert _probe(clamped, 1e-6) == frozenset()
    qwen = _norm("qwen2", "Qwen2RMSNorm")
    assert _probe(qwen, qwen.variance_epsilon) == frozenset(DTYPES)
    qwen.weight.ds_id = 3  # type: ignore[attr-defined]  # a ZeRO-3 partitioned weight
    assert _eps_name(qwen) is None
    assert _eps_name(nn.LayerNorm(8)) is None
    with lean_rms_norm(nn.Sequential(gemma, clamped)) as n:
        assert n == 0 and "forward" not in gemma.__dict__


def test_swap_is_scoped_reentrant_and_restored() -> None:
    tl.assert_scoped_swap(lean_rms_norm, tl.base("qwen2"), "Qwen2RMSNorm", "lean_rms_norm_of")


@pytest.mark.parametrize("arch", tl.ARCHS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_policy_forward_and_backward_equal_without_it(
    arch: str, checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LoRA policy's logits bit for bit, and adapter gradients to float rounding, with and
    without the swap (which ``PolicyModel.hidden_states`` and ``lean_lora()`` enter)."""
    (want_logits, want, plain), (got_logits, got, lean) = tl.lean_swap_arms(
        arch, checkpointing, "lean_rms_norm", monkeypatch
    )
    assert "_RMSNormBackward" in lean and "_RMSNormBackward" not in plain
    assert "RsqrtBackward0" in plain and "RsqrtBackward0" not in lean
    assert torch.equal(got_logits, want_logits)  # bit-exact: the lean norm's documented contract
    for w, g in zip(want, got, strict=True):
        assert_close(g, w, **tl.GRADS, msg="adapter gradient")


def test_hidden_states_with_checkpointing_outside_a_lean_block() -> None:
    """Checkpointed layers recompute after ``hidden_states`` returns: no swap there, no error."""
    model = tl.base("qwen2")
    policy = PolicyModel(model, lora_config=tl.lora(), gradient_checkpointing=True)
    params = policy.trainable_parameters("actor")
    tl.perturb(params, seed=2)
    ids, mask = tl.batch(tl.vocab_size(model))
    hidden = policy.hidden_states(ids, mask)
    hidden.square().sum().backward()
    assert all(p.grad is not None for p in params)
