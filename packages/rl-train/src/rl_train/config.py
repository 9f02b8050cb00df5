"""Run configuration for ``rl-train run``: typed dataclasses read from YAML, with overrides.

The sections are defined here and :func:`load_config` reads them; the reading and checking are
private modules, one topic each: ``_config_yaml`` (the YAML 1.2 loader and the overrides),
``_config_types`` (each key's type and range), ``_config_agent`` (the algorithm and its
``agent:`` keys, against the agent config's annotations), ``_config_checks`` (the settings the
types do not pin, and contradictions), ``_config_files`` (the files the config names) and
``_run_dir`` (whether ``train.run_dir`` already holds a run).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# torch-free: the config is checked against the algorithm table before torch loads
from rl_algos.names import ALGORITHM_SPECS

from rl_train._config_agent import ASYNC_REFUSED, _check_algorithm, _unknown_algorithm
from rl_train._config_checks import REWARD_STYLES, _check, _check_explicit
from rl_train._config_files import DATA_FILE_KINDS, _check_data_files, _resolve_paths
from rl_train._config_types import _KEY_ALIASES, _build
from rl_train._config_yaml import _read_tree, yaml_load
from rl_train._run_dir import RUN_FILES, check_run_dir, existing_run
from rl_train.env_config import EnvConfig
from rl_train.user_code import ConfigError, import_user_code

__all__ = [
    "ASYNC_REFUSED",
    "DATA_FILE_KINDS",
    "REWARD_STYLES",
    "RUN_FILES",
    "AsyncConfig",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "check_run_dir",
    "existing_run",
    "load_config",
    "yaml_load",
]


@dataclass
class ModelConfig:
    """Which model to train."""

    name: str = "tiny"
    """Hub id or local path of a causal LM, or ``"tiny"`` (the embedded demo model)."""
    tokenizer: str | None = None
    """Tokenizer path (default: ``name``)."""
    full_finetune: bool = False
    """Train every weight instead of LoRA adapters (the tiny model always does)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator."""
    lora_target_modules: str | list[str] = "all-linear"
    """LoRA target modules (peft's syntax)."""
    dtype: str = "float32"
    """Weights dtype when loading from the hub (float32, bfloat16, float16)."""
    chat_template: str | None = None
    """A Jinja chat template set on the tokenizer (the text, or a path to a file holding it),
    for a tokenizer without one (the tiny model's) or to replace it."""


@dataclass
class DataConfig:
    """Where prompts and answers come from."""

    task: str | None = "successor_digit"
    """A built-in task (``rl_envs.tasks``); ignored when ``train_path`` or ``hub`` is set."""
    train_path: str | None = None
    """A JSON/JSONL/CSV/Parquet file with question and answer columns, or a TRL-style
    ``prompt`` column (text, or a list of ``{"role", "content"}`` messages)."""
    test_path: str | None = None
    """The evaluation file (default: the last 10% of ``train_path``)."""
    hub: str | None = None
    """A ``datasets`` hub name (needs internet), e.g. ``openai/gsm8k``."""
    hub_config: str | None = None
    """The hub dataset's configuration name (e.g. ``main``)."""
    hub_test_split: str = "test"
    """The hub dataset's evaluation split (when it has none: the last 10% of ``train``)."""
    prompt_column: str = "prompt"
    """The prompt column of TRL-style data. A dataset that has it and no ``question_column``
    is prompt data: each prompt is used as is (text) or through the chat template (messages),
    ``template`` and ``system_prompt`` do not apply, and every other column reaches the reward
    functions."""
    question_column: str = "question"
    """Question column name."""
    answer_column: str = "answer"
    """Answer column name."""
    n_train: int = 400
    """Built-in task: training questions."""
    n_test: int = 40
    """Built-in task: test questions."""
    template: str | None = "{question}"
    """The user message; ``{question}`` (or any column in braces) is replaced. None: the data
    is prompt data (``prompt_column`` used as is) whatever its columns."""
    max_prompt_length: int | None = None
    """Prompts longer than this many tokens are dropped with a warning (None: no limit)."""
    system_prompt: str | None = None
    """An optional system message."""
    prompts_per_step: int = 8
    """Prompts per training step (per process)."""
    reward: str | list[str] = "demo"
    """``demo`` (exact answer, half credit for a right prefix), ``exact_match`` (number-aware,
    answer extraction), ``tagged`` (exact match plus a ``<answer>`` format bonus), or
    ``module:function`` (your own, e.g. in a module listed in ``imports``: AgileRL's
    ``(completion, answer, question) -> float``, TRL's ``(prompts, completions, completion_ids,
    **columns) -> list[float | None]``, sync or ``async``, or verl's ``compute_score``); or a
    list of them, summed with ``reward_weights``."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default 1.0 each)."""
    reward_style: str | list[str] = "auto"
    """``auto`` (read from each function's signature), ``agilerl``, ``trl``, ``verl`` or
    ``openrlhf``; or one per reward function."""
    reward_url: str | None = None
    """``http://host:port`` of a reward server (``rl-train reward-server``, e.g. a reward model
    on another machine); replaces ``reward``. One request scores a whole batch. With
    ``reward_protocol: openrlhf``: an OpenRLHF reward server's endpoint,
    ``http://host:port/get_reward``."""
    reward_protocol: str = "rl-envs"
    """How ``reward_url`` is spoken: ``rl-envs`` (``rl-train reward-server``) or ``openrlhf``
    (OpenRLHF's ``{"query", "prompts", "labels"} -> {"rewards"}``,
    :class:`rl_envs.openrlhf_reward.OpenRLHFRemoteReward`)."""
    reward_timeout: float = 60.0
    """Seconds one reward request may take in all (retries included) before the run stops
    with an error naming the server."""
    reward_retries: int = 3
    """Retries, with exponential backoff, of a reward request that failed to connect or got no
    reply."""
    offline_path: str | None = None
    """Logged data for offline algorithms (``ilql``): a JSONL file, one
    ``{"sample": [prompt, output, ...] or text, "reward": float}`` per line. The task or
    dataset above is then only evaluated on."""


@dataclass
class TrainConfig:
    """How long and where."""

    steps: int = 300
    """Training steps."""
    evaluation_interval: int = 25
    """Steps between greedy evaluations."""
    checkpoint_steps: int | None = 100
    """Steps between checkpoints (null: none)."""
    run_dir: str = "runs/run"
    """Run directory (metrics, checkpoints, curve, resolved config)."""
    seed: int = 0
    """Seed of the model initialisation, data order and sampling."""
    max_reward: float | None = None
    """Stop early once the test reward reaches this."""
    resume: bool = False
    """Continue from the latest checkpoint in ``run_dir``."""
    report_to: str | list[str] = "tensorboard"
    """Trackers beside the metrics files, as TRL's ``report_to``: ``tensorboard``, ``wandb``,
    ``mlflow``, ``trackio`` (one or a list; each but TensorBoard needs its extra,
    ``rl-train[wandb]``...), ``none`` or ``all``."""
    project: str = "rl-train"
    """The trackers' project (W&B project, MLflow experiment, trackio project)."""


@dataclass
class AsyncConfig:
    """Asynchronous rollout (YAML ``async:``): a worker process generates while the trainer learns.

    The worker samples and scores batches with its own copy of the model, tagged with the
    policy version (updates applied) they were sampled from; the trainer learns from them and
    sends the actor's weights back every ``weight_sync_steps`` updates. The sampling
    log-probs reach ``learn``, so the agent's rollout-mismatch correction
    (``vllm_importance_sampling_correction``) weights off-policy tokens.
    """

    max_staleness: int = 1
    """Most policy versions a consumed batch may lag behind the trainer (0: synchronous, the
    same run bit for bit)."""
    strategy: str = "wait"
    """``wait``: the worker waits for weights recent enough before sampling (no batch is
    wasted); ``drop``: the worker never waits and the trainer drops batches that are too old
    (counted in ``async_dropped``)."""
    weight_sync_steps: int = 1
    """Updates between weight pushes to the worker (needs ``max_staleness >=
    weight_sync_steps - 1``: fresher batches could never exist)."""
    queue_size: int = 2
    """Batches the worker may have ready ahead of the trainer."""
    timeout_s: float = 120.0
    """Seconds the trainer waits for a batch (and the weight round trip) before it stops with
    an error naming the worker."""
    startup_timeout_s: float = 600.0
    """Seconds the worker may take to start (import, build the model) before its first batch."""
    worker_threads: int | None = None
    """Torch threads of the worker process (None: the trainer's count, which keeps
    ``max_staleness: 0`` bit-exact)."""
    engine_url: str | None = None
    """``http://host:port`` of a rollout server (``rl-rollout-server``: vLLM on its own GPUs,
    or the hf engine on another machine): the worker generates through
    :class:`rl_rollout.RemoteEngine` and pushes the trainer's weights to that server (LoRA:
    the adapter's tensors only, in memory, each sample tagged with its version). None: the
    worker's own hf engine."""

    def __post_init__(self) -> None:
        if isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ConfigError(
                f"async.max_staleness must be an integer >= 0, got {self.max_staleness!r}"
            )
        if self.strategy not in ("drop", "wait"):
            raise ConfigError(f"async.strategy must be 'drop' or 'wait', got {self.strategy!r}")
        if self.weight_sync_steps < 1:
            raise ConfigError(f"async.weight_sync_steps must be >= 1, got {self.weight_sync_steps}")
        if self.max_staleness < self.weight_sync_steps - 1:
            raise ConfigError(
                f"async.max_staleness={self.max_staleness} cannot be met with "
                f"weight_sync_steps={self.weight_sync_steps}: weights arrive only every "
                f"{self.weight_sync_steps} updates; set max_staleness >= "
                f"{self.weight_sync_steps - 1} or lower weight_sync_steps"
            )
        if self.queue_size < 1:
            raise ConfigError(f"async.queue_size must be >= 1, got {self.queue_size}")
        for name in ("timeout_s", "startup_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"async.{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.worker_threads is not None and self.worker_threads < 1:
            raise ConfigError(
                f"async.worker_threads must be >= 1 or null, got {self.worker_threads}"
            )
        if self.engine_url is not None and not re.fullmatch(
            r"http://[^/:\s]+:\d+/?", str(self.engine_url)
        ):
            raise ConfigError(
                f"async.engine_url must look like 'http://host:port' (a rollout server), got "
                f"{self.engine_url!r}"
            )


@dataclass
class RunConfig:
    """A whole ``rl-train run`` configuration."""

    algo: str = "grpo"
    """One of :data:`rl_algos.ALGORITHMS` (grpo, gspo, cispo, dr_grpo, dapo, rloo,
    reinforce_pp, reinforce, ppo, ilql)."""
    imports: list[str] = field(default_factory=list)
    """Your modules, imported before the agent is built, so that what they register
    (``@rl_losses.register_policy_loss``, ``@rl_advantages.register_estimator``, rewards) can be
    named under ``agent:`` / ``data.reward``: module names (importable from the working
    directory or ``sys.path``) or paths to ``.py`` files (relative: the working directory's,
    else the YAML's)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The schedule."""
    agent: dict[str, Any] = field(default_factory=dict)
    """Fields of the algorithm's typed agent config (``group_size``, ``lr``, ``beta``,
    ``max_output_tokens``, ``loss_type``, ``advantage_estimator``...; e.g.
    :class:`rl_algos.GRPOConfig`), over the preset's and the tiny model's settings; passed to
    :func:`rl_algos.make_agent`. An unknown key is refused when the YAML is read."""
    engine: str = "hf"
    """Generation engine: ``hf`` or ``vllm`` (CUDA)."""
    engine_url: str | None = None
    """``http://host:port`` of a rollout server (``rl-rollout-server``) the synchronous loop
    samples on; after each update the trainer sends it the actor (LoRA: the adapter's tensors
    only, in memory; full fine-tuning: every weight). With ``async:``, ``async.engine_url``."""
    engine_timeout: float = 600.0
    """Seconds a call to ``engine_url``'s server may take (a generation; each of the three
    tries of a weight sync) before the run stops with an error naming the server."""
    deepspeed_config: str | None = None
    """A DeepSpeed JSON config (ZeRO-2/3; needs a launcher: ``torchrun`` or ``accelerate
    launch``). Under a launcher without it the run is DDP."""
    async_: AsyncConfig | None = None
    """YAML ``async:``: generate in a worker process while training (:class:`AsyncConfig`);
    null: the synchronous loop."""
    env: EnvConfig | None = None
    """YAML ``env:``: train on a multi-turn environment (OpenEnv, verifiers) instead of the
    prompts of ``data`` (:class:`~rl_train.env_config.EnvConfig`); null: prompts."""


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (or the defaults) and apply ``key.sub=value`` overrides.

    Numbers in scientific notation without a dot (``1e-4``) are numbers, as in YAML 1.2. Each
    value is checked against its field's type and range (``agent:`` values against the
    algorithm's agent config), naming the YAML key.

    Args:
        path: The YAML file, or None for the defaults.
        overrides: ``key.sub=value`` strings (values parsed as YAML).

    Returns:
        The checked configuration; relative file paths that exist next to the YAML (and not in
        the working directory) are made absolute.

    Raises:
        ConfigError: a missing file, bad YAML (with its line and column), an unknown key (with
            the nearest valid one), a value of the wrong type or out of range, settings that
            contradict each other, or an unknown algorithm.
    """
    tree, given = _read_tree(path, overrides)
    config: RunConfig = _build(RunConfig, tree, "")
    _check(config)
    _check_explicit(config, given)
    if path is not None:  # relative file paths: the working directory's, else the YAML's
        _resolve_paths(config, Path(path).resolve().parent)
    if config.algo not in ALGORITHM_SPECS:  # a row that a module of `imports` registers
        import_user_code(config.imports)
        if config.algo not in ALGORITHM_SPECS:
            _unknown_algorithm(config.algo)
        _check_algorithm(config)
    if config.deepspeed_config is not None and not Path(config.deepspeed_config).is_file():
        raise ConfigError(f"deepspeed_config file {config.deepspeed_config!r} does not exist")
    _check_data_files(config)
    return config


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The resolved config as plain data (saved in the run directory).

    Args:
        config: The configuration.

    Returns:
        Nested dicts and lists (the ``async_`` field under its YAML key ``async``).
    """
    out = dataclasses.asdict(config)
    for key, attr in _KEY_ALIASES.items():
        out[key] = out.pop(attr)
    return out
