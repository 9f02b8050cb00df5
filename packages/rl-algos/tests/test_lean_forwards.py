"""``lean_forwards``: one ``learn()`` with rl-adapters' lean forwards and without them.

``lean_forwards="auto"`` (the default) trains through the lean LoRA, rotary, RMSNorm and
SwiGLU forwards where they apply, False through peft's and transformers' own; the same agent,
seed and batch must give the same loss, gradients and updated weights (to float32 rounding).
"""

from __future__ import annotations

from typing import Any

import algos_testlib as tl
import pytest
import torch
from rl_adapters import lean_lora, lean_mlp, lean_norm, lean_rotary

#: The autograd node of each lean forward (rl_adapters), counted while a test runs.
NODES = {
    "lora": lean_lora.LoraLinearFunction,
    "rotary": lean_rotary._Rotary,
    "rms_norm": lean_norm._RMSNorm,
    "swiglu": lean_mlp._SiluMul,
}
#: "The same" updated weights and loss: float32 rounding across two decoder layers, relative.
RELATIVE = 1e-5


def _spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = dict.fromkeys(NODES, 0)
    for name, node in NODES.items():

        def counted(*args: Any, _name: str = name, _apply: Any = node.apply) -> Any:
            counts[_name] += 1
            return _apply(*args)

        monkeypatch.setattr(node, "apply", staticmethod(counted))
    return counts


def _learn(lean_forwards: Any) -> tuple[Any, float, dict[str, torch.Tensor]]:
    agent = tl.make_agent("GRPO", lean_forwards=lean_forwards)
    metrics = agent.learn(tl.make_batch().experiences())
    names = tl.trainable_names(agent)
    params = tl.named_params(agent.policy)
    return agent, float(metrics["loss"]), {n: params[n].detach().clone() for n in names}


def test_grpo_learn_is_the_same_without_lean_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    """False and "auto": the same loss, gradients and updated adapter weights (1e-5 relative);
    False runs no lean node and reports nothing swapped, "auto" runs all four."""
    counts = _spy(monkeypatch)
    plain, plain_loss, plain_params = _learn(False)
    assert counts == dict.fromkeys(NODES, 0)
    assert plain.lean_report.mode is False and plain.lean_report.swapped == ()
    assert plain.lean_forwards is False  # the config field, as agent.<field>
    lean, lean_loss, lean_params = _learn("auto")
    assert all(n > 0 for n in counts.values()), counts
    assert lean.lean_report.forwards == ("lora", "rotary", "rms_norm", "swiglu")
    assert abs(lean_loss - plain_loss) <= RELATIVE * abs(plain_loss), (lean_loss, plain_loss)
    names = tl.trainable_names(lean)
    tl.assert_grads_close(tl.agent_grads(lean.policy, names), tl.agent_grads(plain.policy, names))
    assert set(lean_params) == set(plain_params)
    for name, want in plain_params.items():
        err = float((lean_params[name] - want).abs().max())
        assert err <= RELATIVE * float(want.abs().max()), (name, err)


def test_lean_forwards_true_and_bad_values() -> None:
    """True builds on Qwen2 (something applies); anything but "auto", True, False raises naming
    the option."""
    agent = tl.make_agent("GRPO", lean_forwards=True, perturb_seed=None)
    assert agent.lean_report.mode is True
    with pytest.raises(ValueError, match="`lean_forwards` must be 'auto'"):
        tl.make_agent("GRPO", lean_forwards="on", perturb_seed=None)
