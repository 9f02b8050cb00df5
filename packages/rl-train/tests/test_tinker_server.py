"""``rl-train tinker-server`` driven by the official, unmodified ``tinker`` SDK.

One server per module, on a tiny random qwen2 saved with its tokenizer to a temporary
directory: a LoRA client learns with ``cross_entropy`` + ``optim_step``, its sampling client's
log-probs equal the training client's ``forward`` on the same tokens, two clients on the one
base leave each other's adapter alone, and bad requests fail with the SDK's own errors while
the server keeps serving.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tinker  # the rl-train[tinker] extra, in rl-train's test group
import torch
from rl_testing.models import TINY_DEFAULTS
from rl_testing.tolerance import assert_close
from tinker import types
from tinker_testlib import KEY, MODEL, running_server, write_tiny

TOKENS = [3, 5, 7, 9, 11, 13, 15, 17, 19, 21]
#: float32 forwards by two routes (cached decoding vs one batched forward): the longest sum is
#: the MLP's, chained over the layers and the head's log-softmax.
LOGPROB_TOL = {
    "reduction": TINY_DEFAULTS["intermediate_size"],
    "stages": TINY_DEFAULTS["num_hidden_layers"] + 1,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object, Path]]:
    root = tmp_path_factory.mktemp("tinker")
    os.environ["TINKER_TELEMETRY"] = "0"  # the SDK would post its telemetry to the server
    model_dir = write_tiny(root / "model")
    with running_server(model_dir, root / "checkpoints") as (url, app):
        yield url, app, root


@pytest.fixture(scope="module")
def service(server: tuple[str, object, Path]) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=server[0], api_key=KEY)
    yield client
    client.close("success").result()  # stops the SDK's heartbeats before the server goes


def sft_datum(tokens: list[int] = TOKENS) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def forward_logprobs(client: tinker.TrainingClient, tokens: list[int]) -> torch.Tensor:
    out = client.forward([sft_datum(tokens)], "cross_entropy").result()
    return torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist())


def test_cross_entropy_learns_and_samples_match_a_forward(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    info = client.get_info()
    assert info.model_data.tokenizer_id.endswith("tokenizer")
    losses = []
    for _ in range(5):
        fb = client.forward_backward([sft_datum()], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        losses.append(fb.metrics["loss:sum"])
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    # the returned log-probs are the loss's terms: loss:sum = -sum(logprobs) with weights 1
    fb = client.forward([sft_datum()], "cross_entropy").result()
    logprobs = torch.tensor(fb.loss_fn_outputs[0]["logprobs"].tolist(), dtype=torch.float64)
    assert_close(torch.tensor(fb.metrics["loss:sum"]), -logprobs.sum(), reduction=len(TOKENS))

    sampler = client.save_weights_and_get_sampling_client().result()
    prompt = [3, 5, 7]
    result = sampler.sample(
        types.ModelInput.from_ints(prompt), 3, types.SamplingParams(max_tokens=6, seed=0)
    ).result()
    assert len(result.sequences) == 3
    for seq in result.sequences:
        assert 1 <= len(seq.tokens) <= 6
        full = prompt + list(seq.tokens)
        expected = forward_logprobs(client, full)[len(prompt) - 1 :]
        assert_close(torch.tensor(seq.logprobs), expected, **LOGPROB_TOL, msg="sample logprobs")


def test_sampling_is_seeded_and_the_snapshot_is_fixed(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=5, seed=7, temperature=0.7, top_k=20, top_p=0.9)
    prompt = types.ModelInput.from_ints([4, 6, 8])
    first = sampler.sample(prompt, 2, params).result()
    client.forward_backward([sft_datum()], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=0.1)).result()
    again = sampler.sample(prompt, 2, params).result()  # same snapshot, same seed
    for a, b in zip(first.sequences, again.sequences, strict=True):
        assert list(a.tokens) == list(b.tokens)
        # bit-exact: the same snapshot, seed, kernels and inputs in the same order
        assert torch.equal(torch.tensor(a.logprobs), torch.tensor(b.logprobs))


def adapter_tensors(server: tuple[str, object, Path], model_id: str) -> dict[str, torch.Tensor]:
    base = server[1].state.service.base  # type: ignore[attr-defined]
    adapter = base.client(model_id).adapter
    return {k: v.detach().clone() for k, v in base.adapter_params(adapter).items()}


def test_two_clients_train_concurrently_without_touching_each_other(
    service: tinker.ServiceClient, server: tuple[str, object, Path]
) -> None:
    a = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    b = service.create_lora_training_client(base_model=MODEL, rank=8).result()
    adam = types.AdamParams(learning_rate=1e-2)
    for client in (a, b):  # both have trained adapters (LoRA B is zero at creation)
        client.forward_backward([sft_datum()], "cross_entropy").result()
        client.optim_step(adam).result()
    b_before = forward_logprobs(b, TOKENS)
    b_tensors = adapter_tensors(server, b.model_id)
    a_before = forward_logprobs(a, TOKENS)
    # a trains while b's requests are in flight: the futures overlap on the server's queue
    pending = []
    for _ in range(3):
        pending.append(a.forward_backward([sft_datum(TOKENS[::-1])], "cross_entropy"))
        pending.append(b.forward([sft_datum()], "cross_entropy"))
        pending.append(a.optim_step(adam))
    results = [f.result() for f in pending]
    for out in results[1::3]:  # b's forwards between a's steps
        # bit-exact: b's adapter, inputs and kernels are the same as for b_before
        assert torch.equal(torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist()), b_before)
    # bit-exact: b's tensors were not written (a's optimizer holds only a's)
    assert all(torch.equal(v, b_tensors[k]) for k, v in adapter_tensors(server, b.model_id).items())
    # bit-exact: the same forward of b as above, after all of a's steps
    assert torch.equal(forward_logprobs(b, TOKENS), b_before)
    assert not torch.equal(forward_logprobs(a, TOKENS), a_before)  # a did change


def test_bad_inputs_fail_with_the_sdks_errors_and_the_server_keeps_serving(
    service: tinker.ServiceClient, server: tuple[str, object, Path]
) -> None:
    url = server[0]
    stranger = tinker.ServiceClient(base_url=url, api_key="tml-wrong-key")
    with pytest.raises(tinker.AuthenticationError, match="invalid API key"):
        stranger.create_lora_training_client(base_model=MODEL, rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="unknown base_model 'no-such-model'"):
        service.create_lora_training_client(base_model="no-such-model", rank=2).result()
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    ragged = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:-1], "weights": [1.0] * (len(TOKENS) - 1)},
    )
    with pytest.raises(tinker.RequestFailedError, match=r"target_tokens'\] has shape \[8\]"):
        client.forward_backward([ragged], "cross_entropy").result()
    for loss in ("stable_reinforce", "custom"):
        with pytest.raises(tinker.RequestFailedError, match=f"loss_fn '{loss}'.*not supported"):
            client.forward_backward([sft_datum()], loss).result()
    with pytest.raises(tinker.RequestFailedError, match=r"needs loss_fn_inputs\['logprobs'\]") as e:
        client.forward_backward([sft_datum()], "importance_sampling").result()
    assert e.value.category == types.RequestErrorCategory.User
    sampler = client.save_weights_and_get_sampling_client().result()
    limit = TINY_DEFAULTS["max_position_embeddings"]
    with pytest.raises(tinker.RequestFailedError, match=f"exceeds the context length {limit}"):
        sampler.sample(
            types.ModelInput.from_ints([3, 5]), 1, types.SamplingParams(max_tokens=limit)
        ).result()
    # the server still trains and samples
    fb = client.forward_backward([sft_datum()], "cross_entropy").result()
    assert fb.metrics["loss:sum"] > 0
    out = sampler.sample(types.ModelInput.from_ints([3]), 1, types.SamplingParams(max_tokens=2))
    assert len(out.result().sequences[0].tokens) >= 1


def test_tokenizer_prompt_logprobs_and_refused_sampling_extras(
    service: tinker.ServiceClient,
) -> None:
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    prompt = client.get_tokenizer().encode("12+3=")  # AutoTokenizer on get_info's tokenizer_id
    assert len(prompt) == 5
    sampler = client.save_weights_and_get_sampling_client().result()
    result = sampler.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=2, stop=["\n"]),
        include_prompt_logprobs=True,
    ).result()
    assert result.prompt_logprobs is not None and result.prompt_logprobs[0] is None
    expected = forward_logprobs(client, prompt)  # position i predicts prompt[i + 1]
    got = torch.tensor(result.prompt_logprobs[1:])
    assert_close(got, expected, **LOGPROB_TOL, msg="prompt logprobs")
    with pytest.raises(tinker.RequestFailedError, match="topk_sample_logprobs is not served"):
        sampler.sample(
            types.ModelInput.from_ints(prompt),
            1,
            types.SamplingParams(max_tokens=2),
            topk_sample_logprobs=2,
        ).result()


def test_base_model_sampling_client(service: tinker.ServiceClient) -> None:
    """A sampling client on the base model (no adapter) samples the base's distribution."""
    base = service.create_sampling_client(base_model=MODEL).result()
    result = base.sample(
        types.ModelInput.from_ints([3, 5, 7]), 1, types.SamplingParams(max_tokens=3, seed=1)
    ).result()
    fresh = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    seq = result.sequences[0]
    full = [3, 5, 7, *seq.tokens]
    expected = forward_logprobs(fresh, full)[2:]  # LoRA B starts at 0: the base's forward
    assert_close(torch.tensor(seq.logprobs), expected, **LOGPROB_TOL, msg="base sampling")


