"""Typed configurations shared by the agents (AgileRL's names)."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from rl_losses import KLKind

__all__ = [
    "AgentConfig",
    "CosineLRScheduleConfig",
    "HyperparameterConfig",
    "RLParameter",
    "VLLMConfig",
    "config_fields",
    "cosine_schedule",
]


@dataclass(frozen=True)
class RLParameter:
    """A mutable RL hyperparameter: bounds and the multiplicative mutation step."""

    min: float
    """Smallest value a mutation may produce."""
    max: float
    """Largest value a mutation may produce."""
    shrink_factor: float = 0.8
    """Factor of a downward mutation."""
    grow_factor: float = 1.2
    """Factor of an upward mutation."""
    dtype: type = float
    """``float`` or ``int`` (ints are rounded after mutation)."""

    def __post_init__(self) -> None:
        if not self.min <= self.max:
            raise ValueError(f"RLParameter needs min <= max, got min={self.min}, max={self.max}")
        if not 0 < self.shrink_factor <= 1 <= self.grow_factor:
            raise ValueError(
                "RLParameter needs 0 < shrink_factor <= 1 <= grow_factor, got "
                f"{self.shrink_factor} and {self.grow_factor}"
            )

    def mutate(self, value: float, rng: random.Random) -> float:
        """``value`` times shrink or grow (equal odds), clipped to [min, max]."""
        factor = self.grow_factor if rng.random() < 0.5 else self.shrink_factor
        out = min(self.max, max(self.min, value * factor))
        return float(round(out)) if self.dtype is int else out


@dataclass
class HyperparameterConfig:
    """The hyperparameters evolutionary HPO may mutate, e.g. ``lr=RLParameter(1e-5, 1e-3)``."""

    params: dict[str, RLParameter] = field(default_factory=dict)
    """Name -> bounds; the names are agent attributes (``lr``, ``beta``, ``clip_coef``, ...)."""

    def __init__(self, **params: RLParameter) -> None:
        for name, p in params.items():
            if not isinstance(p, RLParameter):
                raise TypeError(f"hyperparameter {name!r} must be an RLParameter, got {type(p)}")
        self.params = dict(params)

    def names(self) -> list[str]:
        """The mutable hyperparameters."""
        return sorted(self.params)

    def sample(self, rng: random.Random) -> str:
        """A hyperparameter name chosen uniformly."""
        if not self.params:
            raise ValueError("HyperparameterConfig is empty: nothing to mutate")
        return rng.choice(self.names())


@dataclass(frozen=True)
class CosineLRScheduleConfig:
    """Cosine learning-rate decay after a linear warm-up."""

    num_epochs: int
    """Optimizer steps over which the rate decays to ``min_lr_ratio * lr``."""
    warmup_proportion: float = 0.05
    """Fraction of ``num_epochs`` spent warming up linearly from 0."""
    min_lr_ratio: float = 0.0
    """Final rate as a fraction of the peak."""

    def __post_init__(self) -> None:
        if self.num_epochs < 1:
            raise ValueError(f"`num_epochs` must be >= 1, got {self.num_epochs}")
        if not 0 <= self.warmup_proportion < 1:
            raise ValueError(f"`warmup_proportion` must be in [0, 1), got {self.warmup_proportion}")


def cosine_schedule(
    optimizer: torch.optim.Optimizer, config: CosineLRScheduleConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` implementing :class:`CosineLRScheduleConfig`."""
    warmup = int(config.num_epochs * config.warmup_proportion)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, config.num_epochs - warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(frozen=True)
class VLLMConfig:
    """Colocated vLLM settings (``use_vllm=True``); see :class:`rl_rollout.VLLMEngine`."""

    gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory vLLM may take."""
    max_num_seqs: int = 256
    """Sequences decoded concurrently."""
    tensor_parallel_size: int = 1
    """GPUs per engine."""
    sleep_mode: bool = True
    """Free vLLM's memory during training steps."""
    max_model_len: int | None = None
    """Override of the agent's ``max_model_len`` for the engine."""


