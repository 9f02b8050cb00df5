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
import time
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[tinker.ServiceClient, Path]]:
    """One server for the tests below: ``(service client, checkpoint directory)``."""
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker-checkpoints")
    with running_server(write_tiny(root / "model"), root / "checkpoints") as (url, _):
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        yield service, root / "checkpoints"
        service.close("success").result()


def logprobs(client: tinker.TrainingClient) -> torch.Tensor:
    out = client.forward([datum()], "cross_entropy").result()
    return torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist())


def meta_file(checkpoints: Path, path: str) -> Path:
    return checkpoints.joinpath(*path.removeprefix("tinker://").split("/"), "checkpoint.json")


def test_save_state_keeps_an_existing_checkpoint_unless_overwrite(
    served: tuple[tinker.ServiceClient, Path],
) -> None:
    service, _ = served
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    path = client.save_state("kept").result().path
    saved = logprobs(client)
    step_then_logprobs(client)
    with pytest.raises(tinker.RequestFailedError, match=r"exists already: pass `overwrite=True`"):
        client.save_state("kept").result()
    # bit-exact: the refused save left the checkpoint's weights (same inputs and kernels)
    assert torch.equal(logprobs(service.create_training_client_from_state(path).result()), saved)
    assert client.save_state("kept", overwrite=True).result().path == path
    stepped = logprobs(client)
    # bit-exact: now the checkpoint holds the stepped weights
    assert torch.equal(logprobs(service.create_training_client_from_state(path).result()), stepped)


def test_user_metadata_and_ttl_seconds_are_kept(served: tuple[tinker.ServiceClient, Path]) -> None:
    service, checkpoints = served
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    path = client.save_state("meta", ttl_seconds=3600, user_metadata={"run": "a"}).result().path
    meta = json.loads(meta_file(checkpoints, path).read_text())
    assert meta["user_metadata"] == {"run": "a"}
    assert meta["expires_at"] > time.time()  # an hour from the save
    service.create_training_client_from_state(path).result()  # not expired: loads
    meta["expires_at"] = time.time() - 1  # as if the hour had passed
    meta_file(checkpoints, path).write_text(json.dumps(meta))
    with pytest.raises(tinker.RequestFailedError, match=r"expired \(its `ttl_seconds` ran out\)"):
        service.create_training_client_from_state(path).result()
    with pytest.raises(tinker.RequestFailedError, match=r"`ttl_seconds` must be an integer >= 1"):
        client.save_state("no-ttl", ttl_seconds=0).result()
    sampler_path = client.save_weights_for_sampler("s", user_metadata={"k": "v"}).result().path
    assert json.loads(meta_file(checkpoints, sampler_path).read_text())["user_metadata"] == {
        "k": "v"
    }


def test_load_state_drops_the_gradients_accumulated_before_it(
    served: tuple[tinker.ServiceClient, Path],
) -> None:
    service, _ = served
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    step_then_logprobs(client)
    path = client.save_state("grads").result().path
    saved = logprobs(client)
    client.forward_backward([datum()], "cross_entropy").result()  # a gradient, then a load
    client.load_state(path).result()
    client.optim_step(ADAM).result()  # no gradient since the load: AdamW leaves the weights
    # bit-exact: the loaded weights, untouched by the gradient of the replaced ones
    assert torch.equal(logprobs(client), saved)