def test_bad_adam_params_are_refused_by_name_and_change_nothing(
    service: tinker.ServiceClient,
) -> None:
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    client.forward_backward([sft_datum()], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # the AdamW exists now
    before = forward_logprobs(client, TOKENS)
    bad = {
        "beta1": 1.5,
        "beta2": 1.0,
        "eps": -1.0,
        "weight_decay": -0.1,
        "grad_clip_norm": -1.0,
        "learning_rate": float("nan"),  # sent as JSON null by the SDK
    }
    for field, value in bad.items():
        client.forward_backward([sft_datum()], "cross_entropy").result()
        params = types.AdamParams(**{"learning_rate": 1e-2, field: value})
        with pytest.raises(tinker.RequestFailedError, match=f"`adam_params.{field}` must be") as e:
            client.optim_step(params).result()
        assert e.value.category == types.RequestErrorCategory.User
    # bit-exact: every refused step left the adapter as it was (same inputs and kernels)
    assert torch.equal(forward_logprobs(client, TOKENS), before)


def rl_datum(**extra: list[float]) -> types.Datum:
    n = len(TOKENS) - 1
    inputs: dict[str, list[int] | list[float]] = {
        "target_tokens": TOKENS[1:],
        "logprobs": [-1.0] * n,
        "advantages": [1.0] * n,
    }
    return types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs={**inputs, **extra}
    )


