"""The experts a mixture-of-experts model routes each token to while the engine samples.

``HFEngine(record_routes=True)`` records them in every forward of a generation (the prefill,
then one per fed token, through the lean loop and through ``generate``, in chunks) and lays
them out like ``RolloutResult.sequences``; a forward of the whole sequences routes the same
tokens to the same experts (where the 2nd and 3rd choice do not nearly tie: the cached
forwards round differently).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rl_rollout import HFEngine, RemoteEngine, RolloutServer, SamplingParams
from rl_rollout._wire import result_from_json, result_to_json
from rl_rollout.routes import RouteRecorder, router_modules
from rl_rollout.server import main as server_main
from rl_testing.models import tiny_causal_lm
from rl_testing.routing import assert_own_top_k, tie_gap

PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 20, 21]]


@pytest.mark.parametrize("decode", ["lean", "generate"])
@pytest.mark.parametrize("chunk", [None, 1])
def test_recorded_routes_are_a_full_forwards_own_per_token(decode: str, chunk: int | None) -> None:
    model, tok = tiny_causal_lm("qwen3_moe", seed=0)
    engine = HFEngine(model, tok, record_routes=True, decode=decode, prompts_per_batch=chunk)
    result = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=7, seed=3))
    routes, seq = result.routes, result.sequences
    assert routes is not None and routes.dtype == torch.int16
    assert routes.shape == (*seq.shape, 2, 2)  # [N, P + T, Y, k]
    # nothing ran on the prompts' left padding, nor on each row's last generated token
    fed = torch.cat([result.prompt_mask, torch.ones_like(result.completion_mask)], dim=1)
    assert bool((routes[~fed] == -1).all()) and bool((routes[:, -1] == -1).all())
    with torch.no_grad():
        out = model(seq, attention_mask=fed.long(), output_router_logits=True)
    assert_own_top_k(routes, out.router_logits, gap=tie_gap(model.config.hidden_size, 2))


def test_a_dense_model_has_no_routes_and_a_router_of_several_topk_is_refused() -> None:
    dense, tok = tiny_causal_lm("qwen2", seed=0)
    assert router_modules(dense) == []
    with pytest.raises(ValueError, match=r"record_routes=True: Qwen2ForCausalLM is not a mixture"):
        HFEngine(dense, tok, record_routes=True)
    model, _ = tiny_causal_lm("qwen3_moe", seed=0)
    recorder = RouteRecorder(model, top_k=3)  # the model routes 2 per token
    with (
        pytest.raises(RuntimeError, match=r"Qwen3MoeTopKRouter chose its experts with a torch"),
        recorder,
    ):
        model(torch.tensor([[1, 5]]))


def test_a_rollout_server_returns_the_routes_it_records() -> None:
    """``RolloutServer`` over ``HFEngine(record_routes=True)`` (``rl-rollout-server
    --record-routes``): ``/health`` says so, and each ``/generate`` answer carries the routes
    (a base64 safetensors payload), the engine's own, bit for bit."""
    model, tok = tiny_causal_lm("qwen3_moe", seed=0)
    engine = HFEngine(model, tok, record_routes=True)
    params = SamplingParams(n=2, max_new_tokens=5, seed=4)
    local = engine.generate(PROMPTS, params)
    with RolloutServer(engine) as server:
        remote = RemoteEngine(server.url, timeout=60.0)
        assert remote.health()["record_routes"] is True
        result = remote.generate(PROMPTS, params)
    assert local.routes is not None and result.routes is not None
    assert result.routes.dtype == torch.int16
    assert torch.equal(result.sequences, local.sequences)  # bit-exact: the same program
    assert torch.equal(result.routes, local.routes)  # bit-exact: indices


def test_routes_that_do_not_fit_the_result_are_refused_on_the_wire() -> None:
    model, tok = tiny_causal_lm("qwen3_moe", seed=0)
    result = HFEngine(model, tok, record_routes=True).generate(
        PROMPTS[:1], SamplingParams(max_new_tokens=3, seed=0)
    )
    assert result.routes is not None
    width = result.sequences.shape[1]  # the prompt's 5 and up to 3 sampled tokens
    short = result_to_json(dataclasses.replace(result, routes=result.routes[:, :-1]))
    with pytest.raises(ValueError, match=rf"`routes` torch.int16 \(1, {width - 1}, 2, 2\) must"):
        result_from_json(short)
    garbled = {**result_to_json(result), "routes": "not base64!"}
    with pytest.raises(ValueError, match=r"`routes` must be a base64 safetensors payload"):
        result_from_json(garbled)
    back = result_from_json(result_to_json(result))
    assert back.routes is not None
    assert torch.equal(back.routes, result.routes)  # bit-exact: indices


def test_the_command_line_records_routes_with_the_hugging_face_engine_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        server_main(["--engine", "vllm", "--model", "m", "--record-routes"])
    assert "--record-routes needs --engine hf" in capsys.readouterr().err
