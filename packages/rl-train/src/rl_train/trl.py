"""TRL's ``GRPOConfig`` / ``GRPOTrainer`` signatures over rl-stack: a TRL script runs unchanged.

A TRL GRPO script changes only its import, ``from trl import GRPOConfig, GRPOTrainer`` becoming
``from rl_train.trl import GRPOConfig, GRPOTrainer``: the dataset (a ``prompt`` column, text or
chat messages, other columns to the rewards), the reward functions (TRL's signature, ``async
def`` too) and the trainer calls stay. :class:`GRPOTrainer` builds a
:class:`rl_envs.ReasoningGym` and a GRPO-family agent from the config and trains with
:func:`rl_train.finetune_llm_reasoning`. The mapping of every field is in
``docs/tutorials/coming-from-trl.md``; a TRL field this module does not have is a
``TypeError`` naming it (nothing is silently ignored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainOutput"]

#: TRL ``loss_type`` -> (our preset, its extra settings). TRL's ``grpo`` divides by every row,
#: ours by the rows with a completion token (equal unless a completion is empty).
LOSS_TYPES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"loss_aggregation": "seq_mean_token_mean"}),
    "bnpo": ("grpo", {"loss_aggregation": "token_mean"}),
    "dapo": ("grpo", {"loss_aggregation": "token_mean"}),
    "dr_grpo": ("dr_grpo", {}),
    "cispo": ("cispo", {}),
}
#: TRL ``scale_rewards`` -> our ``adv_norm``.
SCALE_REWARDS: dict[Any, str] = {
    "group": "mean_std",
    True: "mean_std",
    "none": "mean_only",
    False: "mean_only",
}


@dataclass
class GRPOConfig:
    """The fields of TRL 1.16's ``GRPOConfig`` that rl-stack maps, with TRL's defaults."""

    output_dir: str | None = None
    """Run directory (metrics, checkpoints, curve); None: ``runs/trl``."""
    learning_rate: float = 1e-6
    """AdamW learning rate (our ``lr``)."""
    per_device_train_batch_size: int = 8
    """Completions per process per step (``prompts x num_generations``)."""
    gradient_accumulation_steps: int = 1
    """Steps accumulated per update: the update sees ``per_device_train_batch_size x`` this."""
    num_generations: int = 8
    """Completions per prompt (our ``group_size``)."""
    max_completion_length: int = 256
    """Most generated tokens (our ``max_output_tokens``)."""
    max_prompt_length: int | None = 512
    """Longer prompts are dropped with a warning (TRL truncates them from the left)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: off."""
    min_p: float | None = None
    repetition_penalty: float = 1.0
    beta: float = 0.0
    """KL coefficient against the reference model (0: no reference pass)."""
    epsilon: float = 0.2
    """Lower clip of the ratio (our ``clip_coef``)."""
    epsilon_high: float | None = None
    """Upper clip (our ``clip_coef_high``); None: ``epsilon``."""
    num_iterations: int = 1
    """Updates per generated batch (our ``update_epochs``)."""
    loss_type: str = "dapo"
    """``grpo``, ``bnpo``, ``dapo``, ``dr_grpo`` or ``cispo`` (see :data:`LOSS_TYPES`)."""
    scale_rewards: str | bool = "group"
    """``group`` (divide by the group's std) or ``none``."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default 1.0 each)."""
    max_steps: int = -1
    """Training steps; -1: ``num_train_epochs`` passes over the dataset."""
    num_train_epochs: float = 1.0
    """Passes over the dataset when ``max_steps`` is -1 (rounded up)."""
    logging_steps: float = 10
    """Accepted; every step's metrics are logged (console, CSV, JSONL, trackers)."""
    save_steps: float = 500
    """Steps between checkpoints (safetensors + JSON)."""
    eval_steps: float | None = None
    """Steps between greedy evaluations on ``eval_dataset`` (None: ``save_steps``)."""
    seed: int = 42
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = False
    report_to: str | list[str] | None = None
    """Trackers (``tensorboard``, ``wandb``, ``mlflow``, ``trackio``, ``none``, ``all``)."""
    use_vllm: bool = False
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_cap: float = 2.0
    disable_tqdm: bool = False
    extra_agent_kwargs: dict[str, Any] = field(default_factory=dict)
    """Not TRL's: any further rl-algos agent setting (e.g. ``micro_batch_tokens``)."""

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"GRPOConfig.loss_type={self.loss_type!r} is not supported here; use one of "
                f"{sorted(LOSS_TYPES)}, or an rl_algos agent directly"
            )
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(
                f"GRPOConfig.scale_rewards={self.scale_rewards!r} is not supported here; use "
                "'group' or 'none' ('batch' scaling has no equivalent yet)"
            )
        total = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if self.num_generations < 2 or total % self.num_generations:
            raise ValueError(
                f"GRPOConfig: per_device_train_batch_size x gradient_accumulation_steps "
                f"({total}) must be a multiple of num_generations ({self.num_generations}, at "
                "least 2), as in TRL"
            )


@dataclass
class TrainOutput:
    """What :meth:`GRPOTrainer.train` returns (TRL's ``TrainOutput`` fields)."""

    global_step: int
    """Updates made."""
    training_loss: float
    """Mean loss over the steps."""
    metrics: dict[str, float]
    """The last step's metrics."""


