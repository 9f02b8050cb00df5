"""A colocated vLLM engine (``pip install 'rl-rollout[vllm]'``, CUDA only).

vLLM pins its own torch and transformers, so the extra lives in a separate fork of the
workspace lock (see the package README): install it into its own environment.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import torch

from rl_rollout._prompts import Prompts, encode_prompts
from rl_rollout.engine import register_engine
from rl_rollout.lora_sync import LoraAdapter, adapter_to_bytes
from rl_rollout.params import SamplingParams
from rl_rollout.result import RolloutResult, assemble_result

__all__ = ["VLLMEngine", "to_vllm_sampling_params"]

_INSTALL_HINT = (
    "VLLMEngine needs vLLM and a CUDA GPU: `pip install 'rl-rollout[vllm]'` (vLLM pins its own "
    "torch; use a separate environment, e.g. `uv sync --package rl-rollout --extra vllm "
    "--no-default-groups`), or use HFEngine, which runs anywhere"
)


def to_vllm_sampling_params(params: SamplingParams, vocab_size: int | None = None) -> Any:
    """Our :class:`~rl_rollout.SamplingParams` as ``vllm.SamplingParams`` (same meanings).

    ``logit_mask`` becomes ``allowed_token_ids``; ``return_logprobs`` asks for the sampled
    token's log-prob (``logprobs=0``), which the engine reports after processing
    (``logprobs_mode="processed_logprobs"``).

    Raises:
        ValueError: ``logits_processor`` is set (vLLM runs no per-request Python hooks) or
            the logit mask's length differs from ``vocab_size``.
    """
    import vllm

    if params.logits_processor is not None:
        raise ValueError(
            "`logits_processor` is not supported by VLLMEngine (vLLM takes no per-request "
            "Python hooks); use HFEngine for value-guided decoding"
        )
    allowed = None
    if params.logit_mask is not None:
        if vocab_size is not None and params.logit_mask.numel() != vocab_size:
            raise ValueError(
                f"`logit_mask` has {params.logit_mask.numel()} entries, the model's vocabulary "
                f"has {vocab_size}"
            )
        allowed = [int(i) for i in params.logit_mask.nonzero().flatten()]
    return vllm.SamplingParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        seed=params.seed,
        logprobs=0 if params.return_logprobs else None,
        allowed_token_ids=allowed,
        skip_special_tokens=True,
    )


@register_engine("vllm")
class VLLMEngine:
    """vLLM in the trainer's process, sharing its GPUs (the "colocated" or hybrid engine).

    Around each training phase call :meth:`sleep` (frees the KV cache and offloads or drops
    the weights) and :meth:`wake_up`; after each optimiser step push the new weights with
    :meth:`load_lora` (LoRA training: the adapter saved with peft's ``save_pretrained``) or
    :meth:`update_weights` (full fine-tuning: Hugging Face parameter names). Sampling
    log-probs are those of the processed distribution (vLLM's
    ``logprobs_mode="processed_logprobs"``), the same quantity :class:`~rl_rollout.HFEngine`
    records.

    Args:
        model: Model directory or hub id (vLLM loads its own copy).
        tokenizer: Tokenizer path (default: ``model``).
        max_model_len: Longest prompt + completion (default: the model's).
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (weights + KV cache);
            leave room for training when colocated (TRL's default is 0.3).
        max_num_seqs: Sequences decoded concurrently.
        tensor_parallel_size: GPUs per engine (with several, launch the trainer with
            ``torchrun`` and pass ``distributed_executor_backend="external_launcher"``).
        enable_sleep_mode: Allow :meth:`sleep` / :meth:`wake_up`.
        enable_lora: Allow :meth:`load_lora`.
        max_lora_rank: Largest LoRA rank to serve.
        dtype: Weights dtype (``"auto"``, ``"bfloat16"``, ``"float32"``, ...).
        seed: Engine seed.
        truncation: Over-long prompts: ``"error"`` (default) or ``"left"``.
        engine_kwargs: Passed to ``vllm.LLM`` as they are.
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        *,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        max_num_seqs: int = 256,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = True,
        enable_lora: bool = False,
        max_lora_rank: int = 64,
        dtype: str = "auto",
        seed: int = 0,
        truncation: Literal["error", "left"] = "error",
        **engine_kwargs: Any,
    ) -> None:
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"`gpu_memory_utilization` must be in (0, 1], got {gpu_memory_utilization}"
            )
        if max_num_seqs < 1:
            raise ValueError(f"`max_num_seqs` must be >= 1, got {max_num_seqs}")
        if tensor_parallel_size < 1:
            raise ValueError(f"`tensor_parallel_size` must be >= 1, got {tensor_parallel_size}")
        if truncation not in ("error", "left"):
            raise ValueError(f"`truncation` must be 'error' or 'left', got {truncation!r}")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        if not torch.cuda.is_available():
            raise RuntimeError(f"no CUDA device is visible. {_INSTALL_HINT}")
        # in-process engine core: weight sync then runs on the very model object, no pickling
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = vllm.LLM(
            model=model,
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tensor_parallel_size,
            enable_sleep_mode=enable_sleep_mode,
            enable_lora=enable_lora,
            max_lora_rank=max_lora_rank,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        config = self.llm.llm_engine.model_config
        self.max_model_len = int(config.max_model_len)
        self.vocab_size = int(config.get_vocab_size())
        self.truncation = truncation
        self.enable_sleep_mode = enable_sleep_mode
        self.enable_lora = enable_lora
        self.eos_id = int(self.tokenizer.eos_token_id)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(self.eos_id if pad is None else pad)
        self._lora: Any = None
        self._lora_ids = 0
        self._lora_dir: str | None = None
        self.max_lora_rank = max_lora_rank
        self.weight_version: int | None = None
        self.sleeping = False

    def generate(self, prompts: Prompts, params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` completions for each prompt; see :class:`RolloutResult`."""
        if self.sleeping:
            raise RuntimeError("the engine is asleep: call wake_up() before generate()")
        encoded = encode_prompts(
            prompts,
            self.tokenizer,
            self.max_model_len,
            params.max_new_tokens,
            self.truncation,
            vocab_size=self.vocab_size,
        )
        sampling = to_vllm_sampling_params(params, self.vocab_size)
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in encoded],
            sampling,
            use_tqdm=False,
            lora_request=self._lora,
        )
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        for request in outputs:
            for sample in sorted(request.outputs, key=lambda o: o.index):
                tokens = list(sample.token_ids)
                completions.append(tokens)
                if params.return_logprobs:
                    steps = zip(tokens, sample.logprobs, strict=True)
                    logprobs.append([step[t].logprob for t, step in steps])
        result = assemble_result(
            encoded,
            completions,
            params.n,
            pad_id=self.pad_id,
            stop_ids={self.eos_id, *params.stop_token_ids},
            stop=params.stop,
            decode=lambda t: str(self.tokenizer.decode(t, skip_special_tokens=True)),
            logprobs=logprobs if params.return_logprobs else None,
        )
        result.weight_version = self.weight_version if self._lora is not None else None
        return result

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full-weight sync: load Hugging Face-named tensors into vLLM's model.

        vLLM's ``load_weights`` maps the names (fused qkv / gate-up projections included);
        the prefix cache is reset since it holds the old weights' activations.
        """
        weights = [(name, t.detach()) for name, t in named_tensors]
        if not weights:
            raise ValueError("`named_tensors` is empty: nothing to sync")
        if self.sleeping:
            raise RuntimeError(
                "the engine is asleep: call wake_up(tags=['weights']) before update_weights()"
            )
        self.llm.apply_model(lambda model: model.load_weights(weights=weights))
        self.llm.reset_prefix_cache()

    def load_lora(self, name: str, path: str) -> None:
        """LoRA sync: generate with the peft adapter at ``path`` from now on.

        Each call registers a new adapter id, so vLLM never serves a cached older version of
        an adapter reloaded under the same name; the previous one is removed.
        """
        if not self.enable_lora:
            raise ValueError("load_lora needs VLLMEngine(..., enable_lora=True)")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise ValueError(
                f"`path` {path!r} has no adapter_config.json: pass a directory written by "
                "peft's save_pretrained"
            )
        from vllm.lora.request import LoRARequest

        previous = self._lora
        self._lora_ids += 1
        self._lora = LoRARequest(name, self._lora_ids, path)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self.llm.reset_prefix_cache()
        self.weight_version = None

    def load_adapter(
        self,
        name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        version: int,
    ) -> None:
        """Adapter-only sync from tensors (:meth:`rl_rollout.Engine.load_adapter`).

        vLLM's public API loads a LoRA adapter from a path only (``LoRARequest(name, id,
        path)``; in-memory loading exists only as a patch of its private
        ``LRUCacheWorkerLoRAManager._load_adapter`` calling ``LoRAModel.from_lora_tensors``,
        as verl does, which changes between releases). So the tensors are written once to a
        directory private to this engine, in memory where the host has ``/dev/shm``
        (``adapter_model.safetensors`` and ``adapter_config.json``, the form peft saves), and
        loaded through :meth:`load_lora`: the trainer needs no filesystem shared with the
        server, and the previous version's directory is removed.

        Raises:
            ValueError: LoRA not enabled, or a rank above ``max_lora_rank``.
        """
        if not self.enable_lora:
            raise ValueError("load_adapter needs VLLMEngine(..., enable_lora=True)")
        adapter = LoraAdapter(name, int(version), dict(config), dict(tensors))
        rank = int(adapter.config.get("r", 0))
        if rank > self.max_lora_rank:
            raise ValueError(
                f"{adapter.describe()} has rank {rank} > max_lora_rank = {self.max_lora_rank} "
                "(wrong rank): start the engine with a larger --max-lora-rank"
            )
        parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
        directory = tempfile.mkdtemp(prefix="rl-rollout-lora-", dir=parent)
        with open(os.path.join(directory, "adapter_model.safetensors"), "wb") as f:
            f.write(adapter_to_bytes(adapter))
        config_json = {k: v for k, v in adapter.config.items() if k != "peft_version"}
        with open(os.path.join(directory, "adapter_config.json"), "w") as f:
            json.dump(config_json, f, default=lambda v: sorted(v) if isinstance(v, set) else v)
        previous, self._lora_dir = self._lora_dir, directory
        self.load_lora(name, directory)
        self.weight_version = adapter.version
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory for training: level 1 offloads weights to CPU, 2 discards them."""
        if level not in (1, 2):
            raise ValueError(f"`level` must be 1 or 2, got {level}")
        if not self.enable_sleep_mode:
            raise RuntimeError("sleep needs VLLMEngine(..., enable_sleep_mode=True)")
        self.llm.sleep(level=level)
        self.sleeping = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Take the GPU memory back (``tags``: ``"weights"``, ``"kv_cache"``; None: both)."""
        self.llm.wake_up(tags=None if tags is None else list(tags))
        if tags is None or "kv_cache" in tags:
            self.sleeping = False
