"""The base LLM agent: policy + engine + batching; subclasses supply advantages and the loss."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from rl_adapters import PolicyModel, load_checkpoint, save_checkpoint
from rl_kernels import fused_logprobs, fused_policy_loss
from rl_losses import Aggregation, KLKind, kl_penalty, rollout_correction
from rl_rollout import HFEngine, SamplingParams

from rl_algos.config import (
    ActionResult,
    CosineLRScheduleConfig,
    HyperparameterConfig,
    VLLMConfig,
    cosine_schedule,
)
from rl_algos.distributed import (
    deepspeed_plugin,
    gathered,
    is_main_process,
    prepare_deepspeed,
    world_size,
    zero_stage,
)

__all__ = ["Batch", "LLMAlgorithm"]

# Constructor arguments of AgileRL that have no effect here (accepted so its examples run).
_IGNORED = {
    "calc_position_embeddings": "position ids follow from right padding",
    "wrap": "models are never wrapped at construction",
    "clone": "use agent.clone()",
    "torch_compiler": "use rl-kernels' compile option",
    "reduce_memory_peak": "deprecated upstream",
    "use_memory_efficient_params": "only meaningful for colocated vLLM offload",
    "use_sequence_packing": "not implemented",
    "cast_logprobs_to_fp32": "log-probs are always reduced in fp32",
    "action_granularity": "use advantage_granularity",
}


class _IdsTokenizer:
    """Enough of a tokenizer for :class:`rl_rollout.HFEngine` when the agent only sees ids."""

    chat_template = None

    def __init__(self, pad_token_id: int, eos_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        keep = [
            i
            for i in ids
            if not skip_special_tokens or i not in (self.pad_token_id, self.eos_token_id)
        ]
        return " ".join(str(i) for i in keep)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        raise ValueError("this agent has no tokenizer: pass prompts as token ids")


@dataclass
class Batch:
    """A parsed ``learn()`` batch (``N`` rows, ``L`` tokens, ``T = L - 1`` predictions)."""

    input_ids: torch.Tensor
    """[N, L] long, right-padded."""
    attention_mask: torch.Tensor
    """[N, L] long, 1 up to each row's last real token."""
    mask: torch.Tensor
    """[N, T] bool, True where token t + 1 is an action that counts."""
    rewards: torch.Tensor
    """[N] or [N, K] float."""
    turn_ids: torch.Tensor | None
    """[N, T] long, -1 off actions, or None."""
    sampling_logprobs: torch.Tensor | None
    """[N, T] sampler log-probs at action positions, or None."""

    @property
    def num_rows(self) -> int:
        """``N``."""
        return int(self.input_ids.shape[0])

    def rows(self, index: torch.Tensor) -> dict[str, Any]:
        """The tensors of rows ``index``, as a dict."""
        out: dict[str, Any] = {
            "input_ids": self.input_ids[index],
            "attention_mask": self.attention_mask[index],
            "mask": self.mask[index],
            "turn_ids": None if self.turn_ids is None else self.turn_ids[index],
        }
        return out