def test_loss_inputs_the_loss_does_not_read_or_non_finite_are_refused(
    service: tinker.ServiceClient,
) -> None:
    client = service.create_lora_training_client(base_model=MODEL, rank=2).result()
    n = len(TOKENS) - 1
    cases = [  # (datum, loss_fn, loss_fn_config, the error)
        (
            rl_datum(weights=[0.0] * n),
            "ppo",
            None,
            r"'ppo' does not read loss_fn_inputs\['weights'\]",
        ),
        (
            rl_datum(clip_low_threshold=[0.5] * n),
            "ppo",
            None,
            r"does not read loss_fn_inputs\['clip_low_threshold'\].*loss_fn_config",
        ),
        (
            types.Datum(
                model_input=types.ModelInput.from_ints(TOKENS[:-1]),
                loss_fn_inputs={"target_tokens": TOKENS[1:], "advantages": [1.0] * n},
            ),
            "cross_entropy",
            None,
            r"'cross_entropy' does not read loss_fn_inputs\['advantages'\]",
        ),
        (
            types.Datum(
                model_input=types.ModelInput.from_ints([3, 5]),
                loss_fn_inputs={"target_tokens": [5, 7], "weights": [float("nan"), 1.0]},
            ),
            "cross_entropy",
            None,
            r"loss_fn_inputs\['weights'\] holds NaN or infinite values \(first at position 0\)",
        ),
        (rl_datum(advantages=[float("inf")] * n), "ppo", None, r"\['advantages'\] holds NaN"),
        (
            types.Datum(
                model_input=types.ModelInput.from_ints([]),
                loss_fn_inputs={"target_tokens": [], "weights": []},
            ),
            "cross_entropy",
            None,
            r"data\[0\].model_input is empty",
        ),
        (rl_datum(), "dro", {"beta": float("inf")}, r"loss_fn_config\['beta'\] must be a finite"),
    ]
    before = forward_logprobs(client, TOKENS)
    for datum, loss_fn, config, error in cases:
        with pytest.raises(tinker.RequestFailedError, match=error) as e:
            client.forward_backward([datum], loss_fn, config).result()
        assert e.value.category == types.RequestErrorCategory.User
    client.optim_step(types.AdamParams(learning_rate=0.1)).result()  # no gradient was left
    # bit-exact: the refused requests accumulated nothing, so the step changed nothing
    assert torch.equal(forward_logprobs(client, TOKENS), before)
    gspo = rl_datum(sequence_ratio_mask=[1.0] * n)  # gspo's optional input is read
    assert client.forward_backward([gspo], "gspo").result().metrics["loss:sum"] != 0

    def custom(
        data: list[types.Datum], lps: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        advantages = [torch.tensor(d.loss_fn_inputs["advantages"].data) for d in data]
        return sum((-lp * a).sum() for lp, a in zip(lps, advantages, strict=True)), {}

    # the SDK sends a custom loss's Datum to `forward`/`cross_entropy` as target_tokens + weights
    out = client.forward_backward_custom([rl_datum()], custom).result()
    assert out.metrics["loss:sum"] != 0


def test_max_tokens_below_one_and_a_prompt_filling_the_context_are_named(
    service: tinker.ServiceClient,
) -> None:
    sampler = service.create_sampling_client(base_model=MODEL).result()
    prompt = types.ModelInput.from_ints([3, 5])
    for max_tokens in (0, -1):
        with pytest.raises(tinker.RequestFailedError, match="`max_tokens` must be >= 1"):
            sampler.sample(prompt, 1, types.SamplingParams(max_tokens=max_tokens)).result()
    limit = TINY_DEFAULTS["max_position_embeddings"]
    full = types.ModelInput.from_ints([3] * limit)
    with pytest.raises(tinker.RequestFailedError, match=f"prompt \\({limit} tokens\\) leaves no"):
        sampler.sample(full, 1, types.SamplingParams()).result()
    with pytest.raises(tinker.RequestFailedError, match="`top_k` must be >= 1, or -1"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, top_k=-5)).result()


