"""``save_state`` / ``load_state`` and ``save_weights_for_sampler`` survive a server restart.

A first server trains a LoRA client two steps, saves its state (adapter + AdamW) and sampler
weights, records what the next step and a seeded sample give, and stops. A second server on
the same checkpoint directory restores the state into a new client (``load_state_with_optimizer``
and ``create_training_client_from_state_with_optimizer``) and samples the saved weights: the
next step and the sample are bit-for-bit those of the first server. The files are safetensors
and JSON only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tinker
import torch
from safetensors.torch import load_file
from tinker import types
from tinker_testlib import KEY, MODEL, running_server, write_tiny

TOKENS = [3, 5, 7, 9, 11, 13, 15, 17]
ADAM = types.AdamParams(learning_rate=1e-2)
PROMPT = types.ModelInput.from_ints([4, 6, 8])
SAMPLING = types.SamplingParams(max_tokens=5, seed=3)


def datum() -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)},
    )


def step_then_logprobs(client: tinker.TrainingClient) -> torch.Tensor:
    client.forward_backward([datum()], "cross_entropy").result()
    client.optim_step(ADAM).result()
    out = client.forward([datum()], "cross_entropy").result()
    return torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist())


def sampled(sampler: tinker.SamplingClient) -> list[tuple[list[int], list[float]]]:
    result = sampler.sample(PROMPT, 2, SAMPLING).result()
    return [(list(s.tokens), list(s.logprobs or [])) for s in result.sequences]


def test_state_and_sampler_weights_resume_after_a_restart(tmp_path: Path) -> None:
    os.environ["TINKER_TELEMETRY"] = "0"
    model_dir = write_tiny(tmp_path / "model")
    checkpoints = tmp_path / "checkpoints"
    with running_server(model_dir, checkpoints) as (url, _):
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        client = service.create_lora_training_client(base_model=MODEL, rank=4).result()
        for _ in range(2):
            client.forward_backward([datum()], "cross_entropy").result()
            client.optim_step(ADAM).result()
        state_path = client.save_state("two-steps").result().path
        sampler_path = client.save_weights_for_sampler("two-steps").result().path
        expected_sample = sampled(service.create_sampling_client(model_path=sampler_path).result())
        expected_step = step_then_logprobs(client)
        service.close("success").result()  # stops the SDK's heartbeats before the server goes
    assert state_path.endswith("/weights/two-steps")
    assert sampler_path.endswith("/sampler_weights/two-steps")
    files = sorted(p.name for p in checkpoints.rglob("*") if p.is_file())
    assert set(files) == {"adapter.safetensors", "checkpoint.json", "optimizer.safetensors"}
    for path in checkpoints.rglob("*.safetensors"):  # readable by the safetensors library
        assert all(t.dtype in (torch.float32, torch.int64) for t in load_file(path).values())
    for path in checkpoints.rglob("*.json"):
        assert json.loads(path.read_text())["lora"]["rank"] == 4

    with running_server(model_dir, checkpoints) as (url, _):
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        resumed = service.create_lora_training_client(base_model=MODEL, rank=4).result()
        resumed.load_state_with_optimizer(state_path).result()
        # bit-exact: the same weights, AdamW moments and step, inputs and kernels
        assert torch.equal(step_then_logprobs(resumed), expected_step)
        restored = service.create_training_client_from_state_with_optimizer(state_path).result()
        assert torch.equal(step_then_logprobs(restored), expected_step)  # bit-exact: as above
        # bit-exact: the saved sampler weights, the same seed and kernels
        assert (
            sampled(service.create_sampling_client(model_path=sampler_path).result())
            == expected_sample
        )
        weights_only = service.create_lora_training_client(base_model=MODEL, rank=4).result()
        weights_only.load_state(state_path).result()
        # bit-exact: only the AdamW state differs (fresh), so equality would mean it was loaded
        assert not torch.equal(step_then_logprobs(weights_only), expected_step)
        wrong_rank = service.create_lora_training_client(base_model=MODEL, rank=2).result()
        with pytest.raises(tinker.RequestFailedError, match="rank 4"):
            wrong_rank.load_state(state_path).result()
        with pytest.raises(tinker.RequestFailedError, match="no checkpoint at"):
            wrong_rank.load_state(state_path.replace("two-steps", "missing")).result()
        service.close("success").result()
