"""Checkpoints, clones, populations and hyperparameter mutation of an agent.

Checkpoints hold no pickle: adapters (or all weights) and extra heads in safetensors, the
optimizer, schedule and agent state in JSON (:func:`rl_adapters.save_checkpoint`), written
atomically. Distributed, every process calls :func:`save_agent` (ZeRO-3 gathers) and process 0
writes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import warnings
from pathlib import Path
from typing import Any

import torch
from rl_adapters import load_checkpoint, save_checkpoint

from rl_algos.distributed import (
    deepspeed_plugin,
    ensure_deepspeed,
    gathered,
    is_main_process,
    world_size,
)
from rl_algos.server_sync import ServerEngine

__all__ = [
    "agent_state",
    "check_hp_config",
    "clone_agent",
    "load_agent",
    "load_agent_state",
    "mutate_hyperparameter",
    "save_agent",
    "shared_base_memo",
    "subclasses",
]


def agent_state(agent: Any) -> dict[str, Any]:
    """The JSON state of ``agent``: counters, fitness, RNGs and its constructor keywords."""
    return {
        "algo": agent.algo_name,
        "class": type(agent).__name__,
        "index": agent.index,
        "steps": agent.steps,
        "reference_updates": agent.reference_updates,
        "fitness": agent.fitness,
        "scores": agent.scores,
        "lr": agent.lr,
        "beta": agent.beta,
        "mutation_history": agent.mutation_history,
        "python_rng": list(agent._rng.getstate()[1]),
        "python_rng_pos": agent._rng.getstate()[2],
        "torch_rng": agent._torch_rng.get_state().tolist(),
        "init_kwargs": agent._init_kwargs,
    }


def load_agent_state(agent: Any, state: dict[str, Any]) -> None:
    """Restore what :func:`agent_state` wrote."""
    agent.index, agent.steps = int(state["index"]), int(state["steps"])
    agent.reference_updates = int(state["reference_updates"])
    agent.fitness, agent.scores = list(state["fitness"]), list(state["scores"])
    agent.mutation_history = list(state["mutation_history"])
    agent._rng.setstate((3, tuple(int(x) for x in state["python_rng"]), state["python_rng_pos"]))
    agent._torch_rng.set_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))


def _optimizer(agent: Any, wanted: bool) -> torch.optim.Optimizer | None:
    if wanted and agent.learner.uses_deepspeed:
        if not agent.learner.warned_optimizer:
            agent.learner.warned_optimizer = True
            warnings.warn(
                "optimizer state is not saved or loaded under DeepSpeed (its partitions are "
                "per-rank); a resumed run restarts AdamW's moments",
                RuntimeWarning,
                stacklevel=4,
            )
        return None
    optimizer: torch.optim.Optimizer | None = agent.optimizer if wanted else None
    return optimizer


def save_agent(
    agent: Any, path: str | Path, save_optimizer: bool, heads: dict[str, Any] | None = None
) -> Path:
    """Save ``agent`` (and extra ``heads`` modules) to ``path`` atomically; see the module."""
    optimizer = _optimizer(agent, save_optimizer)
    with gathered(agent.saved_parameters(), enabled=agent.learner.zero_stage == 3):
        if is_main_process():
            save_checkpoint(
                agent.policy,
                path,
                optimizer=optimizer,
                scheduler=agent.lr_scheduler if save_optimizer else None,
                state=agent_state(agent),
                heads=heads or None,
            )
    if world_size() > 1:
        torch.distributed.barrier()
    return Path(path)


def load_agent(
    agent: Any, path: str | Path, load_optimizer: bool, heads: dict[str, Any] | None = None
) -> None:
    """Restore what :func:`save_agent` wrote (loading never executes code).

    Under DeepSpeed every process loads the weights (ZeRO-3 partitions process 0's copy) and
    DeepSpeed's fp32 master weights are refreshed from them; optimizer state is not loaded.
    """
    ds = ensure_deepspeed(agent)
    if load_optimizer and not (Path(path) / "optimizer.json").is_file():
        warnings.warn(
            f"{path} holds no optimizer state (saved under DeepSpeed or with "
            "save_optimizer=False): AdamW starts from fresh moments",
            RuntimeWarning,
            stacklevel=3,
        )
        load_optimizer = False
    optimizer = _optimizer(agent, load_optimizer)
    params = agent.saved_parameters()
    with gathered(params, enabled=agent.learner.zero_stage == 3, modifier_rank=0):
        state = load_checkpoint(
            agent.policy,
            path,
            optimizer=optimizer,
            scheduler=agent.lr_scheduler if load_optimizer else None,
            heads=heads or None,
        )
    if ds is not None:
        ds.optimizer.refresh_fp32_params()
    load_agent_state(agent, state)


def read_state(path: str | Path) -> dict[str, Any]:
    """The ``state.json`` of an agent checkpoint.

    Raises:
        ValueError: ``path`` is not an agent checkpoint, or its state is not JSON.
    """
    state_file = Path(path) / "state.json"
    if not state_file.is_file():
        raise ValueError(f"{path} is not an agent checkpoint (no state.json)")
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{state_file} is not readable JSON: {exc}") from exc
    if not isinstance(state, dict):
        raise ValueError(f"{state_file} must hold a JSON object")
    return state


def shared_base_memo(agent: Any) -> dict[int, Any]:
    """``deepcopy`` memo that keeps the frozen base weights shared (LoRA mode).

    Clones then hold their own adapters (actor, reference, critic), value head and optimizer
    state, but point at the same base tensors: a population costs one base plus one set of
    adapters per member, not a full model per member.
    """
    if agent.policy.peft is None:
        return {}
    memo: dict[int, Any] = {}
    for name, p in agent.policy.named_parameters():
        if not p.requires_grad and ".lora_" not in name and "value_head" not in name:
            memo[id(p)] = p
    for _, b in agent.policy.named_buffers():
        memo[id(b)] = b
    return memo


def clone_agent(agent: Any, index: int | None) -> Any:
    """An independent copy: its own adapters (or weights), heads, optimizer state and RNGs."""
    if agent.learner.ds_engine is not None or deepspeed_plugin(agent.accelerator) is not None:
        raise ValueError(
            "clone() and population() are not supported under DeepSpeed (ZeRO owns one "
            "model and optimizer per process): use DDP or a single process for HPO"
        )
    twin = copy.copy(agent)
    object.__setattr__(twin, "config", copy.copy(agent.config))
    memo = shared_base_memo(agent)
    twin.policy = copy.deepcopy(agent.policy, memo)
    twin.extra_modules = {k: copy.deepcopy(m, memo) for k, m in agent.extra_modules.items()}
    if isinstance(agent.engine, ServerEngine):  # on a rollout server: its own adapter there
        twin.engine = agent.engine.twin(twin.policy)
    else:
        twin.engine = agent.make_engine(twin.policy)
    twin._rng = random.Random()
    twin._rng.setstate(agent._rng.getstate())
    twin._torch_rng = torch.Generator().manual_seed(0)
    twin._torch_rng.set_state(agent._torch_rng.get_state())
    twin.fitness, twin.scores = list(agent.fitness), list(agent.scores)
    twin.mutation_history = list(agent.mutation_history)
    if agent.router_balance is not None or agent.router_replayer is not None:
        twin.router_balance, twin.router_replayer = twin._build_routers()  # own hooks
    twin.learner = twin.build_learner()
    twin.optimizer.load_state_dict(agent.optimizer.state_dict())
    if index is not None:
        twin.index = index
    return twin


def _with_value(config: Any, name: str, value: float, dtype: type) -> Any:
    """``config`` with ``name = value``, checked as the constructor checks it.

    The checks are the config's ``__post_init__`` and its
    :meth:`~rl_algos.config.AgentConfig.ignored_options`.
    """
    new = dataclasses.replace(config, **{name: int(value) if dtype is int else value})
    ignored: dict[str, str] = new.ignored_options()
    if ignored:
        raise ValueError(next(iter(ignored.values())))
    return new


def check_hp_config(agent: str, hp_config: Any, config: Any) -> None:
    """Refuse, when the agent is built, an ``hp_config`` its mutations could not apply.

    Each name must be a numeric field of the agent's config (``lr``, ``beta``, ``group_size``,
    ...), and both bounds of its :class:`~rl_algos.config.RLParameter` must be values the config
    accepts, so that no mutation (clipped to the bounds) makes a value the agent would have
    refused at construction.

    Raises:
        ValueError: Naming the hyperparameter, the bound and the config's own error.
    """
    if hp_config is None:
        return
    declared = {f.name: str(f.type) for f in dataclasses.fields(config)}
    for name, spec in hp_config.params.items():
        if name not in declared:
            numeric = sorted(
                f
                for f in declared
                if isinstance(getattr(config, f), int | float)
                and not isinstance(getattr(config, f), bool)
            )
            raise ValueError(
                f"hp_config: {name!r} is not a hyperparameter of {agent}; mutable ones are its "
                f"numeric settings: {', '.join(numeric)}"
            )
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"hp_config: {agent}.{name} is {value!r}; only numeric settings mutate "
                "(RLParameter multiplies them)"
            )
        if declared[name].split("|")[0].strip() == "int" and spec.dtype is not int:
            raise ValueError(
                f"hp_config: {agent}.{name} is an integer; pass RLParameter(..., dtype=int)"
            )
        for bound, at in (("min", spec.min), ("max", spec.max)):
            try:
                _with_value(config, name, at, spec.dtype)
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    f"hp_config: {name}'s RLParameter {bound}={at} is a value {agent} refuses "
                    f"({exc}); narrow the bounds"
                ) from exc


def mutate_hyperparameter(agent: Any, rng: random.Random | None) -> dict[str, Any]:
    """Mutate one hyperparameter from ``agent.hp_config``; logged in ``mutation_history``.

    The new value is checked by the agent's config as a constructor argument would be (a
    value refused together with the other settings raises, naming both, and nothing changes).
    """
    if agent.hp_config is None:
        raise ValueError("this agent has no hp_config: nothing to mutate")
    rng = rng or agent._rng
    name = agent.hp_config.sample(rng)
    spec = agent.hp_config.params[name]
    before = getattr(agent, name)
    after = spec.mutate(float(before), rng)
    try:
        _with_value(agent.config, name, after, spec.dtype)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"hp_config: mutating {name} from {before} to {after} makes a configuration "
            f"{type(agent).__name__} refuses ({exc}); narrow the RLParameter's bounds"
        ) from exc
    setattr(agent, name, int(after) if spec.dtype is int else after)
    if name == "lr":  # the actor's parameter group (the first)
        agent.optimizer.param_groups[0]["lr"] = after
    record = {"step": agent.steps, "param": name, "before": before, "after": getattr(agent, name)}
    agent.mutation_history.append(record)
    return record


def subclasses(root: type) -> dict[str, type]:
    """Every class derived from ``root`` that has been imported, by class name (``root`` too)."""
    found: dict[str, type] = {root.__name__: root}
    todo: list[type] = [root]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub.__name__ not in found:
                found[sub.__name__] = sub
                todo.append(sub)
    return found


def load_new_agent(
    cls: Any,
    registry: dict[str, Any],
    path: str | Path,
    actor_network: Any,
    device: Any,
    accelerator: Any,
    overrides: dict[str, Any],
) -> Any:
    """``cls.load``: rebuild the checkpoint's agent, then load its weights.

    The class is the checkpoint's (a subclass of ``cls``, looked up in ``registry``); the
    constructor arguments are its JSON ones, ``overrides`` winning.
    """
    state = read_state(path)
    klass: Any = registry.get(str(state.get("class")), cls)
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