def test_a_broken_checkpoint_is_a_one_line_user_error(
    served: tuple[tinker.ServiceClient, Path],
) -> None:
    service, checkpoints = served
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    sampler_path = client.save_weights_for_sampler("broken").result().path
    meta_file(checkpoints, sampler_path).with_name("adapter.safetensors").unlink()
    # answered at once with the reason (a server error here was retried by the SDK for a minute)
    with pytest.raises(tinker.BadRequestError, match=r"unreadable \(.*adapter.safetensors"):
        service.create_sampling_client(model_path=sampler_path).result()
    state_path = client.save_state("broken").result().path
    meta_file(checkpoints, state_path).write_text("{not json")
    with pytest.raises(tinker.RequestFailedError, match=r"unreadable \(.*checkpoint.json") as e:
        client.load_state(state_path).result()
    assert e.value.category == types.RequestErrorCategory.User
    rank4 = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    tensors4 = meta_file(checkpoints, rank4.save_state("rank4").result().path)
    misfit = client.save_state("misfit").result().path  # rank 2 in its JSON, rank 4 tensors
    tensors4.with_name("adapter.safetensors").replace(
        meta_file(checkpoints, misfit).with_name("adapter.safetensors")
    )
    before = logprobs(client)
    with pytest.raises(tinker.RequestFailedError, match="do not fit this adapter") as e:
        client.load_state(misfit).result()
    assert e.value.category == types.RequestErrorCategory.User
    assert torch.equal(logprobs(client), before)  # bit-exact: nothing was copied
    with pytest.raises(tinker.RequestFailedError, match=r"`optimizer` 'dimuon' is not served"):
        service.create_training_client_from_state(
            client.save_state("fine").result().path, optimizer=types.DimuonOptimizerConfig()
        ).result()
    assert logprobs(client).shape == (len(TOKENS) - 1,)  # the server still serves


def test_a_checkpoint_of_another_base_model_is_refused(tmp_path: Path) -> None:
    os.environ["TINKER_TELEMETRY"] = "0"
    checkpoints = tmp_path / "checkpoints"
    with running_server(write_tiny(tmp_path / "model"), checkpoints) as (url, _):
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
        state_path = client.save_state("mine").result().path
        sampler_path = client.save_weights_for_sampler("mine").result().path
        service.close("success").result()
    # another model of the same shapes, so that its LoRA tensors would fit
    with running_server(write_tiny(tmp_path / "other", seed=1), checkpoints, "other") as (url, _):
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        other = service.create_lora_training_client(base_model="other", rank=2).result()
        error = f"is a LoRA of base model '{MODEL}'; this server serves 'other'"
        with pytest.raises(tinker.RequestFailedError, match=error):
            other.load_state(state_path).result()
        with pytest.raises(tinker.RequestFailedError, match=error):
            service.create_training_client_from_state(state_path, base_model="other").result()
        with pytest.raises(tinker.BadRequestError, match=error):
            service.create_sampling_client(model_path=sampler_path).result()
        service.close("success").result()


def test_a_save_cut_short_keeps_the_checkpoint_it_replaces(
    served: tuple[tinker.ServiceClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the adapter file was written (here the optimizer file's write raises,
    as a full disk would), or a kill between the swap's two renames, never costs the previous
    checkpoint of that name."""
    import rl_train.tinker.checkpoints as ckpt

    service, checkpoints = served
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    step_then_logprobs(client)  # an optimizer state to save
    path = client.save_state("crash").result().path
    saved = logprobs(client)
    step_then_logprobs(client)
    write = ckpt.save_tensors

    def full_disk(tensors: dict[str, torch.Tensor], file: Path) -> None:
        if file.name == "optimizer.safetensors":
            raise OSError(28, "No space left on device")
        write(tensors, file)

    monkeypatch.setattr(ckpt, "save_tensors", full_disk)
    with pytest.raises(tinker.RequestFailedError, match="No space left on device"):
        client.save_state("crash", overwrite=True).result()
    monkeypatch.undo()
    # bit-exact: the previous checkpoint's weights, loaded by the same kernels
    assert torch.equal(logprobs(service.create_training_client_from_state(path).result()), saved)
    target = meta_file(checkpoints, path).parent
    target.rename(target.parent / f".{target.name}.old")  # killed between the two renames
    # bit-exact: the set-aside checkpoint is taken back at the next read
    assert torch.equal(logprobs(service.create_training_client_from_state(path).result()), saved)
    assert client.save_state("crash", overwrite=True).result().path == path
    assert sorted(p.name for p in target.parent.iterdir() if "crash" in p.name) == ["crash"]
