"""The checks of a run configuration that its types cannot express, once its sections are built.

:func:`_check` takes the values the types do not pin: the algorithm and engine names, the
rollout server's URL and the settings it excludes, the ``imports`` list, the reward functions
with their weights and styles, the reward server's URL, the ``env:`` section and the trackers;
:func:`_check_explicit` the settings that are ignored or contradict each other, refused or
warned about according to where they were set (the YAML file or the command line).
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rl_algos.names import ALGORITHM_SPECS

from rl_train._config_agent import _check_algorithm, _unknown_algorithm
from rl_train.env_config import check_env
from rl_train.trackers import check_report_to
from rl_train.user_code import ConfigError

if TYPE_CHECKING:
    from rl_train._config_yaml import _Given
    from rl_train.config import DataConfig, RunConfig


#: The values of ``data.reward_style``.
REWARD_STYLES = ("auto", "agilerl", "trl", "verl", "openrlhf")
REWARD_PROTOCOLS = ("rl-envs", "openrlhf")


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


def _check_reward_url(d: DataConfig) -> None:
    """``data.reward_url`` and its timeout and retries, checked without connecting."""
    if d.reward_protocol not in REWARD_PROTOCOLS:
        raise ConfigError(
            f"data.reward_protocol {d.reward_protocol!r} is unknown: use "
            f"{' or '.join(REWARD_PROTOCOLS)}"
        )
    if d.reward_protocol != "rl-envs" and d.reward_url is None:
        raise ConfigError(
            f"data.reward_protocol {d.reward_protocol!r} needs data.reward_url (the server's "
            "endpoint); remove it or set the URL"
        )
    if d.reward_url is not None:
        parts = urlsplit(d.reward_url)
        try:
            port = parts.port
        except ValueError:
            port = None
        openrlhf = d.reward_protocol == "openrlhf"
        want = "'http://host:port/path'" if openrlhf else "'http://host:port'"
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise ConfigError(f"data.reward_url must look like {want}, got {d.reward_url!r}")
        if openrlhf and parts.path in ("", "/"):
            raise ConfigError(
                f"data.reward_url {d.reward_url!r} names no endpoint: an OpenRLHF reward server "
                "answers on a path, e.g. http://host:5000/get_reward"
            )
        if not openrlhf and parts.path not in ("", "/"):
            raise ConfigError(
                f"data.reward_url {d.reward_url!r} has a path: rl-train reward-server answers "
                "on http://host:port; for an OpenRLHF reward server set "
                "data.reward_protocol: openrlhf"
            )
    if not d.reward_timeout > 0:
        raise ConfigError(f"data.reward_timeout must be > 0 seconds, got {d.reward_timeout}")
    if d.reward_retries < 0:
        raise ConfigError(f"data.reward_retries must be >= 0, got {d.reward_retries}")


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
            changed = getattr(config.model, key) != getattr(type(config.model)(), key)
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
