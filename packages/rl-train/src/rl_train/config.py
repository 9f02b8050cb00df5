"""Run configuration for ``rl-train run``: typed dataclasses read from YAML, with overrides."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import re
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

# torch-free: the config is checked against the algorithm table before torch loads
from rl_algos.names import ALGORITHM_SPECS, ALGORITHMS, Column, agent_config_fields

from rl_train.env_config import EnvConfig, check_env
from rl_train.trackers import check_report_to
from rl_train.user_code import ConfigError, import_user_code

__all__ = [
    "AsyncConfig",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "load_config",
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
    """``auto`` (read from each function's signature), ``agilerl``, ``trl`` or ``verl``; or
    one per reward function."""
    reward_url: str | None = None
    """``http://host:port`` of a reward server (``rl-train reward-server``, e.g. a reward model
    on another machine); replaces ``reward``. One request scores a whole batch."""
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


#: YAML keys that are Python keywords -> the dataclass field that holds them.
_KEY_ALIASES = {"async": "async_"}


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    shown = [next((k for k, v in _KEY_ALIASES.items() if v == n), n) for n in names]
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        attr = _KEY_ALIASES.get(key, key)
        if attr not in names or key in _KEY_ALIASES.values():
            prefix = f"{where}." if where else ""
            valid = [prefix + n for n in shown]
            raise ConfigError(f"unknown key {path!r}{_suggest(path, valid)}")
        hint = _section(hints[attr])
        optional = hint is not hints[attr]  # ``X | None``: null turns the section off
        if dataclasses.is_dataclass(hint):
            section = None if optional and value is None else _build(hint, value, path)  # type: ignore[arg-type]
            kwargs[attr] = section
        else:
            kwargs[attr] = _check_type(value, hint, path)
            minimum = _MINIMUM.get(path)
            if minimum is not None and kwargs[attr] is not None and kwargs[attr] < minimum:
                raise ConfigError(f"{path} must be {_describe(hint, minimum)}, got {value!r}")
    return cls(**kwargs)


def _section(hint: Any) -> Any:
    """``X | None`` of a dataclass ``X`` -> ``X`` (an optional section); else ``hint``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):
            return options[0]
    return hint


def _check_type(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        base = typing.get_origin(option) or option
        if option is type(None) and value is None:
            return value
        if base is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if base is Any or (isinstance(base, type) and isinstance(value, base)):
            if base is int and isinstance(value, bool):
                continue
            return value
    raise ConfigError(f"{path} must be {_describe(hint, _MINIMUM.get(path))}, got {value!r}")


#: What each Python type of a config field is called in an error message.
_KINDS: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}

#: The least value of numeric fields (``key: minimum``), checked when the YAML is read.
_MINIMUM: dict[str, int] = {
    "model.lora_r": 1,
    "model.lora_alpha": 1,
    "data.n_train": 1,
    "data.n_test": 1,
    "data.prompts_per_step": 1,
    "data.max_prompt_length": 1,
    "train.steps": 1,
    "train.evaluation_interval": 1,
    "train.checkpoint_steps": 1,
}


