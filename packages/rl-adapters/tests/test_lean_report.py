"""``PolicyModel(lean_forwards=...)``, its ``lean_report`` and the fallbacks of ``_compat``.

The lean forwards (LoRA, rotary, RMSNorm, SwiGLU) are an option: ``"auto"`` swaps them in where
their checks pass, False nowhere, True raises when they pass nowhere. The report says what was
swapped and what fell back (with the reason); a peft internal that is missing or renamed makes
its layers run peft's own forward, with a warning, never an ``AttributeError``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from peft import LoraConfig
from rl_adapters import PolicyModel, lean_mlp, lean_norm, lean_rotary
from rl_adapters import lean_lora as lean_lora_module
from rl_adapters.lean_lora import LeanLora
from rl_adapters.lean_report import LeanFallback, LeanSwap
from rl_testing.tolerance import assert_close
from transformers import GPT2Config, GPT2LMHeadModel

N_LAYERS = 2  # rl_testing's tiny models
LORA_LAYERS = N_LAYERS * len(tl.LINEAR_NAMES)


@pytest.fixture
def lean_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the calls of each lean forward's autograd node while the test runs."""
    counts: dict[str, int] = {}
    nodes = {
        "lora": lean_lora_module.LoraLinearFunction,
        "rotary": lean_rotary._Rotary,
        "rms_norm": lean_norm._RMSNorm,
        "swiglu": lean_mlp._SiluMul,
    }
    for name, node in nodes.items():
        counts[name] = 0

        def counted(*args: Any, _name: str = name, _apply: Any = node.apply) -> Any:
            counts[_name] += 1
            return _apply(*args)

        monkeypatch.setattr(node, "apply", staticmethod(counted))
    return counts


def _train_forward(policy: PolicyModel, lean: bool = True) -> tuple[torch.Tensor, list[Any]]:
    """Logits and actor gradients of one forward and backward inside ``lean_lora(lean)``."""
    params = policy.trainable_parameters("actor")
    for p in params:
        p.grad = None
    ids, mask = tl.batch(tl.vocab_size(policy.causal_lm))
    with policy.lean_lora(enabled=lean):
        logits = policy.logits(ids, mask)
        tl.lm_loss(logits, ids, mask).backward()
    return logits.detach(), [p.grad for p in params]


def _lean_modules(policy: PolicyModel) -> Iterator[int]:
    """Inside ``lean_lora()``: the LeanLora wrappers and the lean instance forwards hung."""
    modules = list(policy.causal_lm.modules())
    yield sum(isinstance(m, LeanLora) for m in modules)
    for marker in ("lean_rms_norm_of", "lean_swiglu_of"):
        yield sum(hasattr(m.__dict__.get("forward"), marker) for m in modules)


def test_report_of_a_qwen2_lora_policy(caplog: pytest.LogCaptureFixture) -> None:
    """``"auto"`` on Qwen2 with LoRA on every linear layer: all four lean forwards, with the
    counts the swaps then really hang, logged once at INFO."""
    with caplog.at_level(logging.INFO, logger="rl_adapters"):
        policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora())
    report = policy.lean_report
    assert report.mode == "auto" and report.model == "Qwen2ForCausalLM"
    assert report.swapped == (
        LeanSwap("lora", LORA_LAYERS, ("Linear",)),
        LeanSwap("rotary", 1, ("transformers.models.qwen2.modeling_qwen2",)),
        LeanSwap("rms_norm", 2 * N_LAYERS + 1, ("Qwen2RMSNorm",)),
        LeanSwap("swiglu", N_LAYERS, ("Qwen2MLP",)),
    )
    assert report.fallbacks == ()
    assert report.forwards == ("lora", "rotary", "rms_norm", "swiglu")
    with policy.lean_lora():
        assert tuple(_lean_modules(policy)) == (
            report.modules("lora"),
            report.modules("rms_norm"),
            report.modules("swiglu"),
        )
    records = [r for r in caplog.records if r.name == "rl_adapters.lean_report"]
    assert [r.levelno for r in records] == [logging.INFO]
    assert records[0].getMessage() == report.summary()
    assert "lora on 14 (Linear)" in report.summary()


