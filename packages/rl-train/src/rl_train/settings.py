"""Where each agent setting of a run comes from: one default per layer, overrides on top.

An agent setting is, from the lowest layer to the highest:

1. ``agent default``: the field's default in the agent's typed config
   (:class:`rl_algos.AgentConfig` and the subclass of the algorithm's agent class);
2. ``preset``: the algorithm row's overrides (:data:`rl_algos.names.ALGORITHM_SPECS`);
3. ``tiny model``: :data:`rl_train.tiny.TINY_AGENT`, when ``model.name`` is ``tiny``;
4. ``run``: values the run config's other sections decide: ``seed`` (``train.seed``),
   ``use_vllm`` (``engine``), ``full_finetune`` (``model``), for an online algorithm
   ``batch_size = prompts_per_step x G`` (:func:`rl_algos.names.batch_rows`, ``G = 1`` for an
   algorithm that is not grouped) and, under full fine-tuning, a critic that shares the
   actor's trunk (``critic_mode: shared``);
5. ``YAML`` and ``command line``: the run config's ``agent:`` section.

:func:`agent_kwargs` is what :func:`rl_train.builder.build_agent` passes to
:func:`rl_algos.make_agent` (layers 3-5; :func:`~rl_algos.make_agent` adds the preset's);
:func:`resolved_settings` lists every setting of a run with its value and layer
(``rl-train run --print-config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rl_algos.names import FromArg, batch_rows, get_spec

from rl_train.config import RunConfig

__all__ = [
    "Setting",
    "agent_kwargs",
    "full_finetune",
    "group_size",
    "resolved_settings",
    "yaml_keys",
]


@dataclass(frozen=True)
class Setting:
    """One resolved value of a run and the layer it comes from."""

    key: str
    """The dotted key (``train.steps``, ``agent.lr``)."""
    value: Any
    """The value the run uses."""
    source: str
    """``default``, ``agent default``, ``preset``, ``tiny model``, ``run``, ``YAML`` or
    ``command line`` (``run config``: an ``agent:`` value set in Python)."""


def full_finetune(config: RunConfig) -> bool:
    """Whether the run trains every weight: ``model.full_finetune``, or the tiny model."""
    return config.model.full_finetune or config.model.name == "tiny"


def _tiny(config: RunConfig) -> Mapping[str, Any]:
    if config.model.name != "tiny":
        return {}
    from rl_train.tiny import TINY_AGENT  # torch: the tiny model's module

    return TINY_AGENT


def _config_defaults(algo: str) -> dict[str, Any]:
    """The field defaults of the typed config of ``algo``'s agent."""
    from rl_algos import get_preset  # torch: the agent classes

    fields = dataclasses.fields(get_preset(algo).agent.config_class)
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in fields
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def group_size(config: RunConfig) -> int:
    """``G``, the completions per prompt (1 for an algorithm that is not grouped).

    Else the highest layer's ``group_size``: ``agent:``, the tiny model, the preset, the config.
    """
    spec = get_spec(config.algo)
    if not spec.grouped:
        return 1
    for layer in (config.agent, _tiny(config), spec.defaults):
        if "group_size" in layer:
            return int(layer["group_size"])
    return int(_config_defaults(config.algo)["group_size"])


#: Why the run sets each value of layer 4 (shown by ``--print-config``).
_RUN_REASONS = {
    "seed": "train.seed",
    "use_vllm": "engine",
    "full_finetune": "model",
    "batch_size": "data.prompts_per_step x G",
    "critic_mode": "a LoRA critic needs a LoRA actor",
}


def _run_layer(config: RunConfig) -> dict[str, Any]:
    """The values the run derives (layer 4)."""
    out: dict[str, Any] = {"seed": config.train.seed, "use_vllm": config.engine == "vllm"}
    if get_spec(config.algo).online:  # offline data has no prompts per step
        out["batch_size"] = batch_rows(config.data.prompts_per_step, group_size(config))
    if full_finetune(config):
        out["full_finetune"] = True
        if get_spec(config.algo).critic:
            out["critic_mode"] = "shared"
    return out


def agent_kwargs(config: RunConfig) -> dict[str, Any]:
    """The agent settings of ``config`` above the preset: tiny model, run, then ``agent:``.

    Args:
        config: The run configuration.

    Returns:
        Keyword arguments for :func:`rl_algos.make_agent` (model, tokenizer and LoRA aside);
        ``group_size`` is left out for an algorithm that is not grouped.
    """
    kwargs = {**_tiny(config), **_run_layer(config), **config.agent}
    if not get_spec(config.algo).grouped:
        kwargs.pop("group_size", None)
    return kwargs


def yaml_keys(path: str | Path | None) -> frozenset[str]:
    """The dotted keys a YAML config file sets (``train.steps``, ``agent.lr``)."""
    if path is None:
        return frozenset()
    tree = yaml.safe_load(Path(path).read_text()) or {}

    def walk(node: Any, prefix: str) -> list[str]:
        if not isinstance(node, dict) or not node:
            return [prefix[:-1]]
        return [k for key, value in node.items() for k in walk(value, f"{prefix}{key}.")]

    return frozenset(walk(tree, ""))


def _source(key: str, yaml_set: Collection[str], command_line: Collection[str]) -> str | None:
    if key in command_line:
        return "command line"
    if key in yaml_set:
        return "YAML"
    return None


def resolved_settings(
    config: RunConfig, yaml_set: Collection[str] = (), command_line: Collection[str] = ()
) -> list[Setting]:
    """Every setting of the run, its value and its layer.

    Args:
        config: The loaded run configuration.
        yaml_set: Dotted keys the YAML file set (:func:`yaml_keys`).
        command_line: Dotted keys the ``key=value`` arguments set.

    Returns:
        The run config's sections (``default``, ``YAML``, ``command line``), then every field
        of the agent's typed config (values as the agent config resolves them).
    """
    from rl_algos import get_preset  # torch: the agent classes

    out: list[Setting] = []

    def sections(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            key, value = f"{prefix}{f.name}".replace("async_", "async"), getattr(obj, f.name)
            if key == "agent":
                continue
            if dataclasses.is_dataclass(value):
                sections(value, f"{key}.")
            else:
                source = _source(key, yaml_set, command_line) or "default"
                out.append(Setting(key, value, source))

    sections(config, "")
    preset = get_preset(config.algo)
    kwargs = agent_kwargs(config)
    resolved = preset.resolve(kwargs)
    layers: list[tuple[str, Mapping[str, Any]]] = [
        ("agent default", _config_defaults(config.algo)),
        ("preset", {k: v for k, v in preset.defaults.items() if k not in kwargs}),
        ("tiny model", _tiny(config)),
        ("run", _run_layer(config)),
    ]
    typed = preset.agent.config_class(**{k: v for k, v in resolved.items() if k in layers[0][1]})
    for name in layers[0][1]:
        key = f"agent.{name}"
        if name in config.agent:
            source = _source(key, yaml_set, command_line) or "run config"
        else:
            source = next((s for s, layer in reversed(layers) if name in layer), "agent default")
        default = preset.defaults.get(name)
        if source == "preset" and isinstance(default, FromArg):
            source = f"preset (= {default.name})"
        elif source == "run":
            source = f"run ({_RUN_REASONS[name]})"
        out.append(Setting(key, getattr(typed, name), source))
    return out
