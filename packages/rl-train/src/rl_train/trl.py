"""TRL's ``GRPOConfig`` / ``GRPOTrainer`` signatures over rl-stack: a TRL script runs unchanged.

A TRL GRPO script changes only its import, ``from trl import GRPOConfig, GRPOTrainer`` becoming
``from rl_train.trl import GRPOConfig, GRPOTrainer``: the dataset (a ``prompt`` column, text or
chat messages, other columns to the rewards), the reward functions (TRL's signature, ``async
def`` too) and the trainer calls stay. :class:`GRPOTrainer` turns the config into a
:class:`~rl_train.config.RunConfig` whose algorithm is a row of the algorithm table, builds
environment and agent with :func:`rl_train.builder.build` (as ``rl-train run`` does) and trains
with :func:`rl_train.finetune_llm_reasoning`. Where TRL's defaults differ from the agent
config's, :data:`TRL_OVERRIDES` holds TRL's values. The mapping of every field is in
``docs/tutorials/coming-from-trl.md``; a TRL field this module does not have is a
``TypeError`` naming it (nothing is silently ignored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rl_algos.names import ALGORITHM_SPECS

from rl_train.config import DataConfig, ModelConfig, RunConfig, TrainConfig

__all__ = ["TRL_OVERRIDES", "GRPOConfig", "GRPOTrainer", "TrainOutput"]

#: TRL 1.16's GRPOConfig defaults where they differ from rl-algos' agent config defaults
#: (:class:`rl_algos.GRPOConfig`), by our agent field name. :class:`GRPOConfig`'s fields
#: default to these; its other fields' defaults are TRL's and equal ours.
TRL_OVERRIDES: Mapping[str, Any] = MappingProxyType(
    {
        "lr": 1e-6,  # ours 5e-7
        "beta": 0.0,  # ours 0.001
        "temperature": 1.0,  # ours 0.9
        "top_p": 1.0,  # ours 0.95
        "top_k": 0,  # ours 50
        "max_grad_norm": 1.0,  # ours 0.1
        "max_output_tokens": 256,  # ours None (half of max_model_len)
        "vllm_importance_sampling_correction": False,  # ours True
    }
)

#: TRL ``loss_type`` -> (our preset, its extra settings). TRL's ``grpo`` divides by every row,
#: ours by the rows with a completion token (equal unless a completion is empty).
LOSS_TYPES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {"loss_aggregation": "seq_mean_token_mean"}),
    "bnpo": ("grpo", {"loss_aggregation": "token_mean"}),
    "dapo": ("grpo", {"loss_aggregation": "token_mean"}),
    "dr_grpo": ("dr_grpo", {}),
    "cispo": ("cispo", {}),
}
#: TRL ``multi_objective_aggregation`` -> our agent settings: GDPO is
#: ``rl_advantages.gdpo(eps=1e-4, batch_scale=True)`` with the reward weights of the environment
#: (TRL's ``normalize_then_sum``, which ignores ``scale_rewards``).
MULTI_OBJECTIVE: dict[str, dict[str, Any]] = {
    "sum_then_normalize": {},
    "normalize_then_sum": {
        "advantage_estimator": "gdpo",
        "advantage_estimator_kwargs": {"eps": 1e-4, "batch_scale": True},
    },
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
    learning_rate: float = TRL_OVERRIDES["lr"]
    """AdamW learning rate (our ``lr``)."""
    per_device_train_batch_size: int = 8
    """Completions per process per step (``prompts x num_generations``)."""
    gradient_accumulation_steps: int = 1
    """Steps accumulated per update: the update sees ``per_device_train_batch_size x`` this."""
    num_generations: int = 8
    """Completions per prompt (our ``group_size``)."""
    max_completion_length: int = TRL_OVERRIDES["max_output_tokens"]
    """Most generated tokens (our ``max_output_tokens``)."""
    max_prompt_length: int | None = 512
    """Longer prompts are dropped with a warning (TRL truncates them from the left)."""
    temperature: float = TRL_OVERRIDES["temperature"]
    top_p: float = TRL_OVERRIDES["top_p"]
    top_k: int = TRL_OVERRIDES["top_k"]
    """0: off."""
    min_p: float | None = None
    repetition_penalty: float = 1.0
    beta: float = TRL_OVERRIDES["beta"]
    """KL coefficient against the reference model (0: no reference pass)."""
    epsilon: float = 0.2
    """Lower clip of the ratio (our ``clip_coef``)."""
    epsilon_high: float | None = None
    """Upper clip (our ``clip_coef_high``); None: ``epsilon``. With ``loss_type="cispo"``, as
    in TRL, the cap of the importance weight (our ``cispo_eps_high`` + 1; None: ours, 5) and
    ``epsilon`` is not read."""
    num_iterations: int = 1
    """Updates per generated batch (our ``update_epochs``)."""
    loss_type: str = "dapo"
    """``grpo``, ``bnpo``, ``dapo``, ``dr_grpo`` or ``cispo`` (see :data:`LOSS_TYPES`)."""
    scale_rewards: str | bool = "group"
    """``group`` (divide by the group's std) or ``none``."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default 1.0 each)."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """``sum_then_normalize`` (the weighted sum, then the group advantage) or GDPO's
    ``normalize_then_sum`` (:data:`MULTI_OBJECTIVE`: each reward function's scores normalised
    per group, weighted, summed, then standardised over the batch)."""
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
    max_grad_norm: float = TRL_OVERRIDES["max_grad_norm"]
    gradient_checkpointing: bool = False
    report_to: str | list[str] | None = None
    """Trackers (``tensorboard``, ``wandb``, ``mlflow``, ``trackio``, ``none``, ``all``)."""
    use_vllm: bool = False
    vllm_importance_sampling_correction: bool = TRL_OVERRIDES["vllm_importance_sampling_correction"]
    vllm_importance_sampling_cap: float = 2.0
    disable_tqdm: bool = False
    router_aux_loss_coef: float | None = None
    """Weight of a mixture-of-experts model's load-balancing loss (None: the model config's;
    0.0: off; refused for a dense model), as in TRL; computed per sequence
    (:mod:`rl_algos.router_balance`), TRL's over each forward's tokens."""
    extra_agent_kwargs: dict[str, Any] = field(default_factory=dict)
    """Not TRL's: any further rl-algos agent setting (e.g. ``micro_batch_tokens``)."""
    max_tool_calling_iterations: int | None = None
    """With ``environment_factory``: turns with tool calls before an episode is cut off; None
    (TRL's "no limit"): ``max_completion_length``, which the turns' tokens reach first."""
    tool_parser: str = "hermes"
    """Not TRL's: how tool calls are read from the model's text with ``environment_factory``:
    ``hermes`` (``<tool_call>{json}</tool_call>``, TRL's Qwen-style default) or ``compact``
    (character vocabularies; :mod:`rl_envs.tools`)."""
    algo: str | None = None
    """Not TRL's: a grouped, online algorithm of the table (:data:`rl_algos.ALGORITHMS`) to
    train instead of the preset ``loss_type`` picks (its row's defaults apply, not
    ``loss_type``'s aggregation)."""

    def __post_init__(self) -> None:
        spec = None if self.algo is None else ALGORITHM_SPECS.get(self.algo)
        if self.algo is not None and (spec is None or not (spec.grouped and spec.online)):
            grouped = [n for n, s in ALGORITHM_SPECS.items() if s.grouped and s.online]
            raise ValueError(
                f"GRPOConfig.algo={self.algo!r} is not a grouped online algorithm; use one of "
                f"{', '.join(grouped)}, or None (the preset of loss_type)"
            )
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
        if self.multi_objective_aggregation not in MULTI_OBJECTIVE:
            raise ValueError(
                f"GRPOConfig.multi_objective_aggregation={self.multi_objective_aggregation!r} "
                f"is not one of TRL's: {sorted(MULTI_OBJECTIVE)}"
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
        environment_factory: TRL's: a class or callable making one environment per episode
            (``reset(**row)``, public methods as tools, optional ``get_reward()``); the reward
            functions then get ``environments=`` (:mod:`rl_train.trl_env`).
        tools: TRL's: stateless functions the model may call (type hints and an ``Args``
            docstring, as TRL reads their schema); episodes as with ``environment_factory``.
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
        environment_factory: Callable[[], Any] | None = None,
        tools: Sequence[Callable[..., Any]] | None = None,
    ) -> None:
        self.args = args or GRPOConfig()
        if tools is not None:
            from rl_train.trl_env import tools_environment

            if environment_factory is not None:
                raise ValueError(
                    "GRPOTrainer: pass `tools` or `environment_factory`, not both (an "
                    "environment's public methods are its tools)"
                )
            environment_factory = tools_environment(list(tools))
        if environment_factory is None and self.args.max_tool_calling_iterations is not None:
            raise ValueError(
                "GRPOConfig.max_tool_calling_iterations is read with environment_factory or "
                "tools; pass one, or leave it unset"
            )
        if environment_factory is not None and not callable(environment_factory):
            raise TypeError(
                f"GRPOTrainer: environment_factory {environment_factory!r} is not callable; pass "
                "the environment class (or a function returning a new environment)"
            )
        self.environment_factory = environment_factory
        self.train_dataset = train_dataset
        funcs = list(reward_funcs) if isinstance(reward_funcs, Sequence) else [reward_funcs]
        for f in funcs:
            if not callable(f):
                raise TypeError(
                    f"GRPOTrainer: reward function {f!r} is not callable; reward models given "
                    "by name are not supported here: wrap the model in a reward function"
                )
        if train_dataset is None:
            raise ValueError("GRPOTrainer needs `train_dataset` (a dataset with a prompt column)")
        model_name = None
        if isinstance(model, str | Path):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model_name = str(model)
            processing_class = processing_class or AutoTokenizer.from_pretrained(model_name)
            model = AutoModelForCausalLM.from_pretrained(model_name)
        if processing_class is None:
            raise ValueError(
                "GRPOTrainer: pass `processing_class` (the tokenizer) with a model object, or "
                "give `model` as a hub id or path"
            )
        if processing_class.pad_token_id is None:
            processing_class.pad_token = processing_class.eos_token
        self.model, self.processing_class = model, processing_class
        self.reward_funcs = funcs
        test = eval_dataset
        if test is None:
            test = train_dataset.select(range(min(32, len(train_dataset))))
        from rl_train.builder import build  # torch: only when a trainer is built

        name = str(model_name) if model_name is not None else ""
        built = build(
            self.run_config(name, full_finetune=peft_config is None),
            distributed=False,
            model=(model, processing_class),
            datasets=(train_dataset, test),
            rewards=funcs,
            lora_config=peft_config,
        )
        env = built.env
        assert env is not None  # the facade's config has no env: section
        self.env, self.agent = env, built.agent

    def run_config(self, model_name: str = "", *, full_finetune: bool = True) -> RunConfig:
        """The :class:`~rl_train.config.RunConfig` of :attr:`args` (what ``build`` reads).

        Args:
            model_name: The hub id or path the model was loaded from ("" for a model object).
            full_finetune: Train every weight (no ``peft_config``).

        Returns:
            The run configuration: ``loss_type``'s preset (or ``algo``), ``per_device x
            accumulation / num_generations`` prompts per step, the agent settings.
        """
        a = self.args
        preset, extra = (a.algo, {}) if a.algo is not None else LOSS_TYPES[a.loss_type]
        completions = a.per_device_train_batch_size * a.gradient_accumulation_steps
        agent: dict[str, Any] = {
            "lr": a.learning_rate,
            "group_size": a.num_generations,
            "micro_batch_size_per_gpu": a.per_device_train_batch_size,
            "max_output_tokens": a.max_completion_length,
            "max_model_len": (a.max_prompt_length or 512) + a.max_completion_length,
            "temperature": a.temperature,
            "top_p": a.top_p,
            "top_k": a.top_k,
            "min_p": a.min_p,
            "repetition_penalty": a.repetition_penalty,
            "beta": a.beta,
            "clip_coef": a.epsilon,
            "clip_coef_high": a.epsilon_high,
            "update_epochs": a.num_iterations,
            "adv_norm": SCALE_REWARDS[a.scale_rewards],
            "max_grad_norm": a.max_grad_norm,
            "gradient_checkpointing": a.gradient_checkpointing,
            "router_aux_loss_coef": a.router_aux_loss_coef,
            "vllm_importance_sampling_correction": a.vllm_importance_sampling_correction,
            "vllm_importance_sampling_cap": a.vllm_importance_sampling_cap,
            **extra,
            **MULTI_OBJECTIVE[a.multi_objective_aggregation],
        }
        # what TRL reads in each case (the agent refuses a setting that changes nothing)
        if preset == "cispo":  # TRL's CISPO caps the IS weight at epsilon_high (absolute)
            del agent["clip_coef"]
            cap = agent.pop("clip_coef_high")
            agent["cispo_eps_high"] = None if cap is None else cap - 1.0
        if not a.vllm_importance_sampling_correction:
            del agent["vllm_importance_sampling_cap"]
        if a.multi_objective_aggregation == "normalize_then_sum":  # ignores scale_rewards
            del agent["adv_norm"]
        agent.update(a.extra_agent_kwargs)
        agent = {k: v for k, v in agent.items() if v is not None}  # None: the row's or ours
        return RunConfig(
            algo=preset,
            model=ModelConfig(name=model_name, full_finetune=full_finetune),
            data=DataConfig(
                task=None,
                template=None,  # TRL data: the prompt column as is
                prompts_per_step=completions // a.num_generations,
                reward_weights=a.reward_weights,
                max_prompt_length=a.max_prompt_length,
            ),
            train=TrainConfig(seed=a.seed, run_dir=a.output_dir or "runs/trl"),
            agent=agent,
            engine="vllm" if a.use_vllm else "hf",
        )

    def train(self) -> TrainOutput:
        """Train for ``max_steps`` (or ``num_train_epochs`` passes); returns the summary."""
        a = self.args
        steps = a.max_steps if a.max_steps > 0 else None
        interval = int(a.eval_steps or a.save_steps)
        rows: list[dict[str, float]] = []
        if self.environment_factory is not None:
            self._train_episodes(steps, interval, rows.append)
        else:
            self._train_prompts(steps, interval, rows.append)
        losses = [r["loss"] for r in rows if "loss" in r]
        return TrainOutput(
            global_step=len(rows),
            training_loss=sum(losses) / len(losses) if losses else math.nan,
            metrics=dict(rows[-1]) if rows else {},
        )

    def _train_episodes(
        self, steps: int | None, interval: int, log_fn: Callable[[dict[str, float]], None]
    ) -> None:
        """``environment_factory``: tool-calling episodes (:mod:`rl_train.trl_env`)."""
        from rl_train.loops import finetune_llm_multiturn
        from rl_train.trl_env import tool_episode_factory

        a = self.args
        assert self.environment_factory is not None
        calls = a.max_tool_calling_iterations
        calls = a.max_completion_length if calls is None else calls
        factory = tool_episode_factory(
            self.environment_factory,
            self.processing_class,
            [dict(r) for r in self.train_dataset],
            self.reward_funcs,
            weights=a.reward_weights,
            max_tool_calls=calls,
            max_model_len=int(self.agent.max_model_len),
            max_output_tokens=int(self.agent.max_output_tokens),
            tool_parser=a.tool_parser,
        )
        per_step = a.per_device_train_batch_size * a.gradient_accumulation_steps
        if steps is None:  # num_train_epochs passes over the rows
            steps = math.ceil(a.num_train_epochs * len(self.train_dataset) * a.num_generations
                              / per_step)  # fmt: skip
        finetune_llm_multiturn(
            [self.agent],
            calls + 1,
            factory,
            max_steps=steps,
            evaluation_interval=max(1, interval),
            batch_size=per_step // a.num_generations,
            group_size=a.num_generations,
            seed=a.seed,
            checkpoint_steps=max(1, int(a.save_steps)),
            run_dir=a.output_dir or "runs/trl",
            verbose=not a.disable_tqdm,
            report_to=a.report_to,
            log_fn=log_fn,
        )

    def _train_prompts(
        self, steps: int | None, interval: int, log_fn: Callable[[dict[str, float]], None]
    ) -> None:
        """Prompts and reward functions (:func:`rl_train.finetune_llm_reasoning`)."""
        from rl_train.loops import finetune_llm_reasoning

        a = self.args
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
            log_fn=log_fn,
        )

    def save_model(self, output_dir: str | None = None) -> None:
        """The trained model and tokenizer, ``save_pretrained`` (safetensors) into the directory."""
        out = Path(output_dir or self.args.output_dir or "runs/trl")
        self.agent.policy.causal_lm.save_pretrained(out)
        self.processing_class.save_pretrained(out)
