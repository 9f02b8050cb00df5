"""The engine on every device: sampled log-probs equal a float64 recomputation, seeds repeat.

``HFEngine`` on each device (``rl_testing.devices``: CPU here, CUDA under ``pytest -m cuda`` /
``nox -s gpu``): the log-probs it records while sampling equal the teacher-forced log-probs of a
float64 copy of the model on CPU to float32 rounding, and the same seed gives the same samples
(the device's own random generator, seeded by the engine).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from rl_rollout import HFEngine, RolloutResult, SamplingParams
from rl_testing.devices import DEVICES
from rollout_testlib import assert_logprobs_close, recompute, tiny

PROMPTS = ["hello", "ab", "what is 2+3?"]


def _on_cpu(result: RolloutResult) -> RolloutResult:
    moved = {
        f.name: getattr(result, f.name).cpu()
        for f in dataclasses.fields(result)
        if isinstance(getattr(result, f.name), torch.Tensor)
    }
    return dataclasses.replace(result, **moved)


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_logprobs_match_float64_on_device(device: str) -> None:
    model, tok = tiny("qwen2", seed=1)
    twin = copy.deepcopy(model).double()
    params = SamplingParams(n=3, max_new_tokens=10, seed=7, temperature=0.7, top_k=20,
                            return_logprobs=True)  # fmt: skip
    result = HFEngine(model.to(device), tok).generate(PROMPTS, params)
    assert result.logprobs is not None
    result = _on_cpu(result)
    expected, _ = recompute(twin, result, params)
    mask = result.completion_mask
    assert bool(mask.any())
    assert_logprobs_close(result.logprobs[mask], expected[mask])


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_samples_on_device(device: str) -> None:
    model, tok = tiny("qwen2", seed=1)
    engine = HFEngine(model.to(device), tok)
    params = SamplingParams(n=2, max_new_tokens=8, seed=3, temperature=1.0)
    first, second = (_on_cpu(engine.generate(PROMPTS, params)) for _ in range(2))
    other = _on_cpu(engine.generate(PROMPTS, dataclasses.replace(params, seed=4)))
    # bit-exact: the same kernels sample from the same generator state on the same inputs
    assert torch.equal(first.completion_ids, second.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)