@dataclass
class AgentConfig:
    """The hyperparameters every LLM agent shares (AgileRL's constructor keywords).

    The agent reads them from here; ``agent.<name>`` reads and writes the same field (so
    evolutionary HPO's mutations reach the next ``learn()``). Objects that are not
    hyperparameters (the model, tokenizer, accelerator, LoRA config) stay constructor
    arguments.
    """

    #: Fields of this class that the constructor validates (name -> rule).
    positive: ClassVar[tuple[str, ...]] = ("batch_size", "update_epochs")

    batch_size: int = 16
    """Rows per minibatch (one optimizer step each)."""
    beta: float = 0.001
    """KL(pi || ref) coefficient (0: no reference forward)."""
    lr: float = 5e-7
    """Actor learning rate (AdamW)."""
    clip_coef: float | tuple[float, float] | None = 0.2
    """Ratio clip: scalar ``c`` for ``[1 - c, 1 + c]``, or absolute ``(lo, hi)`` bounds (None: no
    clip, for ``LLMREINFORCE`` and objectives that do not clip; refused where it would clip)."""
    max_grad_norm: float | None = 0.1
    """Global gradient-norm clip (None: none)."""
    update_epochs: int = 1
    """Passes over each batch per ``learn()``."""
    temperature: float = 0.9
    """Sampling temperature; the training logits are divided by it too."""
    repetition_penalty: float = 1.0
    """Sampling repetition penalty."""
    top_p: float = 0.95
    """Nucleus sampling mass."""
    top_k: int = 50
    """Top-k sampling (0: off)."""
    min_p: float = 0.0
    """Min-p sampling (0: off)."""
    micro_batch_size_per_gpu: int | None = None
    """Rows per forward/backward (None: the whole minibatch)."""
    micro_batch_tokens: int | None = None
    """Real tokens (prompt + completion) per forward, rows packed into balanced micro-batches
    (``rl_algos.microbatch.token_budget_groups``; rows that share a prompt stay together where
    they fit), also in the no-grad scoring passes; None: no budget. A row longer than the
    budget raises. With ``micro_batch_size_per_gpu`` both limits hold."""
    use_sequence_packing: bool | None = None
    """Run each forward's rows as one packed sequence (no padding; per-row positions and
    attention, ``rl_algos.packing``). Same loss and gradients as padded, to float rounding.
    None (the default, also ``"auto"``): packed wherever the attention implementation can
    confine attention to each row and each row's tokens are one span, else padded with a
    warning (``agent.packing_report``); True: always packed (raises where it cannot);
    False: always padded."""
    share_prompt_prefix: bool | None = None
    """In a packed forward, consecutive rows that start with the same prompt (the same tokens
    before each row's first scored token: a group's completions) compute it once
    (``rl_algos.shared_prefix``): fewer tokens through every layer, the same loss and
    gradients to float rounding. None (the default, also ``"auto"``): wherever a forward runs
    packed with SDPA or eager attention and saves a token, except that rows which all have one
    length (a plain batch otherwise) share only where the work it saves (shared tokens times
    the model's per-token parameters) reaches ``rl_algos.shared_prefix.MIN_SAVED_WORK``, below
    which the layout costs more than it saves; True: wherever it saves a token, and raise where
    it cannot share (padded forwards, another attention implementation); False: never."""
    max_output_tokens: int | None = None
    """Generated tokens per completion (None: half of ``max_model_len``)."""
    min_output_tokens: int = 0
    """Tokens generated before EOS may end a completion."""
    max_model_len: int | None = 1024
    """Longest prompt + completion."""
    hf_generate_chunk_size: int | None = None
    """Prompts per ``generate`` call of the HF engine (None: all)."""
    seed: int = 42
    """Seed of the adapters' initialisation, sampling and minibatch order."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward."""
    use_separate_reference_adapter: bool = True
    """LoRA: the reference is its own frozen adapter (False: the base model)."""
    use_liger_loss: bool = False
    """Fused chunked lm_head + loss (:func:`rl_kernels.fused_policy_loss`)."""
    fused_logprobs_chunk_rows: int | None = None
    """Rows per chunk of the fused head (None: a memory budget decides)."""
    activation_offload: bool = False
    """Offload checkpointed activations to CPU."""
    lora_target_scope: str | None = None
    """Which modules LoRA targets on multimodal models (default ``"language"``)."""
    vllm_importance_sampling_correction: bool = True
    """Correct for sampler/trainer mismatch when sampling log-probs reach ``learn()``."""
    vllm_importance_sampling_cap: float = 2.0
    """Cap of the truncated importance weight (:func:`rl_losses.rollout_correction`); refused with
    the correction off."""
    clip_against_sampler: bool = False
    """Take the clipped surrogate's ratio against the sampler's log-probs (the behaviour policy
    that sampled the batch, when ``sampling_logps`` reach ``learn()``) instead of the trainer's
    own before the update (AReaL's ``use_decoupled_loss=False``): the clip then also bounds how
    far an update moves the policy from the one that sampled a stale batch, and the mismatch
    correction is off (its weights would be 1). For asynchronous runs with stale batches."""
    kl_kind: KLKind = "k3"
    """KL estimator (:func:`rl_losses.kl_estimate`) of the KL loss term; refused without one."""
    skip_nonfinite: bool = False
    """Skip a non-finite step with a warning instead of raising."""
    router_aux_loss_coef: float | None = None
    """Weight of a mixture-of-experts policy's load-balancing loss, per sequence
    (:mod:`rl_algos.router_balance`); None: the model config's ``router_aux_loss_coef`` (TRL's
    default; 0.001 for Qwen3-MoE), 0.0: off. A value > 0 is refused for a dense model."""
    router_replay: str | None = None
    """Routing replay of a mixture-of-experts policy (:mod:`rl_algos.router_replay`):
    ``"R2"`` forces, in the update's forwards, the experts each token was routed to in the
    forward that scored its old log-prob; ``"R3"`` forces the experts the sampler routed it
    to (the Hugging Face engine records them) in that forward and the update's (verl's and
    ms-swift's names); None: every forward routes afresh. Refused for a dense model."""
    full_finetune: bool = False
    """Train every weight instead of LoRA adapters."""
    stop_sequences: tuple[str, ...] = ()
    """Strings that end a completion (need a tokenizer)."""
    use_vllm: bool = False
    """Generate with a colocated vLLM engine (CUDA)."""
    lean_forwards: str | bool = "auto"
    """Where the training and scoring forwards run rl-adapters' lean LoRA, rotary, RMSNorm and
    SwiGLU forwards (``rl_adapters.PolicyModel(lean_forwards=...)``): ``"auto"`` wherever their
    checks pass (peft's and transformers' own forwards elsewhere), True the same but raise at
    construction when they pass nowhere on the model, False peft's and transformers' own
    forwards everywhere. Read when the agent is built; ``agent.lean_report`` says what they
    serve."""
    merge_lora_for_generation: bool = True
    """LoRA: sample with the actor's delta merged into new base weights (bare-model speed, one
    extra copy of the adapted weights while generating; see
    ``rl_adapters.PolicyModel.merged_for_generation``). False: through the LoRA layers."""

    def __post_init__(self) -> None:
        """Check the values (each error names the argument)."""
        self.stop_sequences = tuple(self.stop_sequences)
        self.min_output_tokens = self.min_output_tokens or 0
        for name in self.positive:
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}")
        mb = self.micro_batch_size_per_gpu
        if mb is not None and mb < 1:
            raise ValueError(f"`micro_batch_size_per_gpu` must be >= 1, got {mb}")
        self._check_packing()
        if not (self.lean_forwards == "auto" or isinstance(self.lean_forwards, bool)):
            raise ValueError(
                "`lean_forwards` must be 'auto' (lean forwards where they apply), True (the same, "
                f"and raise where none applies) or False (peft's and transformers' own), got "
                f"{self.lean_forwards!r}"
            )
        budget = self.micro_batch_tokens
        if budget is not None and (isinstance(budget, bool) or budget < 1):
            raise ValueError(
                f"`micro_batch_tokens` must be None or an int >= 1 (tokens per micro-batch, at "
                f"least the longest row), got {budget!r}"
            )
        aux = self.router_aux_loss_coef
        if aux is not None and not (isinstance(aux, int | float) and 0 <= aux < math.inf):
            raise ValueError(
                f"`router_aux_loss_coef` must be None (the model config's) or a finite float "
                f">= 0 (0: no load-balancing loss), got {aux!r}"
            )
        self._check_router_replay()
        if self.lr < 0 or self.beta < 0:
            raise ValueError(f"`lr` and `beta` must be >= 0, got lr={self.lr}, beta={self.beta}")
        if self.temperature <= 0:
            raise ValueError(
                f"`temperature` must be > 0 (it divides the training logits), got "
                f"{self.temperature}"
            )
        self._check_sampling_filters()
        c = self.clip_coef
        if isinstance(c, list):  # a tuple read back from JSON (checkpoints)
            c = (float(c[0]), float(c[1])) if len(c) == 2 else tuple(c)
            self.clip_coef = c
        if isinstance(c, tuple) and not (len(c) == 2 and 0 < c[0] < 1 < c[1]):
            raise ValueError(
                f"a tuple `clip_coef` must be absolute ratio bounds (lo < 1 < hi), got {c}"
            )

    def kl_term(self) -> bool:
        """Whether the loss has a KL term (``beta > 0``), the one ``kl_kind`` picks."""
        return self.beta > 0

    def ignored_options(self) -> dict[str, str]:
        """Fields set to a value that would change nothing for this agent: name -> the error.

        Each message names the field, says why it has no effect here and what to pass
        instead; the agent refuses the first when it is built. A field at its default is never
        listed.
        """
        out: dict[str, str] = {}
        default = {f.name: f.default for f in dataclasses.fields(self)}
        if self.kl_kind != default["kl_kind"] and not self.kl_term():
            out["kl_kind"] = (
                f"`kl_kind={self.kl_kind!r}` picks the estimator of the KL loss term, and this "
                f"agent has none ({self._no_kl_reason()}): pass beta > 0, or leave kl_kind unset"
            )
        correction = self.vllm_importance_sampling_correction and not self.clip_against_sampler
        if self.vllm_importance_sampling_cap != default["vllm_importance_sampling_cap"] and not (
            correction
        ):
            why = (
                "clip_against_sampler=True takes the sampler's log-probs as the old ones"
                if self.clip_against_sampler
                else "vllm_importance_sampling_correction=False"
            )
            out["vllm_importance_sampling_cap"] = (
                "`vllm_importance_sampling_cap` caps the sampler-mismatch correction's weights, "
                f"and there are none ({why}): leave it unset, or pass "
                "vllm_importance_sampling_correction=True and clip_against_sampler=False"
            )
        reference = self.use_separate_reference_adapter
        if reference != default["use_separate_reference_adapter"] and (
            self.full_finetune or self.beta == 0
        ):
            why = (
                "full_finetune=True makes the reference a frozen copy of the model"
                if self.full_finetune
                else "beta=0 reads no reference policy"
            )
            out["use_separate_reference_adapter"] = (
                f"`use_separate_reference_adapter={reference}` chooses the LoRA reference, and "
                f"{why}: leave it unset"
            )
        if self.lora_target_scope is not None and self.full_finetune:
            out["lora_target_scope"] = (
                "`lora_target_scope` chooses where LoRA adapters go, and full_finetune=True "
                "trains every weight without adapters: leave it unset, or pass "
                "full_finetune=False"
            )
        if not self.merge_lora_for_generation and (self.full_finetune or self.use_vllm):
            out["merge_lora_for_generation"] = (
                "`merge_lora_for_generation=False` keeps the LoRA layers while the Hugging Face "
                "engine generates, and "
                + ("full_finetune=True has none" if self.full_finetune else "use_vllm=True "
                   "generates with vLLM")
                + ": leave it unset"
            )  # fmt: skip
        if self.hf_generate_chunk_size is not None and self.use_vllm:
            out["hf_generate_chunk_size"] = (
                "`hf_generate_chunk_size` splits the Hugging Face engine's generate calls, and "
                "use_vllm=True generates with vLLM: leave it unset (vLLM batches itself with "
                "VLLMConfig.max_num_seqs)"
            )
        most = self.max_output_tokens or max(1, (self.max_model_len or 1024) // 2)
        if self.min_output_tokens > most:
            out["min_output_tokens"] = (
                f"`min_output_tokens={self.min_output_tokens}` is more than the {most} tokens a "
                "completion may have (max_output_tokens, else half of max_model_len), so it "
                f"would be cut to {most}: pass min_output_tokens <= {most} or a larger "
                "max_output_tokens"
            )
        return out

    def _check_sampling_filters(self) -> None:
        """``top_p``, ``min_p``, ``top_k`` and ``repetition_penalty`` in their ranges.

        None is each filter's "off" (as in transformers' ``GenerationConfig``): stored as
        ``top_p=1.0``, ``min_p=0.0``, ``top_k=0``, ``repetition_penalty=1.0``.
        """
        for name, off in (
            ("top_p", 1.0),
            ("min_p", 0.0),
            ("top_k", 0),
            ("repetition_penalty", 1.0),
        ):
            value = getattr(self, name)
            if value is None:
                setattr(self, name, off)
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"`{name}` must be a number (or None: off), got {value!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1] (1: no nucleus cut), got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"`min_p` must be in [0, 1] (0: no cut), got {self.min_p}")
        if self.top_k < 0:
            raise ValueError(f"`top_k` must be >= 0, got {self.top_k}; 0 is no cut (vLLM's -1)")
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"`repetition_penalty` must be > 0 (1: none), got {self.repetition_penalty}"
            )

    def _no_kl_reason(self) -> str:
        """Why :meth:`kl_term` is False (for the messages)."""
        return "beta=0"

    def _check_router_replay(self) -> None:
        """Check ``router_replay`` (alone and with the options it cannot serve)."""
        mode = self.router_replay
        if mode not in (None, "R2", "R3"):
            raise ValueError(f"`router_replay` must be None, 'R2' or 'R3', got {mode!r}")
        if mode is None:
            return
        if self.share_prompt_prefix is True:
            raise ValueError(
                f"router_replay={mode!r} replays each row's own routes, and share_prompt_prefix="
                "True computes a shared prompt once for several rows: pass share_prompt_prefix="
                "None (which does not share while routes are replayed) or False, or "
                "router_replay=None"
            )
        if mode == "R3" and self.use_vllm:
            raise ValueError(
                "router_replay='R3' replays the sampler's routes, which the Hugging Face engine "
                "records, and use_vllm=True samples with vLLM, which does not return them here: "
                "pass use_vllm=False, or router_replay='R2'"
            )
        if mode == "R2" and self.clip_against_sampler:
            raise ValueError(
                "router_replay='R2' replays the routes of the trainer's forward that scores the "
                "old log-probs, and clip_against_sampler=True takes them from the sampler, with "
                "no such forward: pass clip_against_sampler=False, or router_replay=None"
            )

    def _check_packing(self) -> None:
        """Check ``use_sequence_packing`` and ``share_prompt_prefix`` (alone and together)."""
        for name, default in (
            ("use_sequence_packing", "pack where possible"),
            ("share_prompt_prefix", "share where it saves work"),
        ):
            if getattr(self, name) == "auto":  # YAML / command line spelling of the default
                setattr(self, name, None)
            if getattr(self, name) not in (None, True, False):
                raise ValueError(
                    f"`{name}` must be None or 'auto' ({default}), True or False, got "
                    f"{getattr(self, name)!r}"
                )
        if self.share_prompt_prefix is True and self.use_sequence_packing is False:
            raise ValueError(
                "share_prompt_prefix=True needs packed forwards, and use_sequence_packing=False "
                "runs every forward padded: pass use_sequence_packing=None (the default) or True, "
                "or share_prompt_prefix=None/False"
            )


_FIELDS: dict[type, frozenset[str]] = {}


def config_fields(config_class: type) -> frozenset[str]:
    """The field names of a config dataclass (``agent.<field>`` routes to ``agent.config``)."""
    names = _FIELDS.get(config_class)
    if names is None:
        names = _FIELDS[config_class] = frozenset(f.name for f in dataclasses.fields(config_class))
    return names
