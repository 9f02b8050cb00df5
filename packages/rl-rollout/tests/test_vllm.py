"""VLLMEngine: runs only where vLLM and a CUDA GPU are present (skipped elsewhere, with why).

vLLM is never mocked. On CPU-only machines the one test that runs is the install hint.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from rl_rollout import SamplingParams, VLLMEngine, get_engine
from rl_testing.models import save_tiny, tiny_causal_lm

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_CUDA = torch.cuda.is_available()
needs_vllm = pytest.mark.skipif(
    not (HAS_VLLM and HAS_CUDA),
    reason=f"vLLM tests need vllm and CUDA (vllm installed: {HAS_VLLM}, CUDA: {HAS_CUDA}); "
    "run them with `uv sync --package rl-rollout --extra vllm` on a GPU machine",
)


def test_registered_under_vllm() -> None:
    assert get_engine("vllm") is VLLMEngine


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed: the install hint is not reachable")
def test_missing_vllm_gives_the_install_command() -> None:
    with pytest.raises(ImportError, match=r"pip install 'rl-rollout\[vllm\]'"):
        VLLMEngine("any-model")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gpu_memory_utilization": 0.0}, "`gpu_memory_utilization` must be in"),
        ({"gpu_memory_utilization": 1.5}, "`gpu_memory_utilization` must be in"),
        ({"max_num_seqs": 0}, "`max_num_seqs` must be >= 1"),
        ({"tensor_parallel_size": 0}, "`tensor_parallel_size` must be >= 1"),
        ({"truncation": "right"}, "`truncation` must be"),
    ],
)
def test_arguments_checked_before_anything_loads(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VLLMEngine("any-model", **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> VLLMEngine:
    path = Path(tmp_path_factory.mktemp("tiny"))
    model, tok = tiny_causal_lm("llama", seed=0)
    save_tiny(model, tok, path)
    return VLLMEngine(str(path), tokenizer=str(path / "tokenizer"), dtype="float32",
                      gpu_memory_utilization=0.2, max_model_len=128, enforce_eager=True)  # fmt: skip


@needs_vllm
def test_vllm_masks_groups_and_logprobs_match_the_trainer(vllm_engine: VLLMEngine) -> None:
    from rollout_testlib import assert_logprobs_close, recompute
    from transformers import AutoModelForCausalLM

    params = SamplingParams(temperature=0.7, top_k=8, max_new_tokens=8, n=2, seed=0,
                            return_logprobs=True)  # fmt: skip
    result = vllm_engine.generate(["hello", "ab"], params)
    assert result.completion_ids.shape[0] == 4
    assert result.group_index.tolist() == [0, 0, 1, 1]
    assert result.logprobs is not None
    model = AutoModelForCausalLM.from_pretrained(vllm_engine.llm.llm_engine.model_config.model)
    expected, _ = recompute(model.float(), result, params)  # float32 on CPU
    mask = result.completion_mask
    # different kernels (vLLM's CUDA attention vs eager CPU): float32 agreement, not bit-exact
    assert_logprobs_close(result.logprobs[mask], expected[mask])


@needs_vllm
def test_vllm_sleep_wake_and_weight_sync(vllm_engine: VLLMEngine) -> None:
    params = SamplingParams.eval_preset(max_new_tokens=6)
    before = vllm_engine.generate(["hello"], params)
    vllm_engine.sleep(1)
    with pytest.raises(RuntimeError, match="asleep"):
        vllm_engine.generate(["hello"], params)
    vllm_engine.wake_up()
    again = vllm_engine.generate(["hello"], params)
    assert torch.equal(before.completion_ids, again.completion_ids)  # bit-exact: integer token ids
    vllm_engine.update_weights([("lm_head.weight", torch.zeros(
        vllm_engine.vocab_size, vllm_engine.llm.llm_engine.model_config.get_hidden_size()))])  # fmt: skip
    flat = vllm_engine.generate(["hello"], params)
    assert flat.completion_ids[0, 0].item() == 0  # all-zero logits: greedy picks id 0