def _describe(hint: Any, minimum: int | None = None) -> str:
    """``int | None`` -> ``an integer or null`` (with ``>= minimum`` after a number)."""
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    words = []
    for option in options:
        if option is type(None):
            continue
        base = typing.get_origin(option) or option
        word = _KINDS.get(base, getattr(base, "__name__", str(base)))
        if minimum is not None and base in (int, float):
            word += f" >= {minimum}"
        words.append(word)
    if type(None) in options:
        words.append("null")
    return " or ".join(words)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = value


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-4`` and ``1e3`` are numbers.

    YAML 1.1 (PyYAML's default) needs a dot and a signed exponent (``1.0e-4``) and reads ``1e-4``
    as the string ``'1e-4'``.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def yaml_load(text: str, where: str) -> Any:
    """Parse YAML (YAML 1.2 floats: ``1e-4`` is a number).

    Args:
        text: The YAML text.
        where: What it is, for errors (a file name, ``override 'key=value'``).

    Returns:
        The parsed value.

    Raises:
        ConfigError: Invalid YAML, naming the line, the column and the problem.
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        detail = f"{problem} ({context})" if context else problem
        raise ConfigError(f"{where} is not valid YAML{at}: {detail}") from exc


def _dotted(node: Any, prefix: str = "") -> set[str]:
    """The dotted keys a parsed YAML mapping sets (``train``, ``train.steps``...)."""
    if not isinstance(node, dict):
        return set()
    out = set()
    for key, value in node.items():
        out.add(f"{prefix}{key}")
        out |= _dotted(value, f"{prefix}{key}.")
    return out


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
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        loaded = yaml_load(p.read_text(), str(p)) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p} must hold a mapping at the top level")
        tree = loaded
    in_file = _dotted(tree)
    command_line: set[str] = set()
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.steps=50)")
        key, raw = item.split("=", 1)
        _set(tree, key.strip(), yaml_load(raw, f"override {item!r}"))
        command_line.add(key.strip())
    config: RunConfig = _build(RunConfig, tree, "")
    _check(config)
    _check_explicit(config, _Given(in_file, command_line))
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


@dataclass(frozen=True)
class _Given:
    """Which dotted keys the YAML file and the command line set."""

    in_file: set[str]
    command_line: set[str]

    def where(self, key: str) -> str | None:
        """``command line`` (the key or a section above it), ``YAML`` or None (a default)."""
        parts = key.split(".")
        if any(".".join(parts[:n]) in self.command_line for n in range(1, len(parts) + 1)):
            return "command line"
        return "YAML" if key in self.in_file else None


def _check_explicit(config: RunConfig, given: _Given) -> None:
    """Settings that are ignored or contradict each other, by where they were set.

    ``agent.full_finetune`` must agree with ``model.full_finetune`` (the tiny model always
    trains every weight); ``model.lora_*`` off its default is refused under full fine-tuning
    (a run's resolved ``config.json`` lists the defaults), and
    ``agent.group_size`` warns for an algorithm that samples one completion per prompt. Both
    are silent for a YAML written for other runs: keys the file sets while the command line
    changed what decides them (``algo``, ``model.name``, ``model.full_finetune``).
    """
    tiny = config.model.name == "tiny"
    full = config.model.full_finetune or tiny
    why = "model.name: tiny always trains every weight" if tiny else "model.full_finetune: true"
    if "full_finetune" in config.agent and config.agent["full_finetune"] != full:
        raise ConfigError(
            f"agent.full_finetune={str(config.agent['full_finetune']).lower()} contradicts "
            f"model.full_finetune={str(config.model.full_finetune).lower()}"
            f"{' (model.name: tiny always trains every weight)' if tiny else ''}: remove "
            "agent.full_finetune; model.full_finetune decides between LoRA and full fine-tuning"
        )
    deciders = ("model.name", "model.full_finetune")
    if full:
        for key in ("lora_r", "lora_alpha", "lora_target_modules"):
            source = given.where(f"model.{key}")
            shared = source == "YAML" and any(given.where(k) == "command line" for k in deciders)
            changed = getattr(config.model, key) != getattr(ModelConfig(), key)
            if source is not None and changed and not shared:
                raise ConfigError(
                    f"model.{key} has no effect: the run trains every weight ({why}); remove "
                    f"model.{key}, or set model.full_finetune: false for LoRA"
                )
    spec = ALGORITHM_SPECS.get(config.algo)
    if spec is not None and not spec.grouped and "group_size" in config.agent:
        source = given.where("agent.group_size")
        shared = source == "YAML" and given.where("algo") == "command line"
        if not shared:
            warnings.warn(
                f"agent.group_size={config.agent['group_size']!r} is ignored: {config.algo} "
                "samples one completion per prompt (data.prompts_per_step sets the batch)",
                UserWarning,
                stacklevel=3,
            )


#: What a run writes in its directory: a directory that holds any of them holds a run.
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "metrics.csv",
    "checkpoints",
    "tensorboard",
    "reward_curve.png",
    "summary.json",
)


def existing_run(run_dir: str | Path) -> list[str]:
    """The names of :data:`RUN_FILES` that ``run_dir`` holds (empty: none, or no directory).

    Args:
        run_dir: A run directory.

    Returns:
        The run files and folders found, in :data:`RUN_FILES` order.
    """
    run = Path(run_dir)
    return [name for name in RUN_FILES if (run / name).exists()] if run.is_dir() else []


def check_run_dir(train: TrainConfig) -> None:
    """A fresh run needs a new (or empty) ``train.run_dir``; a resumed one, a directory.

    Args:
        train: The run's ``train`` section.

    Raises:
        ConfigError: ``train.run_dir`` is a file, or already holds a run and
            ``train.resume`` is false (its metrics, checkpoints and TensorBoard events would
            mix with the new run's).
    """
    run = Path(train.run_dir)
    if run.exists() and not run.is_dir():
        raise ConfigError(
            f"train.run_dir {train.run_dir!r} is a file, not a directory: choose a directory"
        )
    found = [] if train.resume else existing_run(run)
    if found:
        raise ConfigError(
            f"train.run_dir {train.run_dir!r} already holds a run ({', '.join(found)}): pass "
            "train.resume=true to continue it, or choose a new train.run_dir, or delete it"
        )


def _check_data_files(config: RunConfig) -> None:
    """Data files that do not exist fail here, before the model libraries are imported."""
    d = config.data
    if d.hub is None and d.train_path is not None:
        kind = Path(d.train_path).suffix.lstrip(".") in DATA_FILE_KINDS
        if not kind or not Path(d.train_path).is_file():
            raise ConfigError(
                f"data.train_path {d.train_path!r} must be an existing .json, .jsonl, .csv or "
                ".parquet file"
            )
        if d.test_path is not None and not Path(d.test_path).is_file():
            raise ConfigError(f"data.test_path file {d.test_path!r} does not exist")
    if d.offline_path is not None and not Path(d.offline_path).is_file():
        raise ConfigError(f"data.offline_path {d.offline_path!r} does not exist")
    template = config.model.chat_template
    if template is not None and _template_path(template) and not Path(template).is_file():
        raise ConfigError(
            f"model.chat_template {template!r} is neither a Jinja template (it has no '{{') nor "
            "an existing file"
        )


#: Data file suffix -> the ``datasets`` builder that reads it.
DATA_FILE_KINDS = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet"}

#: The values of ``data.reward_style``.
REWARD_STYLES = ("auto", "agilerl", "trl", "verl")


def _check_rewards(d: DataConfig) -> None:
    """``data.reward`` / ``reward_weights`` / ``reward_style`` agree with each other."""
    rewards = [d.reward] if isinstance(d.reward, str) else d.reward
    if not rewards or not all(isinstance(r, str) and r for r in rewards):
        raise ConfigError(
            f"data.reward must be a name or a non-empty list of names, got {d.reward!r}"
        )
    if d.reward_weights is not None:
        if not all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in d.reward_weights
        ):
            raise ConfigError(f"data.reward_weights must be numbers, got {d.reward_weights!r}")
        if len(d.reward_weights) != len(rewards):
            raise ConfigError(
                f"data.reward_weights has {len(d.reward_weights)} entries for {len(rewards)} "
                "reward functions: give one weight per entry of data.reward"
            )
    styles = [d.reward_style] if isinstance(d.reward_style, str) else d.reward_style
    for style in styles:
        if style not in REWARD_STYLES:
            raise ConfigError(
                f"data.reward_style {style!r} is unknown: use {', '.join(REWARD_STYLES)}"
            )
    if not isinstance(d.reward_style, str) and len(styles) != len(rewards):
        raise ConfigError(
            f"data.reward_style has {len(styles)} entries for {len(rewards)} reward functions: "
            "give one per entry of data.reward, or one string for all"
        )


def _check(config: RunConfig) -> None:
    """Values the types do not pin: algorithm, engine, imports, rewards."""
    _check_rewards(config.data)
    if not all(isinstance(item, str) and item for item in config.imports):
        raise ConfigError(
            f"imports must be a list of module names or .py paths, got {config.imports!r}"
        )
    if config.algo not in ALGORITHM_SPECS and not config.imports:
        _unknown_algorithm(config.algo)
    if config.engine not in ("hf", "vllm"):
        raise ConfigError(f"engine must be 'hf' or 'vllm', got {config.engine!r}")
    if config.engine_url is not None:
        if not re.fullmatch(r"http://[^/:\s]+:\d+/?", str(config.engine_url)):
            raise ConfigError(
                f"engine_url must look like 'http://host:port', got {config.engine_url!r}"
            )
        if config.async_ is not None:
            raise ConfigError(
                "engine_url is the synchronous loop's; with async: set async.engine_url"
            )
        if config.engine != "hf":
            raise ConfigError("engine_url: the server runs the engine; drop engine: vllm")
        if not config.engine_timeout > 0:
            raise ConfigError(f"engine_timeout must be > 0 seconds, got {config.engine_timeout}")
        if config.deepspeed_config is not None:  # a ZeRO-3 actor is partitioned: no one has it
            raise ConfigError("engine_url runs under DDP, not DeepSpeed: drop deepspeed_config")
    _check_reward_url(config.data)
    spec = ALGORITHM_SPECS.get(config.algo)
    check_env(config.env, spec is None or spec.online, asynchronous=config.async_ is not None)
    try:
        check_report_to(config.train.report_to)
    except ValueError as exc:
        raise ConfigError(f"train.{exc}") from exc
    if config.algo in ALGORITHM_SPECS:  # else: a row a module of `imports` registers
        _check_algorithm(config)
    hf_only = config.engine != "hf" or config.deepspeed_config is not None
    if config.async_ is not None and hf_only:
        raise ConfigError(
            "async: the rollout worker runs the hf engine without DeepSpeed; set "
            "engine: hf and remove deepspeed_config, or remove the async section"
        )


def _unknown_algorithm(algo: str) -> None:
    raise ConfigError(f"unknown algorithm {algo!r}{_suggest(algo, list(ALGORITHMS))}")


def _check_algorithm(config: RunConfig) -> None:
    """What the algorithm's row decides: the ``agent:`` keys, whether it may run async."""
    _check_agent_keys(config)
    if config.async_ is not None and config.algo in ASYNC_REFUSED:
        raise ConfigError(f"async: {ASYNC_REFUSED[config.algo]}")


def _check_agent_keys(config: RunConfig) -> None:
    """``agent:`` keys are the agent's keywords (its typed config's fields, its constructor's),
    and each value fits its field's type (and range) in the agent's typed config.

    ``group_size`` is also accepted, and dropped, for an algorithm that samples one completion
    per prompt (the row's ``grouped`` is False), so one YAML serves every algorithm.
    """  # noqa: D205
    valid = agent_config_fields(config.algo)
    if valid is None:  # the source is unreadable: the agent's constructor checks them
        return
    ignored = () if ALGORITHM_SPECS[config.algo].grouped else ("group_size",)
    annotations = _agent_annotations(config.algo)
    for key, value in config.agent.items():
        if key in ignored:
            continue
        if key not in valid:
            agent = ALGORITHM_SPECS[config.algo].agent.rpartition(":")[2]
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean 'agent.{close[0]}'?" if close else "--print-config lists them"
            raise ConfigError(
                f"unknown key 'agent.{key}': {agent} got unexpected arguments [{key!r}]; {hint}"
            )
        if key in annotations:
            _check_agent_value(key, value, annotations[key])


#: The least value of numeric agent settings, checked when the YAML is read (the agent's own
#: checks name its internal arguments, after the model is built).
_AGENT_MINIMUM: dict[str, int] = {
    "group_size": 1,
    "batch_size": 1,
    "update_epochs": 1,
    "max_output_tokens": 1,
    "max_model_len": 1,
    "micro_batch_size_per_gpu": 1,
    "micro_batch_tokens": 1,
    "min_output_tokens": 0,
    "lr": 0,
    "beta": 0,
}


def _check_agent_value(key: str, value: Any, annotation: ast.expr) -> None:
    """``agent.<key>``'s value against its annotation in the agent's typed config."""
    fits = _fits(value, annotation)
    tri_state = _fits(None, annotation) and _fits(True, annotation) and not _fits(1, annotation)
    if value == "auto" and tri_state:  # the YAML spelling of None for a bool | None switch
        return
    minimum = _AGENT_MINIMUM.get(key)
    wanted = _wanted(annotation, minimum)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if fits is False or (minimum is not None and number and value < minimum):
        raise ConfigError(f"agent.{key} must be {wanted}, got {value!r}")


def _agent_annotations(algo: str) -> dict[str, ast.expr]:
    """The annotation of each field of ``algo``'s typed agent config, read from the source
    without importing it (torch-free); empty where the source cannot be read.
    """  # noqa: D205
    from rl_algos import names

    try:
        module, agent = names._location(ALGORITHM_SPECS[algo].agent, "rl_algos")
        found = names._config_class(module, agent)
        return {} if found is None else _class_annotations(*found)
    except (ImportError, SyntaxError, OSError, ValueError, AttributeError, KeyError):
        return {}


def _class_annotations(module: str, name: str, depth: int = 0) -> dict[str, ast.expr]:
    """The annotated fields of class ``module.name`` and its bases (``ClassVar`` excluded)."""
    from rl_algos import names

    found = names._class_def(module, name)
    if found is None or depth > 8:
        return {}
    node, where = found
    out: dict[str, ast.expr] = {}
    for base in names._bases(node):
        out.update(_class_annotations(where, base, depth + 1))
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if "ClassVar" not in ast.unparse(stmt.annotation):
            out[stmt.target.id] = stmt.annotation
    return out


#: Checks of the type names of an annotation (bool is not a number) and their words.
_CHECKS: dict[str, tuple[Any, str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "tuple": (lambda v: isinstance(v, list | tuple), "a list"),
    "list": (lambda v: isinstance(v, list | tuple), "a list"),
    "Sequence": (lambda v: isinstance(v, list | tuple), "a list"),
    "dict": (lambda v: isinstance(v, dict), "a mapping"),
    "Mapping": (lambda v: isinstance(v, dict), "a mapping"),
}


def _options(node: ast.expr) -> list[ast.expr]:
    """The alternatives of an annotation: ``X | Y``, ``Optional[X]``, ``Union[X, Y]``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _options(node.left) + _options(node.right)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            return _options(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return [node]
    head = _head(node)
    if isinstance(node, ast.Subscript) and head in ("Optional", "Union"):
        inner = node.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if head == "Optional":
            items.append(ast.Constant(None))
        return [option for item in items for option in _options(item)]
    return [node]


def _head(node: ast.expr) -> str | None:
    """``int`` of ``int``, ``list`` of ``list[str]``; None for anything else."""
    base = node.value if isinstance(node, ast.Subscript) else node
    return base.id if isinstance(base, ast.Name) else None


def _literals(node: ast.expr) -> list[Any] | None:
    """The values of ``Literal[...]``, or None when ``node`` is not one."""
    if not (isinstance(node, ast.Subscript) and _head(node) == "Literal"):
        return None
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return [item.value for item in items if isinstance(item, ast.Constant)]


def _fits(value: Any, node: ast.expr) -> bool | None:
    """Whether ``value`` fits an annotation: True, False, or None (a type not read here)."""
    results: list[bool | None] = []
    for option in _options(node):
        literals = _literals(option)
        check = _CHECKS.get(_head(option) or "")
        if isinstance(option, ast.Constant) and option.value is None:
            results.append(value is None)
        elif literals is not None:
            results.append(value in literals)
        elif _head(option) == "Any":
            results.append(True)
        else:
            results.append(None if check is None else bool(check[0](value)))
    return True if any(results) else (None if None in results else False)


def _wanted(node: ast.expr, minimum: int | None = None) -> str:
    """An annotation in words (``int | None`` -> ``an integer or null``)."""
    words = []
    for option in _options(node):
        literals = _literals(option)
        check = _CHECKS.get(_head(option) or "")
        if isinstance(option, ast.Constant) and option.value is None:
            continue
        if literals is not None:
            words.append("one of " + ", ".join(repr(v) for v in literals))
        elif check is None:
            words.append(ast.unparse(option))
        elif minimum is not None and _head(option) in ("int", "float"):
            words.append(f"{check[1]} >= {minimum}")
        else:
            words.append(check[1])
    if _fits(None, node):
        words.append("null")
    return " or ".join(dict.fromkeys(words))


def _check_reward_url(d: DataConfig) -> None:
    """``data.reward_url`` and its timeout and retries, checked without connecting."""
    if d.reward_url is not None:
        parts = urlsplit(d.reward_url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise ConfigError(
                f"data.reward_url must look like 'http://host:port', got {d.reward_url!r}"
            )
    if not d.reward_timeout > 0:
        raise ConfigError(f"data.reward_timeout must be > 0 seconds, got {d.reward_timeout}")
    if d.reward_retries < 0:
        raise ConfigError(f"data.reward_retries must be >= 0, got {d.reward_retries}")


#: Algorithms the asynchronous loop refuses, and why (with the fix): the table's
#: ``async_refused`` column (:mod:`rl_algos.names`), a live view.
ASYNC_REFUSED: Mapping[str, str] = Column("async_refused")


def _resolve_paths(config: RunConfig, base: Path) -> None:
    """Relative paths that exist only next to the YAML become absolute."""
    for owner, field_name in (
        (config, "deepspeed_config"),
        (config.data, "offline_path"),
        (config.data, "train_path"),
        (config.data, "test_path"),
    ):
        value = getattr(owner, field_name)
        if value is not None and not Path(value).exists() and (base / value).exists():
            setattr(owner, field_name, str(base / value))
    template = config.model.chat_template
    if (
        template is not None
        and _template_path(template)
        and not Path(template).exists()
        and (base / template).exists()
    ):
        config.model.chat_template = str(base / template)
    config.imports = [
        str(base / item)
        if _is_path(item) and not Path(item).exists() and (base / item).exists()
        else item
        for item in config.imports
    ]


def _template_path(value: str) -> bool:
    """Whether ``model.chat_template`` names a file rather than holding the template."""
    return "{" not in value and "\n" not in value and len(value) < 4096


def _is_path(item: str) -> bool:
    """Whether an ``imports`` entry names a file rather than a module."""
    return item.endswith(".py") or "/" in item or "\\" in item


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
