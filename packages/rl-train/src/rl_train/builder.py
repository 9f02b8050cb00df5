"""The builder: a :class:`RunConfig` in; user code, accelerator, model, environment, agent out.

One function per piece, each a pure mapping from the config (and what the previous phase
built) to an object; :func:`build` runs them in order. ``rl-train run`` / ``eval`` / ``demo``
and the trlX-style trainers all build through here. The agent comes from
:func:`rl_algos.make_agent`, so ``algo`` is any name of :data:`rl_algos.ALGORITHMS` and
``agent:`` keys pass straight through (``loss_type`` / ``advantage_estimator`` may name what a
module in ``imports`` registered).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rl_algos import make_agent
from rl_envs import ReasoningGym
from rl_envs.remote_reward import RemoteReward
from rl_envs.rewards import exact_match_reward, tagged_format_reward
from rl_envs.tasks import available_tasks, train_test_split_task
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_train._config_files import DATA_FILE_KINDS, _template_path
from rl_train.config import ConfigError, DataConfig, RunConfig
from rl_train.rollout_worker import RolloutPieces
from rl_train.settings import agent_kwargs, full_finetune
from rl_train.tiny import demo_reward, tiny_model, tiny_tokenizer
from rl_train.user_code import import_user_code

__all__ = [
    "Built",
    "agent_kwargs",
    "build",
    "build_accelerator",
    "build_agent",
    "build_env",
    "build_model",
    "build_reward",
    "build_rewards",
    "import_user_code",
    "rollout_pieces",
    "training_rows",
]

RewardFn = Callable[..., Any]


@dataclass
class Built:
    """Everything :func:`build` made from one config."""

    config: RunConfig
    """The configuration."""
    accelerator: Any
    """An ``accelerate.Accelerator`` (under a launcher or with DeepSpeed), or None."""
    model: Any
    """The causal LM (before the agent wraps it)."""
    tokenizer: Any
    """Its tokenizer."""
    env: ReasoningGym | None
    """The prompts and rewards (for ``ilql``: the evaluation data); None in a run with an
    ``env:`` section, whose episodes :mod:`rl_train.env_run` makes."""
    agent: Any
    """The rl-algos agent."""


def build_accelerator(config: RunConfig) -> Any:
    """An ``accelerate.Accelerator`` under a launcher or with ``deepspeed_config``; else None.

    Launched by ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` is set), the agent and the
    environment share it: DDP (gloo on CPU, nccl on GPUs), or DeepSpeed with the JSON config.
    On CPU the process group is gloo explicitly, without which accelerate silently runs one
    process, and DeepSpeed is not dropped (``Accelerator(cpu=True)`` would drop it).

    Args:
        config: The run configuration.

    Returns:
        The accelerator, or None for a single process without DeepSpeed.

    Raises:
        ConfigError: ``deepspeed_config`` without a launcher, or a file that is not JSON.
    """
    launched = "WORLD_SIZE" in os.environ
    if config.deepspeed_config is None and not launched:
        return None
    from accelerate import Accelerator  # optional heavy dependency, only under a launcher
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    if config.deepspeed_config is None:
        return Accelerator(cpu=not cuda)
    if not launched:
        raise ConfigError(
            "deepspeed_config needs a launcher: torchrun --nproc_per_node N -m rl_train run "
            "CONFIG.yaml (or accelerate launch --num_processes N -m rl_train run ...)"
        )
    path = Path(config.deepspeed_config)
    try:
        ds = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"deepspeed_config {str(path)!r} is not a readable JSON file: {exc}"
        ) from exc
    handlers = [] if cuda else [InitProcessGroupKwargs(backend="gloo")]
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds), kwargs_handlers=handlers)


def build_model(config: RunConfig) -> tuple[Any, Any]:
    """The model and tokenizer of ``config.model``.

    Args:
        config: The run configuration.

    Returns:
        ``(model, tokenizer)``: the embedded tiny pair (seeded by ``train.seed``), or a
        hub/local causal LM (a tokenizer without a pad token pads with EOS).

    Raises:
        ConfigError: An unknown dtype or a model that cannot be loaded.
    """
    if config.model.name == "tiny":
        tiny_tok = tiny_tokenizer()
        _set_chat_template(tiny_tok, config.model.chat_template)
        return tiny_model(len(tiny_tok), seed=config.train.seed), tiny_tok
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if config.model.dtype not in dtypes:
        raise ConfigError(
            f"model.dtype must be one of {sorted(dtypes)}, got {config.model.dtype!r}"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            config.model.name, dtype=dtypes[config.model.dtype]
        )
        tok = AutoTokenizer.from_pretrained(config.model.tokenizer or config.model.name)
    except OSError as exc:
        raise ConfigError(
            f"cannot load model {config.model.name!r}: {str(exc).splitlines()[0]}"
        ) from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    _set_chat_template(tok, config.model.chat_template)
    return model, tok


def _set_chat_template(tokenizer: Any, template: str | None) -> None:
    """``model.chat_template`` (the Jinja text, or a file holding it) onto ``tokenizer``."""
    if template is not None:
        text = Path(template).read_text() if _template_path(template) else template
        tokenizer.chat_template = text


def _tagged(completion: str, answer: str, question: str) -> float:
    """Exact match plus a 0.2 bonus for an ``<answer>...</answer>`` tag."""
    fmt = tagged_format_reward(completion, ("answer",), 0.2)
    return exact_match_reward(completion, answer, question) + fmt


#: The built-in rewards of ``data.reward``.
REWARDS: dict[str, RewardFn] = {
    "demo": demo_reward,
    "exact_match": exact_match_reward,
    "tagged": _tagged,
}


def build_reward(name: str, key: str = "data.reward") -> RewardFn:
    """The reward function ``data.reward`` names.

    Args:
        name: ``demo``, ``exact_match``, ``tagged`` or ``module:function``.
        key: What errors call the setting (``--reward`` for ``rl-train reward-server``).

    Returns:
        ``(completion, answer, question) -> float``.

    Raises:
        ConfigError: An unknown name, or a ``module:function`` that does not resolve.
    """
    if name in REWARDS:
        return REWARDS[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{key} {name!r} does not resolve: {exc}") from exc
        if not callable(fn):
            raise ConfigError(f"{key} {name!r} is not callable")
        return fn  # type: ignore[no-any-return]
    raise ConfigError(f"{key} must be demo, exact_match, tagged or module:function, got {name!r}")


def remote_reward(d: DataConfig) -> RemoteReward:
    """The client of ``data.reward_url`` in ``data.reward_protocol`` (with the timeout, retries)."""
    if d.reward_protocol == "openrlhf":
        from rl_envs.openrlhf_reward import OpenRLHFRemoteReward

        return OpenRLHFRemoteReward(
            d.reward_url or "", timeout=d.reward_timeout, retries=d.reward_retries
        )
    return RemoteReward(d.reward_url or "", timeout=d.reward_timeout, retries=d.reward_retries)


def build_rewards(config: RunConfig) -> list[RewardFn]:
    """The reward functions ``data.reward`` names (one name or a list), in order.

    Args:
        config: The run configuration.

    Returns:
        The functions (AgileRL, TRL or verl style; :mod:`rl_envs.reward_functions`).

    Raises:
        ConfigError: A name that does not resolve.
    """
    names = config.data.reward
    return [build_reward(n) for n in ([names] if isinstance(names, str) else names)]


def _last_tenth(train: Any) -> tuple[Any, Any]:
    """``(first 90%, last 10%)`` of ``train`` (at least one test row)."""
    cut = max(1, len(train) // 10)
    return train.select(range(len(train) - cut)), train.select(range(len(train) - cut, len(train)))


def _hub_datasets(config: RunConfig) -> tuple[Any, Any]:
    """``(train, test)`` of ``data.hub``; a failed download is a one-line ConfigError."""
    from datasets import load_dataset

    d = config.data
    assert d.hub is not None
    try:
        ds = load_dataset(d.hub, d.hub_config)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(
            f"data.hub {d.hub!r} could not be loaded ({type(exc).__name__}: {first[:200]}). "
            "Without network access, load it once where there is one (it is then cached; "
            "HF_DATASETS_OFFLINE=1 reads the cache), or save it to a .jsonl/.parquet file and "
            "set data.train_path instead"
        ) from exc
    if "train" not in ds:
        raise ConfigError(f"data.hub {d.hub!r} has no train split; its splits: {list(ds)}")
    if d.hub_test_split in ds:
        return ds["train"], ds[d.hub_test_split]
    return _last_tenth(ds["train"])


def _datasets(config: RunConfig) -> tuple[Any, Any]:
    """``(train, test)`` datasets of ``config.data``."""
    d = config.data
    from datasets import load_dataset  # heavy (pyarrow, pandas): only for files and the hub

    if d.hub is not None:
        return _hub_datasets(config)
    if d.train_path is not None:
        kind = DATA_FILE_KINDS.get(Path(d.train_path).suffix.lstrip("."))
        if kind is None or not Path(d.train_path).is_file():
            raise ConfigError(
                f"data.train_path {d.train_path!r} must be an existing .json, .jsonl, .csv or "
                ".parquet file"
            )
        train = load_dataset(kind, data_files=d.train_path)["train"]
        if d.test_path is not None:
            test_kind = DATA_FILE_KINDS.get(Path(d.test_path).suffix.lstrip("."), kind)
            return train, load_dataset(test_kind, data_files=d.test_path)["train"]
        return _last_tenth(train)
    if d.task not in available_tasks():
        raise ConfigError(
            f"unknown task {d.task!r}; built-in tasks: {', '.join(available_tasks())}"
        )
    return train_test_split_task(d.task, d.n_train, d.n_test, seed=config.train.seed)


def training_rows(config: RunConfig) -> list[dict[str, Any]]:
    """The training rows of ``config.data`` (a file, the hub or a built-in task) as dicts."""
    train, _ = _datasets(config)
    return list(train.to_list())


def build_env(
    config: RunConfig,
    tokenizer: Any,
    accelerator: Any = None,
    *,
    datasets: tuple[Any, Any] | None = None,
    rewards: list[RewardFn] | None = None,
) -> ReasoningGym:
    """The ``ReasoningGym`` of ``config.data``.

    Args:
        config: The run configuration.
        tokenizer: The model's tokenizer.
        accelerator: Shards the prompts by process when given.
        datasets: ``(train, test)`` datasets to use instead of loading ``config.data``'s.
        rewards: Reward functions to use instead of ``data.reward``'s.

    Returns:
        The environment (``data.prompts_per_step`` prompts per batch). Data with a
        ``data.prompt_column`` and no ``data.question_column``, or ``data.template: null``, is
        TRL-style prompt data (``template`` and ``system_prompt`` do not apply); otherwise
        question/answer data rendered with ``template``.

    Raises:
        ConfigError: An unknown task or reward, a bad data file, or data the environment
            refuses (the message says why).
    """
    d = config.data
    train, test = datasets if datasets is not None else _datasets(config)
    columns = list(getattr(train, "column_names", None) or [])
    template: list[dict[str, str]] | None = None
    prompt_data = d.prompt_column in columns and d.question_column not in columns
    if d.template is not None and not prompt_data:
        template = [{"role": "user", "content": d.template}]
        if d.system_prompt:
            template.insert(0, {"role": "system", "content": d.system_prompt})
    if rewards is None:
        rewards = build_rewards(config) if d.reward_url is None else [remote_reward(d)]
    try:
        return ReasoningGym(
            train,
            test,
            tokenizer,
            rewards,
            template,
            data_batch_size_per_gpu=d.prompts_per_step,
            max_context_length=d.max_prompt_length,
            seed=config.train.seed,
            question_column=d.question_column,
            answer_column=d.answer_column,
            accelerator=accelerator,
            reward_weights=None if d.reward_url is not None else d.reward_weights,
            reward_style=None if d.reward_style == "auto" or d.reward_url else d.reward_style,
            prompt_column=d.prompt_column,
        )
    except ValueError as exc:
        raise ConfigError(f"data: {exc}") from exc


def build_agent(
    config: RunConfig,
    model: Any,
    tokenizer: Any,
    accelerator: Any = None,
    *,
    lora_config: Any = None,
) -> Any:
    """The agent of ``config.algo`` (:func:`rl_algos.make_agent`).

    Args:
        config: The run configuration.
        model: The causal LM.
        tokenizer: Its tokenizer.
        accelerator: Shared with the environment under a launcher, or None.
        lora_config: A ``peft.LoraConfig`` to use instead of ``model.lora_*``'s (LoRA runs).

    Returns:
        The agent; full fine-tuning for the tiny model or ``model.full_finetune``, else LoRA.

    Raises:
        ConfigError: Arguments the agent does not take.
    """
    common: dict[str, Any] = {
        "actor_network": model,
        "pad_token_id": tokenizer.pad_token_id,
        "pad_token": tokenizer.pad_token,
        "tokenizer": tokenizer,
        "model_name": None if config.model.name in ("tiny", "") else config.model.name,
        "accelerator": accelerator,
    }
    if full_finetune(config):  # full_finetune=True comes with agent_kwargs (the run layer)
        pass
    elif lora_config is not None:
        common["lora_config"] = lora_config
    else:
        from peft import LoraConfig  # heavy: only with LoRA

        common["lora_config"] = LoraConfig(
            r=config.model.lora_r,
            lora_alpha=config.model.lora_alpha,
            target_modules=config.model.lora_target_modules,
            lora_dropout=0.0,
        )
    try:
        return make_agent(config.algo, **common, **agent_kwargs(config))
    except TypeError as exc:
        raise ConfigError(f"agent: {exc}") from exc


def build(
    config: RunConfig,
    *,
    distributed: bool = True,
    model: tuple[Any, Any] | None = None,
    datasets: tuple[Any, Any] | None = None,
    rewards: list[RewardFn] | None = None,
    lora_config: Any = None,
) -> Built:
    """Every piece of a run, in order.

    1. import the user's modules (``imports``), so what they register can be named;
    2. the accelerator (under a launcher or with DeepSpeed; ``distributed=False``: none);
    3. model and tokenizer;
    4. the environment (sharded by process under a launcher; none for an ``env:`` run, whose
       episodes :mod:`rl_train.env_run` makes from its own section);
    5. the agent.

    Objects a caller already holds (the TRL facade: a model, datasets, reward functions, a
    ``peft.LoraConfig``) replace the pieces ``config`` would load.

    Args:
        config: The run configuration.
        distributed: Build the accelerator (``rl-train eval`` and the trainers do not).
        model: ``(model, tokenizer)`` to use instead of loading ``config.model.name`` (with
            ``model.name: ""`` the agent gets no model name).
        datasets: ``(train, test)`` datasets to use instead of loading ``config.data``'s.
        rewards: Reward functions to use instead of ``data.reward``'s.
        lora_config: A ``peft.LoraConfig`` to use instead of ``model.lora_*``'s.

    Returns:
        The :class:`Built` pieces.
    """
    import_user_code(config.imports)
    accelerator = build_accelerator(config) if distributed else None
    lm, tokenizer = build_model(config) if model is None else model
    env = (
        build_env(config, tokenizer, accelerator, datasets=datasets, rewards=rewards)
        if config.env is None
        else None
    )
    agent = build_agent(config, lm, tokenizer, accelerator, lora_config=lora_config)
    if config.engine_url is not None and config.async_ is None:  # the worker has its own
        from rl_algos.server_sync import use_server  # sample on the server, push after updates

        use_server(agent, config.engine_url, accelerator, timeout=config.engine_timeout)
    return Built(config, accelerator, lm, tokenizer, env, agent)


@dataclass(frozen=True)
class ProcessShard:
    """Which shard of the prompts a data-parallel process trains on (its worker samples it)."""

    process_index: int
    """The trainer process's rank."""
    num_processes: int
    """The world size."""


def rollout_pieces(config: RunConfig, shard: ProcessShard | None = None) -> RolloutPieces:
    """The asynchronous rollout worker's agent and environment: :func:`build` without a launcher.

    Picklable as ``functools.partial(rollout_pieces, config)``, the factory the trainer hands
    to the worker process (``async:`` runs).

    Args:
        config: The run configuration (the trainer's).
        shard: Under a launcher (DDP), the trainer process's shard: the worker's
            ``ReasoningGym`` then serves the same prompts as that process's environment.

    Returns:
        A fresh agent and ``ReasoningGym`` configured like the trainer's.
    """
    built = build(config, distributed=False)
    env = built.env if shard is None else build_env(config, built.tokenizer, shard)
    assert env is not None  # async: runs have no env: section (rl_train.env_config)
    return RolloutPieces(built.agent, env)