def test_inflight_sampling_clients_follow_every_save(service: tinker.ServiceClient) -> None:
    client = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    first = client.save_weights_and_get_sampling_client(kind="inflight").result()
    snapshot = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, seed=5)
    prompt = types.ModelInput.from_ints([4, 6, 8])

    def draw(sampler: tinker.SamplingClient) -> list[tuple[list[int], list[float]]]:
        out = sampler.sample(prompt, 2, params).result()
        return [(list(s.tokens), list(s.logprobs or [])) for s in out.sequences]

    before = draw(first)
    for _ in range(3):
        client.forward_backward([sft_datum()], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=0.1)).result()
    second = client.save_weights_and_get_sampling_client(kind="inflight").result()
    # the same weights, seed and kernels: the earlier inflight client samples the new save
    assert draw(first) == draw(second) != before
    assert draw(snapshot) == before  # a snapshot client keeps the weights it was made with
    stable = client.save_weights_and_get_sampling_client(record_stability_info=True).result()
    with pytest.raises(tinker.RequestFailedError, match="`record_stability_info` is not served"):
        stable.sample(prompt, 1, params).result()


def test_an_unexpected_failure_is_a_500_the_sdk_does_not_retry(
    server: tuple[str, object, Path],
) -> None:
    """A request that breaks a route (here a list as ``model_id``, which the SDK never sends) is
    answered at once with the exception, and ``x-should-retry: false``: the SDK raises
    ``InternalServerError`` instead of sending the same request again for about a minute."""
    import asyncio

    from tinker._client import AsyncTinker

    async def post() -> None:
        client = AsyncTinker(base_url=server[0], api_key=KEY, max_retries=3)
        try:
            await client.post("/api/v1/get_info", body={"model_id": ["x"]}, cast_to=object)
        finally:
            await client.close()

    with pytest.raises(tinker.InternalServerError, match=r"failed on /api/v1/get_info \(TypeError"):
        asyncio.run(post())
    with httpx.Client(headers={"X-API-Key": KEY}) as http:
        reply = http.post(f"{server[0]}/api/v1/get_info", json={"model_id": ["x"]})
        assert (reply.status_code, reply.headers["x-should-retry"]) == (500, "false")
        # the same connection: the answer closed nothing, and the server still serves
        assert http.get(f"{server[0]}/api/v1/healthz").status_code == 200