def test_lean_forwards_false_enters_no_lean_forward(lean_calls: dict[str, int]) -> None:
    """False: nothing swapped, no lean node runs inside ``lean_lora()`` or ``hidden_states``, and
    the values are "auto"'s to float rounding."""
    plain = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), lean_forwards=False)
    assert plain.lean_report.swapped == () and plain.lean_report.mode is False
    assert "off" in plain.lean_report.summary()
    tl.perturb(plain.trainable_parameters("actor"), seed=1)
    logits, grads = _train_forward(plain)
    with plain.lean_lora():
        assert tuple(_lean_modules(plain)) == (0, 0, 0)
    assert lean_calls == {"lora": 0, "rotary": 0, "rms_norm": 0, "swiglu": 0}
    lean = PolicyModel(tl.base("qwen2"), lora_config=tl.lora())
    tl.perturb(lean.trainable_parameters("actor"), seed=1)
    lean_logits, lean_grads = _train_forward(lean)
    assert all(n > 0 for n in lean_calls.values()), lean_calls
    assert_close(lean_logits, logits, **tl.FORWARD)
    for got, want in zip(lean_grads, grads, strict=True):
        assert_close(got, want, **tl.GRADS)


def test_report_records_an_expected_fallback(caplog: pytest.LogCaptureFixture) -> None:
    """DoRA adapters keep peft's forward: a LoRA fallback with the variant as the reason, at
    INFO (an expected variant, not a library change); the other lean forwards still run."""
    dora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
    with caplog.at_level(logging.INFO, logger="rl_adapters"):
        policy = PolicyModel(tl.base("qwen2"), lora_config=dora, reference=None)
    report = policy.lean_report
    assert report.forwards == ("rotary", "rms_norm", "swiglu")
    (fallback,) = report.fallbacks
    assert fallback.forward == "lora" and fallback.modules == 2 * N_LAYERS
    assert "actor adapter" in fallback.reason and "Dora" in fallback.reason
    assert not fallback.unexpected
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _without_lora_bias(monkeypatch: pytest.MonkeyPatch, model: Any) -> int:
    """Delete ``lora_bias`` (a peft internal the lean LoRA reads) from every LoRA layer."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        monkeypatch.delattr(layer, "lora_bias")
    return len(layers)


def test_missing_peft_internal_falls_back_when_the_policy_is_built(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A peft release without ``LoraLayer.lora_bias`` (deleted here, after peft built the layers,
    before the policy surveys them): every LoRA layer runs peft's own forward, the report has an
    unexpected fallback naming the attribute, one warning is logged, and the values are
    peft's bit for bit (the other lean forwards are bit-equal to transformers')."""
    import peft
    from rl_adapters import _compat

    monkeypatch.setattr(_compat, "_WARNED", set())
    built = peft.get_peft_model

    def get_peft_model(*args: Any, **kwargs: Any) -> Any:
        model = built(*args, **kwargs)
        _without_lora_bias(monkeypatch, model)
        return model

    monkeypatch.setattr(peft, "get_peft_model", get_peft_model)
    with caplog.at_level(logging.INFO, logger="rl_adapters"):
        policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), reference=None)
    report = policy.lean_report
    assert report.fallbacks == (
        LeanFallback(
            "lora",
            "Linear",
            LORA_LAYERS,
            "peft internal Linear.lora_bias is missing or renamed",
            unexpected=True,
        ),
    )
    assert report.forwards == ("rotary", "rms_norm", "swiglu")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lora_bias" in warnings[0].getMessage()
    assert "peft " in warnings[0].getMessage()  # the versions
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    with caplog.at_level(logging.INFO, logger="rl_adapters"):
        lean_logits, lean_grads = _train_forward(policy, lean=True)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1  # not again
    with policy.lean_lora():
        assert next(_lean_modules(policy)) == 0  # no LeanLora hung
    logits, grads = _train_forward(policy, lean=False)
    # bit-exact: both runs are peft's LoRA forward and the same lean rotary/norm/SwiGLU nodes
    assert torch.equal(lean_logits, logits)
    for got, want in zip(lean_grads, grads, strict=True):
        assert got is not None and torch.equal(got, want)  # bit-exact: as above


