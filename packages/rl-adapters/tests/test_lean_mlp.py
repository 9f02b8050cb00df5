"""The lean SwiGLU gate (rl_adapters.lean_mlp) against transformers' own MLP modules.

``silu_mul`` must equal ``silu(gate) * up`` through autograd bit for bit (values and both input
gradients) in every float dtype, save one ``[..., I]`` tensor less, be swapped in only where a
module's class computes that formula, leave everything else to the module, be restored on
exit, and give a whole LoRA policy the same logits and adapter gradients bit for bit (the
node's input gradients are autograd's, and they reach the projections in the same order).
"""

from __future__ import annotations

import importlib
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from rl_adapters.lean_mlp import _probe, lean_swiglu, silu_mul
from rl_adapters.lean_norm import _probe as _norm_probe
from rl_testing.tolerance import assert_close
from torch import nn
from torch.nn.functional import silu

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
CLASSES = (
    ("qwen2", "Qwen2"),
    ("llama", "Llama"),
    ("mistral", "Mistral"),
    ("qwen3", "Qwen3"),
)


def _config(arch: str, prefix: str, **overrides: Any) -> Any:
    module = importlib.import_module(f"transformers.models.{arch}.configuration_{arch}")
    kwargs = {
        "hidden_size": 8,
        "intermediate_size": 12,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        **overrides,
    }
    return getattr(module, f"{prefix}Config")(**kwargs)