def _stack(name: str, parts: Any, pad: float | int | bool, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(parts, torch.Tensor):
        if parts.dim() != 2:
            raise ValueError(
                f"`{name}` must be [N, L] (or a list of [G, L] tensors), got {tuple(parts.shape)}"
            )
        return parts.to(dtype)
    tensors = [p if p.dim() == 2 else p[None] for p in parts]
    if not tensors:
        raise ValueError(f"`{name}` is empty: the batch has no rows")
    width = max(t.shape[1] for t in tensors)
    return torch.cat(
        [torch.nn.functional.pad(t.to(dtype), (0, width - t.shape[1]), value=pad) for t in tensors]
    )


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class LLMAlgorithm:
    """Shared machinery of the LLM agents (AgileRL's constructor arguments).

    Subclasses implement :meth:`_advantages` (once per ``learn()``) and :meth:`_loss` (per
    micro-batch). The model is wrapped by :class:`rl_adapters.PolicyModel` (LoRA actor,
    frozen reference adapter, optional critic), generation goes through an
    :class:`rl_rollout.Engine`, log-probs through :func:`rl_kernels.fused_logprobs` at the
    action positions only, and all math through rl-advantages and rl-losses.

    Dropout is off: the model stays in ``eval()`` mode so that the log-probs used for the
    ratio, the reference and the gradient are those of one deterministic policy.
    """

    algo_name: ClassVar[str] = "llm"
    uses_critic: ClassVar[bool] = False
    default_group_size: ClassVar[int] = 1
    _registry: ClassVar[dict[str, type[LLMAlgorithm]]] = {}
    _init_kwargs: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        LLMAlgorithm._registry[cls.__name__] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> LLMAlgorithm:  # noqa: D102
        obj = super().__new__(cls)
        # the JSON-representable constructor arguments, saved with checkpoints for `load`
        obj._init_kwargs = {k: v for k, v in kwargs.items() if _jsonable(v)}
        return obj

    def __init__(  # noqa: PLR0912, PLR0915 - AgileRL's constructor surface
        self,
        pad_token_id: int,
        pad_token: str,
        model_name: str | None = None,
        actor_network: Any = None,
        model_config: dict[str, Any] | None = None,
        hp_config: HyperparameterConfig | None = None,
        index: int = 0,
        batch_size: int = 16,
        beta: float = 0.001,
        lr: float = 5e-7,
        clip_coef: float | tuple[float, float] | None = 0.2,
        max_grad_norm: float | None = 0.1,
        update_epochs: int = 1,
        temperature: float = 0.9,
        repetition_penalty: float = 1.0,
        top_p: float = 0.95,
        top_k: int = 50,
        min_p: float = 0.0,
        micro_batch_size_per_gpu: int | None = None,
        max_output_tokens: int | None = None,
        min_output_tokens: int | None = 0,
        max_model_len: int | None = 1024,
        hf_generate_chunk_size: int | None = None,
        lora_config: Any = None,
        cosine_lr_schedule_config: CosineLRScheduleConfig | None = None,
        accelerator: Any = None,
        device: str | torch.device = "cpu",
        use_vllm: bool = False,
        vllm_config: VLLMConfig | None = None,
        seed: int = 42,
        gradient_checkpointing: bool = False,
        use_separate_reference_adapter: bool = True,
        use_liger_loss: bool = False,
        fused_logprobs_chunk_rows: int | None = None,
        activation_offload: bool = False,
        lora_target_scope: str | None = None,
        vllm_importance_sampling_correction: bool = True,
        vllm_importance_sampling_cap: float = 2.0,
        kl_kind: KLKind = "k3",
        skip_nonfinite: bool = False,
        full_finetune: bool = False,
        stop_sequences: Sequence[str] = (),
        logit_mask: torch.Tensor | None = None,
        tokenizer: Any = None,
        **ignored: Any,
    ) -> None:
        unknown = sorted(set(ignored) - set(_IGNORED))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {unknown}")
        for name, value in (("batch_size", batch_size), ("update_epochs", update_epochs)):
            if value < 1:
                raise ValueError(f"`{name}` must be >= 1, got {value}")
        if micro_batch_size_per_gpu is not None and micro_batch_size_per_gpu < 1:
            raise ValueError(
                f"`micro_batch_size_per_gpu` must be >= 1, got {micro_batch_size_per_gpu}"
            )
        if lr < 0 or beta < 0:
            raise ValueError(f"`lr` and `beta` must be >= 0, got lr={lr}, beta={beta}")
        if temperature <= 0:
            raise ValueError(
                f"`temperature` must be > 0 (it divides the training logits), got {temperature}"
            )
        if isinstance(clip_coef, tuple) and not (
            len(clip_coef) == 2 and 0 < clip_coef[0] < 1 < clip_coef[1]
        ):
            raise ValueError(
                f"a tuple `clip_coef` must be absolute ratio bounds (lo < 1 < hi), got {clip_coef}"
            )
        if actor_network is None and model_name is None:
            raise ValueError("pass `actor_network` (a transformers model) or `model_name`")
        self.index = index
        self.batch_size = batch_size
        self.beta = beta
        self.lr = lr
        self.clip_coef = clip_coef
        self.max_grad_norm = max_grad_norm
        self.update_epochs = update_epochs
        self.temperature = temperature
        self.repetition_penalty = repetition_penalty
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.micro_batch_size_per_gpu = micro_batch_size_per_gpu
        self.max_output_tokens = max_output_tokens
        self.min_output_tokens = min_output_tokens or 0
        self.max_model_len = max_model_len
        self.pad_token_id = int(pad_token_id)
        self.pad_token = pad_token
        self.hp_config = hp_config
        self.cosine_lr_schedule_config = cosine_lr_schedule_config
        self.accelerator = accelerator
        self._zero_stage = zero_stage(accelerator)
        self._ds_engine: Any = None
        self._warned_ds_optimizer = False
        self.seed = seed
        self.use_liger_loss = use_liger_loss
        self.fused_logprobs_chunk_rows = fused_logprobs_chunk_rows
        self.vllm_importance_sampling_correction = vllm_importance_sampling_correction
        self.vllm_importance_sampling_cap = vllm_importance_sampling_cap
        self.kl_kind = kl_kind
        self.skip_nonfinite = skip_nonfinite
        self.stop_sequences = tuple(stop_sequences)
        self.logit_mask = logit_mask
        self.model_name = model_name
        self.use_vllm = use_vllm
        self.vllm_config = vllm_config
        self.device = torch.device(accelerator.device if accelerator is not None else device)
        self._init_args = {
            "lora_config": lora_config,
            "gradient_checkpointing": gradient_checkpointing,
            "activation_offload": activation_offload,
            "lora_target_scope": lora_target_scope,
            "use_separate_reference_adapter": use_separate_reference_adapter,
        }
        reference_mode: Any = (
            ("copy" if beta > 0 else None)
            if full_finetune
            else ("adapter" if use_separate_reference_adapter else "base")
        )
        if full_finetune and self._critic_adapter():
            raise ValueError("full_finetune=True is not supported with a critic (LLMPPO): use LoRA")
        if actor_network is None:
            self.policy = PolicyModel.from_pretrained(
                str(model_name),
                model_config=model_config,
                lora_config=lora_config,
                reference=reference_mode,
                critic=self._critic_adapter(),
                gradient_checkpointing=gradient_checkpointing,
                activation_offload=activation_offload,
                lora_target_scope=lora_target_scope or "language",
                seed=seed,
                full_finetune=full_finetune,
            )
        else:
            self.policy = PolicyModel(
                actor_network,
                lora_config=lora_config,
                reference=reference_mode,
                critic=self._critic_adapter(),
                gradient_checkpointing=gradient_checkpointing,
                activation_offload=activation_offload,
                lora_target_scope=lora_target_scope or "language",  # type: ignore[arg-type]
                seed=seed,
                full_finetune=full_finetune,
            )
        self.policy.to(self.device)
        self.policy.eval()
        config = self.policy.causal_lm.config
        eos = getattr(self.policy.causal_lm.generation_config, "eos_token_id", None)
        eos = eos if eos is not None else getattr(config, "eos_token_id", None)
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_id = int(eos_ids[0]) if eos_ids else self.pad_token_id
        self.stop_token_ids = tuple(int(e) for e in eos_ids[1:])
        self.tokenizer = tokenizer or _IdsTokenizer(self.pad_token_id, self.eos_token_id)
        self.engine = HFEngine(
            self.policy.causal_lm,
            self.tokenizer,
            max_model_len=max_model_len,
            prompts_per_batch=hf_generate_chunk_size,
        )
        if use_vllm and model_name is None:
            raise ValueError(
                "use_vllm=True needs `model_name` (a hub name or path): vLLM loads the model "
                "itself, and the trained weights are pushed to it after every learn()"
            )
        self._vllm_lora_dir: str | None = None
        if use_vllm:  # pragma: no cover - needs vLLM and CUDA
            from rl_rollout import VLLMEngine

            cfg = vllm_config or VLLMConfig()
            self.engine = VLLMEngine(  # type: ignore[assignment]
                str(model_name),
                max_model_len=cfg.max_model_len or max_model_len,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                max_num_seqs=cfg.max_num_seqs,
                tensor_parallel_size=cfg.tensor_parallel_size,
                enable_sleep_mode=cfg.sleep_mode,
                enable_lora=True,
            )
        self._rng = random.Random(seed)
        self._torch_rng = torch.Generator().manual_seed(seed)
        self.steps = 0
        self.reference_updates = 0
        self.fitness: list[float] = []
        self.scores: list[float] = []
        self.mutation_history: list[dict[str, Any]] = []
        self._broadcast_weights()
        self._build_optimizers()

    def _critic_adapter(self) -> bool:
        """Whether the policy needs a critic LoRA adapter and value head (rl-adapters)."""
        return self.uses_critic

    # -- optimisation state ----------------------------------------------------------------------

    def actor_parameters(self) -> list[torch.nn.Parameter]:
        """The trainable actor parameters (LoRA weights, or the whole model)."""
        return self.policy.trainable_parameters("actor")

    def _build_optimizers(self) -> None:
        self.optimizer = torch.optim.AdamW(self.actor_parameters(), lr=self.lr, weight_decay=0.0)
        self.lr_scheduler = (
            cosine_schedule(self.optimizer, self.cosine_lr_schedule_config)
            if self.cosine_lr_schedule_config is not None
            else None
        )

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for opt in self._optimizers() for g in opt.param_groups for p in g["params"]]

    # -- generation ----------------------------------------------------------------------------

    def _group_size(self, training: bool) -> int:
        return self.default_group_size if training else 1

    def sampling_params(self, training: bool = True) -> SamplingParams:
        """The sampling settings of ``get_action`` (training) or evaluation (greedy)."""
        max_new = self.max_output_tokens or max(1, (self.max_model_len or 1024) // 2)
        if self.stop_sequences and isinstance(self.tokenizer, _IdsTokenizer):
            raise ValueError("`stop_sequences` need a real tokenizer: pass `tokenizer=`")
        if not training:
            return SamplingParams.eval_preset(
                max_new_tokens=max_new,
                min_new_tokens=min(self.min_output_tokens, max_new),
                stop_token_ids=self.stop_token_ids,
                stop=self.stop_sequences,
                logit_mask=self.logit_mask,
            )
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            max_new_tokens=max_new,
            min_new_tokens=min(self.min_output_tokens, max_new),
            stop_token_ids=self.stop_token_ids,
            n=self._group_size(True),
            seed=self._rng.randrange(2**31),
            return_logprobs=True,
            stop=self.stop_sequences,
            logit_mask=self.logit_mask,
        )

    def get_action(
        self,
        obs: Sequence[dict[str, Any]] | dict[str, Any],
        training: bool = True,
        repeat_prompts: bool = True,
        **kwargs: Any,
    ) -> ActionResult:
        """Generate completions for prompt dicts (``input_ids`` [1, P], ``attention_mask``).

        With ``training``, ``group_size`` samples per prompt (GRPO; one with
        ``repeat_prompts=False``) with the training sampling settings; otherwise one greedy
        completion. Returns per prompt ``[G, P + T]`` sequences
        and ``[G, P + T - 1]`` action masks (see :class:`~rl_algos.ActionResult`).
        """
        prompts = [obs] if isinstance(obs, dict) else list(obs)
        if not prompts:
            raise ValueError("`obs` is empty: pass at least one prompt dict")
        ids: list[list[int]] = []
        for i, p in enumerate(prompts):
            if "input_ids" not in p:
                raise ValueError(f"prompt {i} has no 'input_ids' (keys: {sorted(p)})")
            row = torch.as_tensor(p["input_ids"]).reshape(-1)
            am = p.get("attention_mask")
            if am is not None:
                row = row[torch.as_tensor(am).reshape(-1).bool()]
            ids.append(row.tolist())
        self._deepspeed()
        params = self.sampling_params(training)
        if not repeat_prompts:  # rows are already expanded trajectories: one sample each
            params = dataclasses.replace(params, n=1)
        with torch.no_grad():
            result = self.engine.generate(ids, params)
        n = params.n
        completion_ids, action_masks, logps = [], [], []
        for b, prompt in enumerate(ids):
            rows = slice(b * n, (b + 1) * n)
            comp, cmask = result.completion_ids[rows], result.completion_mask[rows]
            P = len(prompt)
            seq = torch.cat([torch.tensor(prompt).expand(n, P), comp], dim=1)
            amask = torch.cat([torch.zeros(n, P - 1, dtype=torch.bool), cmask], dim=1)
            completion_ids.append(seq)
            action_masks.append(amask)
            if result.logprobs is not None:
                logps.append(torch.cat([torch.zeros(n, P - 1), result.logprobs[rows]], dim=1))
        return ActionResult(
            completion_ids,
            action_masks,
            logps or None,
            extra={"finish_reasons": result.finish_reasons, "texts": result.texts},
        )

    # -- log-probs -----------------------------------------------------------------------------

    def _logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        role: str = "actor",
    ) -> torch.Tensor:
        """[N, T] log-probs of tokens 1..L-1 at ``mask`` positions (0 elsewhere).

        Under ZeRO-3 every process runs the output projection (it gathers the weights, a
        collective) even when its rows are empty or not finite.
        """
        hidden = self.policy.hidden_states(input_ids, attention_mask, role=role)[:, :-1]
        targets = input_ids[:, 1:]
        out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        if not bool(mask.any()) and self._zero_stage != 3:
            return out + 0.0 * hidden.sum()  # keeps the graph connected
        rows = hidden[mask]
        finite = bool(torch.isfinite(rows).all())
        if not finite:  # a NaN loss, handled (raise or skip) by the step guard
            rows = rows.nan_to_num(0.0, 0.0, 0.0)
        if self._zero3_trainable_head():
            picked = self._logprobs_by_module(rows, targets[mask])
        else:
            weight, bias = self._head()  # a collective under ZeRO-3: also for empty rows
            picked = rows.new_zeros(0)
            if rows.shape[0]:
                fused = fused_logprobs(
                    rows,
                    weight,
                    targets[mask],
                    bias=bias,
                    temperature=self.temperature,
                    chunk_rows=self.fused_logprobs_chunk_rows,
                )
                assert isinstance(fused, torch.Tensor)
                picked = fused
        if not finite:
            return out.masked_fill(mask, math.nan) + 0.0 * picked.sum()
        out = out.masked_scatter(mask, picked.float())
        return out + 0.0 * hidden.sum() if rows.shape[0] == 0 else out  # graph stays connected

    def _zero3_trainable_head(self) -> bool:
        head = [self.policy.lm_head_weight, self.policy.lm_head_bias]
        return self._zero_stage == 3 and any(p is not None and p.requires_grad for p in head)

    def _head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([V, H], [V] or None)``: the output projection for the fused kernels.

        Under ZeRO-3 the (frozen) weights are partitioned: a gathered copy is returned, which
        the kernels keep for their backward.
        """
        weight, bias = self.policy.lm_head_weight, self.policy.lm_head_bias
        if self._zero_stage != 3:
            return weight, bias
        with gathered([weight, bias], enabled=True):
            return weight.detach().clone(), None if bias is None else bias.detach().clone()

    def _logprobs_by_module(self, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[M] log-probs through the output-embedding module, chunked (ZeRO-3, trainable head).

        ZeRO-3 partitions a trainable ``lm_head`` and gathers it only inside the module's own
        forward hooks, which also route its gradient back to the partitions; the fused kernel,
        which reads the weight directly, cannot. Each chunk materialises ``[chunk, V]`` logits.
        """
        head = self.policy.causal_lm.get_output_embeddings()
        chunk = self.fused_logprobs_chunk_rows or 1024
        parts = []
        for s in range(0, max(1, rows.shape[0]), chunk):  # also empty: the gather is collective
            logits = head(rows[s : s + chunk]).float() / self.temperature
            parts.append(logits.log_softmax(-1).gather(-1, targets[s : s + chunk, None])[:, 0])
        return torch.cat(parts)

    # -- learn ---------------------------------------------------------------------------------

    def _parse(self, experiences: Any, turn_ids: Any = None, sampling_logps: Any = None) -> Batch:
        if isinstance(experiences, dict):
            experiences = (
                experiences["completion_ids"],
                experiences["action_masks"],
                experiences["rewards"],
            )
        if len(experiences) != 3:
            raise ValueError("`experiences` must be (completion_ids, action_masks, rewards)")
        comp, masks, rewards = experiences
        ids = _stack("completion_ids", comp, self.pad_token_id, torch.long).to(self.device)
        mask = _stack("action_masks", masks, False, torch.bool).to(self.device)
        N, L = ids.shape
        if mask.shape != (N, L - 1):
            raise ValueError(
                f"`action_masks` has shape {tuple(mask.shape)} but completion_ids "
                f"{tuple(ids.shape)} "
                f"needs [N, L - 1] = {(N, L - 1)}: position t marks token t + 1"
            )
        if not bool(mask.any()):
            raise ValueError("`action_masks` has no True entry: there is nothing to learn from")
        r = torch.as_tensor(rewards, dtype=torch.float32).to(self.device)
        if r.dim() == 2 and r.shape[0] * r.shape[1] == N and r.shape[0] != N:
            r = r.reshape(N)
        if r.shape[0] != N or r.dim() not in (1, 2):
            raise ValueError(
                f"`rewards` has shape {tuple(r.shape)}; expected [N] = [{N}], [B, G] with "
                f"B*G = {N}, "
                f"or per-turn [N, K] = [{N}, K]"
            )
        if not bool(torch.isfinite(r).all()):
            raise ValueError("`rewards` contains NaN or inf: fix the reward function")
        real = ids != self.pad_token_id
        real[:, 1:] |= mask
        last = torch.where(real, torch.arange(L, device=ids.device), torch.zeros_like(ids)).amax(1)
        attention = (torch.arange(L, device=ids.device)[None] <= last[:, None]).long()
        tids = None
        if turn_ids is not None:
            tids = torch.as_tensor(turn_ids, dtype=torch.long).to(self.device)
            if tids.shape != mask.shape:
                raise ValueError(
                    f"`turn_ids` has shape {tuple(tids.shape)}, action_masks {tuple(mask.shape)}"
                )
            tids = tids.masked_fill(~mask, -1)
        samp = None
        if sampling_logps is not None:
            samp = self._sampling_logprobs(sampling_logps, mask)
        return Batch(ids, attention, mask, r, tids, samp)

    def _sampling_logprobs(self, value: Any, mask: torch.Tensor) -> torch.Tensor | None:
        if isinstance(value, torch.Tensor) and value.shape == mask.shape:
            return value.to(mask.device, torch.float32)
        if not isinstance(value, torch.Tensor) and all(
            isinstance(v, torch.Tensor) and v.dim() == 2 for v in value
        ):  # get_action's per-prompt [G, L - 1] blocks
            stacked = _stack("sampling_logps", value, 0.0, torch.float32).to(mask.device)
            if stacked.shape != mask.shape:
                raise ValueError(
                    f"`sampling_logps` stacks to {tuple(stacked.shape)}, action_masks are "
                    f"{tuple(mask.shape)}"
                )
            return stacked
        rows = list(value)
        if len(rows) != mask.shape[0]:
            raise ValueError(f"`sampling_logps` has {len(rows)} rows for {mask.shape[0]} sequences")
        if any(r is None for r in rows):
            return None
        out = torch.zeros(mask.shape, device=mask.device)
        for n, row in enumerate(rows):
            r = torch.as_tensor(row, dtype=torch.float32).reshape(-1)
            k = int(mask[n].sum())
            if r.numel() == mask.shape[1]:
                out[n] = r.to(out.device)
            elif r.numel() == k:
                out[n][mask[n]] = r.to(out.device)
            else:
                raise ValueError(
                    f"`sampling_logps`[{n}] has {r.numel()} values for {k} action tokens"
                )
        return out

    def _advantages(
        self, batch: Batch, old: torch.Tensor, ref: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _loss(
        self, mb: dict[str, Any], lp: torch.Tensor, norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def _finish_loss(
        self,
        pg: Any,
        lp: torch.Tensor,
        ref: torch.Tensor | None,
        mask: torch.Tensor,
        aggregation: Aggregation,
        normalizer: float,
        max_length: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Policy loss + ``beta`` x KL(pi || ref) (:func:`rl_losses.kl_penalty`), with metrics."""
        m = pg.metrics()
        info: dict[str, Any] = {
            "pg_loss": float(pg.loss.detach()),
            "clip_fraction": m.get("clip_frac_low", 0.0) + m.get("clip_frac_high", 0.0),
            "approx_kl": m.get("approx_kl", 0.0),
            "entropy": float(-(lp.detach() * mask).sum() / mask.sum().clamp(min=1)),
        }
        loss: torch.Tensor = pg.loss
        if ref is not None and self.beta > 0:
            kl = kl_penalty(
                lp,
                ref,
                mask,
                kind=self.kl_kind,
                coef=self.beta,
                aggregation=aggregation,
                normalizer=normalizer,
                max_length=max_length,
            )
            loss = loss + kl.loss
            info["kl"] = kl.metrics()["kl_mean"]
        return loss, info

    def _fused_spec(self, mb: dict[str, Any], norm: dict[str, float]) -> dict[str, Any] | None:
        """Subclass hook: ``fused_policy_loss`` arguments for this loss, or None (plain path)."""
        return None

    def _fused_extra(
        self, mb: dict[str, Any], norm: dict[str, float]
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """Subclass hook: loss terms outside the policy kernel (PPO's value loss)."""
        return None, {}

    def _fused_loss(
        self, mb: dict[str, Any], norm: dict[str, float], spec: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The policy loss by :func:`rl_kernels.fused_policy_loss` (``use_liger_loss=True``).

        The chunked kernel projects only the valid tokens and computes the gradient in its
        forward, so the ``[N, T, V]`` logits never exist; it equals the plain path (value and
        gradient) to float32 rounding.
        """
        ids, mask = mb["input_ids"], mb["mask"]
        hidden = self.policy.hidden_states(ids, mb["attention_mask"])[:, :-1]
        ref = mb["ref"] if (mb["ref"] is not None and self.beta > 0) else None
        weight, bias = self._head()
        out = fused_policy_loss(
            hidden,
            weight,
            ids[:, 1:],
            mask,
            mb["advantages"],
            old_logprobs=mb["old"],
            ref_logprobs=ref,
            bias=bias,
            temperature=self.temperature,
            kl_coef=self.beta if ref is not None else 0.0,
            kl_kind=self.kl_kind,
            is_weights=mb.get("is_weights"),
            chunk_rows=self.fused_logprobs_chunk_rows,
            **spec,
        )
        info: dict[str, Any] = {
            "pg_loss": float(out.policy_loss.detach()),
            "clip_fraction": float(out.clip_frac_low + out.clip_frac_high),
            "approx_kl": float(out.approx_kl),
            "kl": float(out.kl_loss.detach()) / self.beta if ref is not None else 0.0,
        }
        loss = out.loss
        extra, extra_info = self._fused_extra(mb, norm)
        if extra is not None:
            loss = loss + extra
        info.update(extra_info)
        return loss, info

    def _normalizers(self, mask: torch.Tensor) -> dict[str, float]:
        """Global denominators of one minibatch (summed over processes)."""
        counts = torch.tensor(
            [float(mask.sum()), float(mask.any(1).sum())], dtype=torch.float64, device=mask.device
        )
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(counts)
        return {"tokens": max(1.0, float(counts[0])), "sequences": max(1.0, float(counts[1]))}

    def learn(
        self,
        experiences: Any,
        turn_ids: torch.Tensor | None = None,
        sampling_logps: Any = None,
    ) -> dict[str, float]:
        """One update from ``(completion_ids, action_masks, rewards)``; returns metrics.

        ``update_epochs`` passes over the batch in shuffled minibatches of ``batch_size``
        rows, each accumulated over micro-batches of ``micro_batch_size_per_gpu`` rows with
        global normalisers (the summed micro-batch losses equal the minibatch loss).

        Raises:
            ValueError: malformed experiences (shapes, NaN rewards, options the batch lacks).
            FloatingPointError: a non-finite loss (weights untouched), unless
                ``skip_nonfinite`` (then the step is skipped with a warning).
        """
        batch = self._parse(experiences, turn_ids, sampling_logps)
        self._check_batch(batch)
        with torch.no_grad():
            old = self._logprobs(batch.input_ids, batch.attention_mask, batch.mask)
            ref = None
            if self.beta > 0 and "reference" in self.policy.roles:
                ref = self._logprobs(batch.input_ids, batch.attention_mask, batch.mask, "reference")
            extra = self._advantages(batch, old, ref)
        if batch.sampling_logprobs is not None and self.vllm_importance_sampling_correction:
            corr = rollout_correction(
                old, batch.sampling_logprobs, batch.mask, cap=self.vllm_importance_sampling_cap
            )
            extra["is_weights"] = corr.weights
        N = batch.num_rows
        metrics: dict[str, list[float]] = {}
        for _ in range(self.update_epochs):
            order = torch.randperm(N, generator=self._torch_rng)
            for start in range(0, N, self.batch_size):
                rows = order[start : start + self.batch_size].sort().values.to(self.device)
                self._step(batch, rows, old, ref, extra, metrics)
        out = {k: sum(v) / len(v) for k, v in metrics.items() if v}
        out["loss"] = metrics["loss"][-1] if metrics.get("loss") else float("nan")
        out["mean_loss"] = sum(metrics.get("loss", [math.nan])) / max(
            1, len(metrics.get("loss", []))
        )
        out["mean_reward"] = float(
            batch.rewards.float().sum(-1).mean()
            if batch.rewards.dim() == 2
            else batch.rewards.mean()
        )
        out["mean_kl"] = out.get("kl", 0.0)
        if self.use_vllm and metrics.get("loss"):
            self._push_weights_to_engine()
        return out

    def _push_weights_to_engine(self) -> None:  # pragma: no cover - needs vLLM and CUDA
        """After an update, give the generation engine (vLLM) the trained actor.

        LoRA: the actor adapter is saved (safetensors) to a fresh directory and loaded as a
        new adapter (vLLM reads it at the next ``generate``; the previous version's directory
        is removed then). Full fine-tuning: every weight is copied by name.
        """
        if self.policy.peft is None:
            self.engine.update_weights(self.policy.causal_lm.named_parameters())
            return
        previous = self._vllm_lora_dir
        self._vllm_lora_dir = tempfile.mkdtemp(prefix="rl-algos-vllm-lora-")
        self.policy.peft.save_pretrained(self._vllm_lora_dir, selected_adapters=["actor"])
        self.engine.load_lora("actor", str(Path(self._vllm_lora_dir) / "actor"))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    @staticmethod
    def _distributed() -> bool:
        return world_size() > 1

    def _sync_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Data parallelism: sum the gradients over processes.

        Every process's loss is already divided by the global (all-reduced) token or sequence
        count, so the sum is the gradient of the global-batch loss, exactly as one process
        would compute it on the whole batch (DDP's average would need equal local batches).
        """
        if not self._distributed():
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n

    def _broadcast_weights(self, module: torch.nn.Module | None = None) -> None:
        """Start every process from rank 0's weights (of ``module``, default the policy)."""
        if not self._distributed():
            return
        module = self.policy if module is None else module
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                torch.distributed.broadcast(t.data, src=0)

    def _check_batch(self, batch: Batch) -> None:
        """Subclass hook: options the batch must support."""

    def _more_normalizers(
        self, extra: dict[str, torch.Tensor], rows: torch.Tensor
    ) -> dict[str, float]:
        """Subclass hook: further global denominators of a minibatch."""
        return {}

    def _deepspeed(self) -> Any:
        """The DeepSpeed engine, built on first use; None without DeepSpeed.

        Built lazily (first ``get_action``, ``learn`` or checkpoint call) so that subclasses
        finish their model and optimizer first. Under ZeRO-3 it partitions the weights, so
        generation runs with ``synced_gpus``.
        """
        if self._ds_engine is None and deepspeed_plugin(self.accelerator) is not None:
            if self.use_liger_loss and self._zero3_trainable_head():
                raise ValueError(
                    "use_liger_loss=True cannot train an lm_head partitioned by ZeRO-3 (full "
                    "fine-tuning): use LoRA, ZeRO-2, or use_liger_loss=False"
                )
            if self.use_vllm:
                raise ValueError("use_vllm=True is not supported with DeepSpeed yet: use DDP")
            self._ds_engine = prepare_deepspeed(
                self.accelerator,
                self.policy,
                self.optimizer,
                self.micro_batch_size_per_gpu or self.batch_size,
                self.max_grad_norm,
            )
            if self._zero_stage == 3 and world_size() > 1:
                self.engine.generate_kwargs = {"synced_gpus": True}
        return self._ds_engine

    def _all_ranks(self, flag: bool) -> bool:
        """``flag`` and-ed over processes (every rank gets the same answer)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item() == 1.0)

    def _step(  # noqa: PLR0912, PLR0915
        self,
        batch: Batch,
        rows: torch.Tensor,
        old: torch.Tensor,
        ref: torch.Tensor | None,
        extra: dict[str, torch.Tensor],
        metrics: dict[str, list[float]],
    ) -> None:
        ds = self._deepspeed()
        mask = batch.mask[rows]
        if "keep" in extra:  # rows filtered out of the loss leave the denominators too
            mask = mask & extra["keep"][rows][:, None]
        norm = self._normalizers(mask)
        norm.update(self._more_normalizers(extra, rows))
        micro = self.micro_batch_size_per_gpu or len(rows)
        starts = range(0, len(rows), micro)
        for opt in self._optimizers():
            opt.zero_grad(set_to_none=True)
        total: float = 0.0
        parts: dict[str, float] = {}
        for s in starts:
            idx = rows[s : s + micro]
            mb = batch.rows(idx)
            mb["old"] = old[idx]
            mb["ref"] = None if ref is None else ref[idx]
            mb["rows"] = idx
            for k, v in extra.items():
                mb[k] = v[idx]
            self.policy.eval()
            if ds is not None and hasattr(ds.optimizer, "clear_backward_seen_flag"):
                # what DeepSpeedEngine.forward does first: the micro-step bookkeeping that
                # makes ZeRO accumulate (not overwrite) gradients across micro-batches
                ds.optimizer.clear_backward_seen_flag()
            spec = self._fused_spec(mb, norm) if self.use_liger_loss else None
            value = math.nan
            if spec is not None:
                loss, info = self._fused_loss(mb, norm, spec)
                value = float(loss.detach())
            else:
                lp = self._logprobs(mb["input_ids"], mb["attention_mask"], mb["mask"])
                if bool(torch.isfinite(lp[mb["mask"]]).all()):  # else the loss would raise
                    loss, info = self._loss(mb, lp, norm)
                    value = float(loss.detach())
            ok = math.isfinite(value)
            if ds is not None:  # DeepSpeed reduces inside backward: all ranks agree first
                ok = self._all_ranks(ok)
            if not ok:
                total = math.nan  # the guard below raises or skips; nothing is applied
                break
            if ds is not None:
                ds.set_gradient_accumulation_boundary(s == starts[-1])
                # DeepSpeed averages over ranks; the loss already has global denominators
                ds.backward(loss * world_size(), scale_wrt_gas=False)
            elif self.accelerator is not None:
                self.accelerator.backward(loss)
            else:
                loss.backward()
            total += value
            weight = float(mb["mask"].sum()) / norm["tokens"]
            for k, v in info.items():
                parts[k] = parts.get(k, 0.0) + float(v) * weight
        if ds is not None:
            grad_norm = math.nan
            if math.isfinite(total):  # every rank agreed on every micro-batch
                ds.step()
                value = ds.get_global_grad_norm()
                grad_norm = float(value) if value is not None else math.nan
            else:
                ds.zero_grad()
                ds.optimizer.zero_grad(set_to_none=True)
                self._nonfinite(total, grad_norm, metrics)
                return
        else:
            params = self._trainable()
            self._sync_gradients(params)
            finite = self._all_ranks(math.isfinite(total))
            grad_norm = float("nan")
            if finite and self.max_grad_norm is not None:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
            elif finite:
                grads = [p.grad.detach().norm() for p in params if p.grad is not None]
                grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
            if not finite or not math.isfinite(grad_norm):
                for opt in self._optimizers():
                    opt.zero_grad(set_to_none=True)
                self._nonfinite(total, grad_norm, metrics)
                return
            for opt in self._optimizers():
                opt.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.steps += 1
        metrics.setdefault("loss", []).append(total)
        metrics.setdefault("grad_norm", []).append(grad_norm)
        for k, value in parts.items():
            metrics.setdefault(k, []).append(value)

    def _nonfinite(self, total: float, grad_norm: float, metrics: dict[str, list[float]]) -> None:
        """A step whose loss or gradient is not finite: raise, or warn and skip it."""
        message = (
            f"non-finite loss or gradient at optimizer step {self.steps} of "
            f"{type(self).__name__} (loss={total}, grad_norm={grad_norm}); the weights "
            "were not updated"
        )
        if not self.skip_nonfinite:
            raise FloatingPointError(message + ". Pass skip_nonfinite=True to skip such steps")
        warnings.warn(message + "; step skipped", RuntimeWarning, stacklevel=4)
        metrics.setdefault("skipped_steps", []).append(1.0)

    # -- evaluation ------------------------------------------------------------------------------

    def test(self, env: Any, loop: int = 1) -> torch.Tensor:
        """Mean reward of greedy completions on ``env``'s test split over ``loop`` batches.

        Works with ``rl_envs.ReasoningGym`` (inside its ``eval_mode``); the score is
        appended to :attr:`fitness`.
        """
        rewards: list[torch.Tensor] = []
        with env.eval_mode():
            prompts = env.reset()
            for _ in range(loop):
                completion_ids, _ = self.get_action(prompts, training=False)
                prompts, r = env.step(completion_ids)
                rewards.append(r.float().mean())
        fitness = torch.stack(rewards).mean()
        self.fitness.append(float(fitness))
        return fitness

    # -- reference, checkpoints, clones --------------------------------------------------------

    def set_reference_policy(self, reference_update_tracker: int) -> None:
        """Copy the actor onto the reference when the tracker moved (e.g. a new dataset pass)."""
        if reference_update_tracker > self.reference_updates:
            if self.policy.reference_mode in ("adapter", "copy"):
                self.policy.sync_reference()
            self.reference_updates = reference_update_tracker

    def _state(self) -> dict[str, Any]:
        return {
            "algo": self.algo_name,
            "class": type(self).__name__,
            "index": self.index,
            "steps": self.steps,
            "reference_updates": self.reference_updates,
            "fitness": self.fitness,
            "scores": self.scores,
            "lr": self.lr,
            "beta": self.beta,
            "mutation_history": self.mutation_history,
            "python_rng": list(self._rng.getstate()[1]),
            "python_rng_pos": self._rng.getstate()[2],
            "torch_rng": self._torch_rng.get_state().tolist(),
            "init_kwargs": self._init_kwargs,
        }

    def _saved_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters a checkpoint holds: adapters and heads (LoRA) or all (full)."""
        return [
            p
            for n, p in self.policy.named_parameters()
            if self.policy.peft is None or "lora_" in n or "value_head" in n
        ]

    def _optimizer_for_checkpoint(self, wanted: bool) -> torch.optim.Optimizer | None:
        if wanted and self._deepspeed() is not None:
            if self._warned_ds_optimizer:
                return None
            self._warned_ds_optimizer = True
            warnings.warn(
                "optimizer state is not saved or loaded under DeepSpeed (its partitions are "
                "per-rank); a resumed run restarts AdamW's moments",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        return self.optimizer if wanted else None

    def save_checkpoint(
        self, path: str | Path, lora_only: bool = True, save_optimizer: bool = True
    ) -> Path:
        """Save adapters (safetensors), optimizer/scheduler and agent state (JSON) atomically.

        Distributed, every process must call it (ZeRO-3 gathers the weights) and process 0
        writes. Under DeepSpeed the optimizer state is not saved (a warning says so).
        """
        del lora_only  # adapters are always what is saved in LoRA mode
        optimizer = self._optimizer_for_checkpoint(save_optimizer)
        with gathered(self._saved_parameters(), enabled=self._zero_stage == 3):
            if is_main_process():
                save_checkpoint(
                    self.policy,
                    path,
                    optimizer=optimizer,
                    scheduler=self.lr_scheduler if save_optimizer else None,
                    state=self._state(),
                )
        if self._distributed():
            torch.distributed.barrier()
        return Path(path)

    def load_checkpoint(self, path: str | Path, load_optimizer: bool = True) -> None:
        """Restore what :meth:`save_checkpoint` wrote (loading never executes code).

        Under DeepSpeed every process loads the weights (ZeRO-3 partitions process 0's copy)
        and DeepSpeed's fp32 master weights are refreshed from them; optimizer state is not
        loaded.
        """
        ds = self._deepspeed()
        if load_optimizer and not (Path(path) / "optimizer.json").is_file():
            warnings.warn(
                f"{path} holds no optimizer state (saved under DeepSpeed or with "
                "save_optimizer=False): AdamW starts from fresh moments",
                RuntimeWarning,
                stacklevel=2,
            )
            load_optimizer = False
        optimizer = self._optimizer_for_checkpoint(load_optimizer)
        params = self._saved_parameters()
        with gathered(params, enabled=self._zero_stage == 3, modifier_rank=0):
            state = load_checkpoint(
                self.policy,
                path,
                optimizer=optimizer,
                scheduler=self.lr_scheduler if load_optimizer else None,
            )
        if ds is not None:
            ds.optimizer.refresh_fp32_params()
        self._load_state(state)

    @classmethod
    def load(
        cls,
        path: str | Path,
        actor_network: Any = None,
        device: str | torch.device = "cpu",
        accelerator: Any = None,
        **overrides: Any,
    ) -> LLMAlgorithm:
        """Rebuild an agent from a checkpoint: its class and constructor arguments, then weights.

        The checkpoint holds the adapters (or the full weights) but not the base model: pass
        ``actor_network`` (a fresh base) unless the agent was built from ``model_name``.
        Arguments that are not JSON (``lora_config``, ``tokenizer``, ``hp_config``) come back
        through ``overrides``.
        """
        state_file = Path(path) / "state.json"
        if not state_file.is_file():
            raise ValueError(f"{path} is not an agent checkpoint (no state.json)")
        state = json.loads(state_file.read_text())
        klass = LLMAlgorithm._registry.get(str(state.get("class")), cls)
        if not issubclass(klass, cls):
            raise ValueError(f"{path} holds a {klass.__name__}, not a {cls.__name__}")
        kwargs = {**state.get("init_kwargs", {}), **overrides}
        for name in ("actor_network", "device", "accelerator"):
            kwargs.pop(name, None)
        if actor_network is None and kwargs.get("model_name") is None:
            raise ValueError(
                "pass `actor_network` (a fresh base model): checkpoints hold adapters, not the base"
            )
        agent = klass(actor_network=actor_network, device=device, accelerator=accelerator, **kwargs)
        agent.load_checkpoint(path)
        return agent

    def _load_state(self, state: dict[str, Any]) -> None:
        self.index, self.steps = int(state["index"]), int(state["steps"])
        self.reference_updates = int(state["reference_updates"])
        self.fitness, self.scores = list(state["fitness"]), list(state["scores"])
        self.mutation_history = list(state["mutation_history"])
        self._rng.setstate((3, tuple(int(x) for x in state["python_rng"]), state["python_rng_pos"]))
        self._torch_rng.set_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))

    def clone(self, index: int | None = None) -> LLMAlgorithm:
        """An independent copy: its own adapters, optimizer state and RNGs.

        In LoRA mode the frozen base weights are shared with this agent (not copied); with
        ``full_finetune`` the whole model is copied.
        """
        if self._ds_engine is not None or deepspeed_plugin(self.accelerator) is not None:
            raise ValueError(
                "clone() and population() are not supported under DeepSpeed (ZeRO owns one "
                "model and optimizer per process): use DDP or a single process for HPO"
            )
        twin = copy.copy(self)
        twin.policy = copy.deepcopy(self.policy, self._shared_base_memo())
        twin.engine = HFEngine(
            twin.policy.causal_lm,
            self.tokenizer,
            max_model_len=self.engine.max_model_len,
            prompts_per_batch=self.engine.prompts_per_batch,
        )
        twin._rng = random.Random()
        twin._rng.setstate(self._rng.getstate())
        twin._torch_rng = torch.Generator().manual_seed(0)
        twin._torch_rng.set_state(self._torch_rng.get_state())
        twin.fitness, twin.scores = list(self.fitness), list(self.scores)
        twin.mutation_history = list(self.mutation_history)
        twin._build_optimizers()
        for mine, theirs in zip(self._optimizers(), twin._optimizers(), strict=True):
            theirs.load_state_dict(mine.state_dict())
        if index is not None:
            twin.index = index
        return twin

    def _shared_base_memo(self) -> dict[int, Any]:
        """``deepcopy`` memo that keeps the frozen base weights shared (LoRA mode).

        Clones then hold their own adapters (actor, reference, critic), value head and
        optimizer state, but point at the same base tensors: a population costs one base plus
        one set of adapters per member, not a full model per member.
        """
        if self.policy.peft is None:
            return {}
        memo: dict[int, Any] = {}
        for name, p in self.policy.named_parameters():
            if not p.requires_grad and ".lora_" not in name and "value_head" not in name:
                memo[id(p)] = p
        for _, b in self.policy.named_buffers():
            memo[id(b)] = b
        return memo

    @classmethod
    def population(cls, size: int, **kwargs: Any) -> list[LLMAlgorithm]:
        """``size`` agents (indices 0..size-1) built like ``cls(**kwargs)``, seeds offset."""
        if size < 1:
            raise ValueError(f"`size` must be >= 1, got {size}")
        first = cls(**kwargs)
        return [first] + [first.clone(index=i) for i in range(1, size)]

    def mutate_hyperparameter(self, rng: random.Random | None = None) -> dict[str, Any]:
        """Mutate one hyperparameter from ``hp_config`` and log it in :attr:`mutation_history`."""
        if self.hp_config is None:
            raise ValueError("this agent has no hp_config: nothing to mutate")
        rng = rng or self._rng
        name = self.hp_config.sample(rng)
        spec = self.hp_config.params[name]
        before = getattr(self, name)
        after = spec.mutate(float(before), rng)
        setattr(self, name, int(after) if spec.dtype is int else after)
        if name == "lr":  # the actor's parameter group (the first)
            self.optimizer.param_groups[0]["lr"] = after
        record = {"step": self.steps, "param": name, "before": before, "after": getattr(self, name)}
        self.mutation_history.append(record)
        return record