def test_peft_internal_missing_after_the_report_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An internal gone after the policy was built: the lean LoRA is not hung, a warning is
    logged once however many bodies run, peft's forward computes, nothing raises."""
    from rl_adapters import _compat

    monkeypatch.setattr(_compat, "_WARNED", set())
    policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), reference=None)
    assert policy.lean_report.modules("lora") == LORA_LAYERS
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    _without_lora_bias(monkeypatch, policy.causal_lm)
    with caplog.at_level(logging.WARNING, logger="rl_adapters"):
        lean_logits, _ = _train_forward(policy, lean=True)
        _train_forward(policy, lean=True)
    (warning,) = caplog.records
    assert warning.name == "rl_adapters._compat" and "Linear.lora_bias" in warning.getMessage()
    logits, _ = _train_forward(policy, lean=False)
    assert torch.equal(lean_logits, logits)  # bit-exact: peft's LoRA forward in both runs


def test_lean_lora_reads_peft_state_through_compat(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LeanLora`` itself, on a layer whose ``scaling`` is gone: peft's forward (here the
    layer's own, patched to ignore the missing scale), no ``AttributeError``."""
    from rl_adapters import _compat

    monkeypatch.setattr(_compat, "_WARNED", set())
    policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), reference=None)
    layer = policy.lora_sites().sites[0].layer  # type: ignore[union-attr]
    wrapper = LeanLora(layer)
    x = torch.randn(2, 3, layer.in_features)
    with torch.no_grad():
        want = wrapper(x)  # the lean node (plain LoRA)
        monkeypatch.delattr(layer, "scaling")
        monkeypatch.setattr(type(layer), "forward", lambda self, x: want)
        wrapper.refresh()
        assert wrapper(x) is want  # the layer's own forward ran


def test_lean_forwards_true_raises_where_nothing_applies() -> None:
    """GPT-2 (LayerNorm, no rotary, a GELU MLP, LoRA on Conv1D): True names the option and
    the reasons; "auto" builds with nothing swapped."""
    config = GPT2Config(
        vocab_size=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=32,
        bos_token_id=1,
        eos_token_id=2,
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True)
    with pytest.raises(ValueError, match="lean_forwards=True") as info:
        PolicyModel(GPT2LMHeadModel(config), lora_config=lora, lean_forwards=True)
    message = str(info.value)
    assert "Conv1D" in message and "apply_rotary_pos_emb" in message
    assert "lean_forwards='auto'" in message
    auto = PolicyModel(GPT2LMHeadModel(config), lora_config=lora, reference=None)
    assert auto.lean_report.swapped == ()
    assert {f.forward for f in auto.lean_report.fallbacks} == {"lora", "rotary"}


def test_lean_forwards_true_builds_where_something_applies() -> None:
    """True on Qwen2 builds like "auto"."""
    policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), lean_forwards=True)
    assert policy.lean_report.mode is True
    assert policy.lean_report.forwards == ("lora", "rotary", "rms_norm", "swiglu")


@pytest.mark.parametrize("value", ["on", 1, None, "True"])
def test_bad_lean_forwards_names_the_option(value: Any) -> None:
    with pytest.raises(ValueError, match="`lean_forwards` must be 'auto'"):
        PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), lean_forwards=value)


def test_full_finetune_report_notes_trained_norms() -> None:
    """Full fine-tuning: no LoRA, the RMSNorms swapped but noted (trained weights run their own
    forward while training)."""
    policy = PolicyModel(tl.base("qwen2"), full_finetune=True, reference=None)
    report = policy.lean_report
    assert report.forwards == ("rotary", "rms_norm", "swiglu")
    (note,) = report.fallbacks
    assert note.forward == "rms_norm" and "trained weight" in note.reason


def test_report_notes_lora_dropout(lean_calls: dict[str, int]) -> None:
    """LoRA dropout p > 0: the lean LoRA serves the policy's eval-mode forwards, and a
    training-mode forward runs peft's (live dropout). Before, the report said only "lora on
    N" and the fallback at training time went unrecorded; now it notes the dropout."""
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    policy = PolicyModel(tl.base("qwen2"), lora_config=config, reference=None)
    report = policy.lean_report
    assert report.modules("lora") == 2 * N_LAYERS
    (note,) = report.fallbacks
    assert note.forward == "lora" and note.modules == 2 * N_LAYERS and not note.unexpected
    assert "lora_dropout" in note.reason and "training mode" in note.reason
    assert "lora_dropout" in report.summary()
    tl.perturb(policy.trainable_parameters("actor"), seed=1)
    _train_forward(policy)
    assert lean_calls["lora"] == 2 * N_LAYERS  # eval mode: the lean node on every layer
    policy.train()
    lean_calls["lora"] = 0
    _train_forward(policy)
    assert lean_calls["lora"] == 0  # training mode: peft's forward, with its dropout