def _mlp(arch: str, prefix: str, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    mlp = getattr(module, f"{prefix}MLP")(_config(arch, prefix, **overrides))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return mlp.to(dtype).requires_grad_(False)


def _pair(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(3 * torch.randn(shape, generator=g)).to(dtype) for _ in range(2)]


def _run(fn: Any, inputs: list[torch.Tensor], needs: tuple[bool, ...] = (True, True)) -> Any:
    """Output and the gradients of the inputs that need one, under distinct weights."""
    xs = [x.detach().clone().requires_grad_(n) for x, n in zip(inputs, needs, strict=True)]
    y = fn(*xs)
    w = torch.linspace(-2, 3, y.numel(), dtype=torch.float64).view(y.shape).to(y.dtype)
    (y * w).sum().backward()
    return y.detach(), *[x.grad for x in xs]


def _plain(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return silu(gate) * up


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_and_gradients_equal_autograd_bit_for_bit(dtype: torch.dtype) -> None:
    for shape in ((3, 7, 12), (5, 12)):
        inputs = _pair(shape, dtype)
        want, got = _run(_plain, inputs), _run(silu_mul, inputs)
        for what, w, g in zip(("values", "d_gate", "d_up"), want, got, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, what
            # bit-exact: silu_mul's documented contract against the operations it replaces
            assert torch.equal(g, w), f"{what} ({dtype}, {shape}) differ by {(g - w).abs().max()}"
    with torch.no_grad():
        gate, up = _pair((3, 7, 12), dtype, seed=1)
        assert torch.equal(silu_mul(gate, up), _plain(gate, up))  # bit-exact: the same contract


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
def test_only_the_gradients_asked_for(needs: tuple[bool, bool]) -> None:
    inputs = _pair((4, 12), torch.float32, seed=2)
    want, got = _run(_plain, inputs, needs), _run(silu_mul, inputs, needs)
    for w, g in zip(want, got, strict=True):
        assert (w is None) == (g is None)
        assert w is None or torch.equal(g, w)  # bit-exact: silu_mul's documented contract


def test_gradients_match_the_float64_derivative() -> None:
    gate, up = (x.requires_grad_() for x in _pair((6, 12), torch.float64, seed=3))
    coeff = torch.linspace(-1, 2, gate.numel(), dtype=torch.float64).view(gate.shape)
    d_gate, d_up = torch.autograd.grad(silu_mul(gate, up), [gate, up], coeff)
    gate, up = gate.detach(), up.detach()
    s = torch.sigmoid(gate)
    # elementwise (no sums): two float64 routes to the same derivative
    assert_close(d_up, coeff * gate * s, msg="d_up")
    want = coeff * up * s * (1 + gate * (1 - s))  # d(a sigma(a))/da
    assert_close(d_gate, want, msg="d_gate")


def test_one_intermediate_tensor_fewer_is_saved() -> None:
    gate, up = (x.requires_grad_() for x in _pair((4, 5, 12), torch.float32, seed=4))

    def saved_bytes(fn: Any) -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(gate, up)
        return sum(seen.values())

    full = gate.numel() * gate.element_size()
    assert saved_bytes(_plain) == 3 * full  # gate (SiLU), the activation and up (product)
    assert saved_bytes(silu_mul) == 2 * full  # gate and up


def test_autocast_mixed_dtypes_and_bad_shapes() -> None:
    gate, up = _pair((3, 12), torch.float32, seed=5)
    mixed = _run(silu_mul, [gate, up.double()])
    assert torch.equal(mixed[0], _plain(gate, up.double()))  # bit-exact: silu_mul's contract
    g = gate.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = silu_mul(g, up)
    assert type(out.grad_fn).__name__ == "MulBackward0"  # the plain operations
    with pytest.raises(ValueError, match="`gate` \\(3, 12\\) and `up` \\(3, 11\\)"):
        silu_mul(gate, up[:, :11])


def test_a_second_derivative_raises_instead_of_being_wrong() -> None:
    gate, up = (x.requires_grad_() for x in _pair((3, 12), torch.float64, seed=6))
    (d_gate,) = torch.autograd.grad(silu_mul(gate, up).sum(), gate, create_graph=True)
    with pytest.raises(RuntimeError, match=r"once_differentiable|non-differentiable|grad_fn"):
        torch.autograd.grad(d_gate.sum(), up)


@pytest.mark.parametrize(("arch", "prefix"), CLASSES)
def test_each_class_passes_the_probe_in_every_dtype(arch: str, prefix: str) -> None:
    assert _probe(_mlp(arch, prefix)) == frozenset(DTYPES)


class _SwappedRoles(nn.Module):
    """A gated MLP that activates the *up* branch: the same parts, another formula."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(8, 12), nn.Linear(8, 12)
        self.down_proj, self.act_fn = nn.Linear(12, 8), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))


def test_variants_are_left_alone() -> None:
    gelu = _mlp("llama", "Llama", hidden_act="gelu")  # GeGLU: another activation
    assert _probe(gelu) == frozenset()
    gemma = importlib.import_module("transformers.models.gemma.modeling_gemma")
    config = importlib.import_module("transformers.models.gemma.configuration_gemma")
    gemma_config = config.GemmaConfig(
        hidden_size=8, intermediate_size=12, num_attention_heads=2, num_key_value_heads=2
    )
    gemma_mlp = gemma.GemmaMLP(gemma_config)
    assert _probe(gemma_mlp) == frozenset()
    swapped = _SwappedRoles()
    assert _probe(swapped) == frozenset()
    with lean_swiglu(nn.Sequential(gelu, gemma_mlp, swapped)) as n:
        assert n == 0 and not any("forward" in m.__dict__ for m in (gelu, gemma_mlp, swapped))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_the_probes_do_not_depend_on_the_callers_grad_mode(mode: str) -> None:
    """The probe results are cached: a first block without gradients must not decide 'never'."""
    from rl_adapters import lean_mlp, lean_norm

    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    mlp = _mlp("qwen2", "Qwen2")
    norm_module = importlib.import_module("transformers.models.qwen2.modeling_qwen2")
    norm = norm_module.Qwen2RMSNorm(8).requires_grad_(False)
    with ctx:
        assert _probe(mlp) == frozenset(DTYPES)
        assert _norm_probe(norm, norm.variance_epsilon) == frozenset(DTYPES)
    lean_mlp._PROBED.clear()
    lean_norm._PROBED.clear()
    with ctx, lean_swiglu(mlp) as n_mlp, lean_norm.lean_rms_norm(norm) as n_norm:
        assert (n_mlp, n_norm) == (1, 1)
    assert len(lean_mlp._PROBED) == 1 and set(lean_mlp._PROBED.values()) == {frozenset(DTYPES)}


@pytest.mark.parametrize(("arch", "prefix"), CLASSES)
def test_swapped_module_equals_its_class_forward(arch: str, prefix: str) -> None:
    mlp = _mlp(arch, prefix)
    x = _pair((3, 5, 8), torch.float32, seed=7)[0]
    want = _run(lambda t: type(mlp).forward(mlp, t), [x], (True,))
    with lean_swiglu(mlp) as n:
        assert n == 1
        got = _run(mlp, [x], (True,))
        with torch.no_grad():
            assert torch.equal(mlp(x), want[0])  # bit-exact: the lean MLP's documented contract
    # bit-exact: the lean MLP's documented contract against the class forward
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_swap_is_scoped_reentrant_and_restored() -> None:
    tl.assert_scoped_swap(lean_swiglu, tl.base("qwen2"), "Qwen2MLP", "lean_swiglu_of")


@pytest.mark.parametrize("arch", tl.ARCHS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_policy_forward_and_backward_equal_without_it(
    arch: str, checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LoRA policy's logits and adapter gradients bit for bit with and without the swap
    (which ``PolicyModel.hidden_states`` and ``lean_lora()`` enter)."""
    (want_logits, want, plain), (got_logits, got, lean) = tl.lean_swap_arms(
        arch, checkpointing, "lean_swiglu", monkeypatch
    )
    assert "_SiluMulBackward" in lean and "SiluBackward0" not in lean, lean
    assert "_SiluMulBackward" not in plain and "SiluBackward0" in plain, plain
    assert torch.equal(got_logits, want_logits)  # bit-exact: the lean MLP's documented contract
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w), (g - w).abs().max()  # bit-exact: the same contract