class GRPOTrainer:
    """TRL's ``GRPOTrainer`` constructor and ``train()``, trained by rl-stack.

    Args:
        model: A ``transformers`` causal LM, or a hub id / local path loaded with
            ``AutoModelForCausalLM``.
        reward_funcs: A reward function or a list of them (TRL's signature
            ``f(prompts, completions, completion_ids, **columns)``, AgileRL's or verl's; see
            :mod:`rl_envs.reward_functions`). Reward models given by name are not supported.
        args: The :class:`GRPOConfig` (default: TRL's defaults).
        train_dataset: A ``datasets.Dataset`` with a ``prompt`` column.
        eval_dataset: Greedy evaluations run on it (default: the first 32 training rows).
        processing_class: The tokenizer (default: loaded from ``model`` when it is a name).
        peft_config: A ``peft.LoraConfig``: train LoRA adapters (default: full fine-tuning).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Callable[..., Any] | Sequence[Callable[..., Any]],
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
    ) -> None:
        self.args = args or GRPOConfig()
        funcs = list(reward_funcs) if isinstance(reward_funcs, Sequence) else [reward_funcs]
        for f in funcs:
            if not callable(f):
                raise TypeError(
                    f"GRPOTrainer: reward function {f!r} is not callable; reward models given "
                    "by name are not supported here: wrap the model in a reward function"
                )
        if train_dataset is None:
            raise ValueError("GRPOTrainer needs `train_dataset` (a dataset with a prompt column)")
        if isinstance(model, str | Path):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            processing_class = processing_class or AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model))
        if processing_class is None:
            raise ValueError(
                "GRPOTrainer: pass `processing_class` (the tokenizer) with a model object, or "
                "give `model` as a hub id or path"
            )
        self.model, self.processing_class = model, processing_class
        self.reward_funcs = funcs
        self.env = self._env(train_dataset, eval_dataset)
        self.agent = self._agent(peft_config)

    def _env(self, train_dataset: Any, eval_dataset: Any) -> Any:
        from rl_envs import ReasoningGym

        a = self.args
        prompts = a.per_device_train_batch_size * a.gradient_accumulation_steps
        test = eval_dataset
        if test is None:
            test = train_dataset.select(range(min(32, len(train_dataset))))
        return ReasoningGym(
            train_dataset,
            test,
            self.processing_class,
            self.reward_funcs,
            data_batch_size_per_gpu=prompts // a.num_generations,
            max_context_length=a.max_prompt_length,
            seed=a.seed,
            reward_weights=a.reward_weights,
        )

    def _agent(self, peft_config: Any) -> Any:
        from rl_algos import make_agent

        a, tok = self.args, self.processing_class
        preset, extra = LOSS_TYPES[a.loss_type]
        options: dict[str, Any] = {
            "lr": a.learning_rate,
            "group_size": a.num_generations,
            "batch_size": a.per_device_train_batch_size * a.gradient_accumulation_steps,
            "micro_batch_size_per_gpu": a.per_device_train_batch_size,
            "max_output_tokens": a.max_completion_length,
            "max_model_len": (a.max_prompt_length or 512) + a.max_completion_length,
            "temperature": a.temperature,
            "top_p": a.top_p,
            "top_k": a.top_k,
            "min_p": a.min_p or 0.0,
            "repetition_penalty": a.repetition_penalty,
            "beta": a.beta,
            "clip_coef": a.epsilon,
            "clip_coef_high": a.epsilon_high,
            "update_epochs": a.num_iterations,
            "adv_norm": SCALE_REWARDS[a.scale_rewards],
            "max_grad_norm": a.max_grad_norm,
            "gradient_checkpointing": a.gradient_checkpointing,
            "use_vllm": a.use_vllm,
            "vllm_importance_sampling_correction": a.vllm_importance_sampling_correction,
            "vllm_importance_sampling_cap": a.vllm_importance_sampling_cap,
            "seed": a.seed,
            **extra,
            **a.extra_agent_kwargs,
        }
        if peft_config is None:
            options["full_finetune"] = True
        else:
            options["lora_config"] = peft_config
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return make_agent(
            preset,
            actor_network=self.model,
            tokenizer=tok,
            pad_token_id=pad,
            pad_token=tok.pad_token or tok.eos_token,
            **options,
        )

    def train(self) -> TrainOutput:
        """Train for ``max_steps`` (or ``num_train_epochs`` passes); returns the summary."""
        from rl_train.loops import finetune_llm_reasoning

        a = self.args
        steps = a.max_steps if a.max_steps > 0 else None
        interval = int(a.eval_steps or a.save_steps)
        rows: list[dict[str, float]] = []
        finetune_llm_reasoning(
            [self.agent],
            self.env,
            max_steps=steps,
            num_epochs=math.ceil(a.num_train_epochs),
            evaluation_interval=max(1, interval),
            checkpoint_steps=max(1, int(a.save_steps)),
            run_dir=a.output_dir or "runs/trl",
            verbose=not a.disable_tqdm,
            report_to=a.report_to,
            log_fn=rows.append,
        )
        losses = [r["loss"] for r in rows if "loss" in r]
        return TrainOutput(
            global_step=len(rows),
            training_loss=sum(losses) / len(losses) if losses else math.nan,
            metrics=dict(rows[-1]) if rows else {},
        )

    def save_model(self, output_dir: str | None = None) -> None:
        """The trained model and tokenizer, ``save_pretrained`` (safetensors) into the directory."""
        out = Path(output_dir or self.args.output_dir or "runs/trl")
        self.agent.policy.causal_lm.save_pretrained(out)
        self.processing_class.save_pretrained(out)
