"""The lean training forwards and the role switches on every device and training dtype.

On each device (``rl_testing.devices``: CPU here, CUDA under ``pytest -m cuda`` / ``nox -s
gpu``) and dtype (``dtypes_for``: float32 on CPU; float32, bfloat16, float16 on CUDA), a LoRA
policy's logits and adapter gradients through the lean forwards (LoRA, RMSNorm, SwiGLU, rotary)
equal peft's and transformers' own forward to the dtype's rounding, the reference role gives
the base model's logits, and a checkpoint restores the device's random generator.
"""

from __future__ import annotations

from pathlib import Path

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import PolicyModel, load_checkpoint, save_checkpoint
from rl_testing.devices import DEVICES, dtypes_for
from rl_testing.tolerance import assert_close, half_accumulation

CASES = [
    pytest.param(d.values[0], dtype, marks=d.marks, id=f"{d.id}-{dtype}")
    for d in DEVICES
    for dtype in dtypes_for(d.values[0])
]
#: The longest sum behind a logit of the tiny model (its MLP's intermediate size), through its
#: two decoder layers and the head: forward, then backward for the gradients.
REDUCTION, STAGES = 128, 4


def _policy(device: str, dtype: torch.dtype) -> tuple[PolicyModel, torch.nn.Module]:
    model = tl.base("qwen2").to(device=device, dtype=dtype)
    policy = PolicyModel(model, lora_config=tl.lora(r=4, alpha=8))
    tl.perturb(policy.trainable_parameters("actor"), seed=1)  # B != 0: the delta counts
    return policy, model


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_lean_forwards_equal_peft_on_device(device: str, dtype: torch.dtype) -> None:
    policy, model = _policy(device, dtype)
    ids, mask = (t.to(device) for t in tl.batch(tl.vocab_size(model)))
    params = policy.trainable_parameters("actor")
    runs = {}
    for lean in (True, False):
        for p in params:
            p.grad = None
        with policy.lean_lora(enabled=lean):
            logits = policy.logits(ids, mask)
            tl.lm_loss(logits.float(), ids, mask).backward()
        runs[lean] = (logits.detach(), [p.grad.detach().clone() for p in params])
    (lean_logits, lean_grads), (plain_logits, plain_grads) = runs[True], runs[False]
    assert lean_logits.device.type == torch.device(device).type
    assert lean_logits.dtype == dtype
    wide = half_accumulation(dtype)  # CUDA sums half-precision values in float32
    assert_close(lean_logits, plain_logits, reduction=REDUCTION, stages=STAGES, accumulate=wide,
                 msg="logits")  # fmt: skip
    for i, (a, e) in enumerate(zip(lean_grads, plain_grads, strict=True)):
        assert torch.isfinite(a).all(), f"non-finite gradient {i}"
        assert_close(a, e, reduction=REDUCTION, stages=2 * STAGES, accumulate=wide,
                     msg=f"grad {i}")  # fmt: skip


@pytest.mark.parametrize(("device", "dtype"), CASES)
def test_reference_role_is_the_base_model_on_device(device: str, dtype: torch.dtype) -> None:
    policy, model = _policy(device, dtype)
    ids, mask = (t.to(device) for t in tl.batch(tl.vocab_size(model)))
    with torch.no_grad():
        actor = policy.logits(ids, mask)
        reference = policy.logits(ids, mask, role="reference")
        with policy.peft.disable_adapter():  # peft's own switch: the bare base model
            base = policy.logits(ids, mask)
    # bit-exact: any difference at all shows the actor's delta reached the logits
    assert not torch.equal(actor, reference), "the actor's delta must change the logits"
    assert_close(reference, base, reduction=REDUCTION, stages=STAGES,
                 accumulate=half_accumulation(dtype), msg="reference logits")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_restores_the_devices_random_state(device: str, tmp_path: Path) -> None:
    policy, _ = _policy(device, torch.float32)
    gen_device = torch.device(device)
    save_checkpoint(policy, tmp_path / "ckpt")
    after_save = torch.rand(5, device=gen_device)  # the device's default generator
    torch.manual_seed(123)  # reseeds CPU and CUDA generators alike
    load_checkpoint(policy, tmp_path / "ckpt")
    after_load = torch.rand(5, device=gen_device)
    # bit-exact: the restored generator's next draw on the same device is the saved one's
    assert torch.equal(after_load, after_save)
