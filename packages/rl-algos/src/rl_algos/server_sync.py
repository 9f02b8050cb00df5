"""A rollout server as an agent's engine, kept at the trainer's weights.

:class:`ServerEngine` wraps an :class:`rl_rollout.RemoteEngine`: the agent generates through it
as through any engine, and after each update it sends the server the trained actor. A LoRA
actor moves its adapter only (:func:`actor_adapter`: peft's saved form, the tensors' bytes plus
a safetensors header, loaded in the server's memory by ``Engine.load_adapter``); a fully
fine-tuned one moves every weight (``Engine.update_weights``). Each LoRA push carries a version
(the number of pushes in the synchronous loop, the policy version in the asynchronous worker),
and every result the server returns carries the version it was sampled with: a result of any
other version stops the run instead of training on it. Under DDP the first process pushes and
every process waits for it before generating.

A clone of the agent (evolutionary HPO, ``agent.clone()``) samples on the same server through
:meth:`ServerEngine.twin`: the server serves one adapter at a time, so each engine sends its
own adapter, under its own name, whenever the server last loaded another engine's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["ADAPTER_NAME", "ServerEngine", "actor_adapter", "use_server"]

#: The name the actor adapter is served under.
ADAPTER_NAME = "actor"

_ACTOR = re.compile(r"(?P<module>.+)\.lora_(?P<part>[AB])\.actor\.weight")


def actor_adapter(policy: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The actor adapter of ``policy`` in peft's saved form, and its ``LoraConfig`` as a dict.

    Names are peft's (``base_model.model.<module>.lora_A.weight`` [r, in],
    ``...lora_B.weight`` [out, r]), as ``get_peft_model_state_dict`` writes them.

    Raises:
        ValueError: the policy is fully fine-tuned, or its actor adapter has weights other
            than linear LoRA factors (embedding adapters, DoRA magnitudes).
    """
    if policy.peft is None:
        raise ValueError("the policy is fully fine-tuned: it has no adapter to sync")
    tensors: dict[str, torch.Tensor] = {}
    for name, param in policy.peft.named_parameters():
        match = _ACTOR.fullmatch(name)
        if match is not None:
            tensors[f"{match['module']}.lora_{match['part']}.weight"] = param.detach()
        elif ".actor." in name or name.endswith(".actor"):
            raise ValueError(
                f"the actor adapter has {name!r}, which adapter sync cannot send (linear LoRA "
                "layers only): drop that target or sync full weights (model.full_finetune)"
            )
    return tensors, policy.peft.peft_config[ADAPTER_NAME].to_dict()


class _Served:
    """What the server holds, shared by the engines of one agent and its clones."""

    def __init__(self) -> None:
        self.by: ServerEngine | None = None
        """The engine whose actor the server loaded last (None: none yet)."""
        self.engines = 1
        """Engines made on this server so far (names the next twin's adapter)."""


class ServerEngine:
    """An agent's engine on a rollout server, synced with :meth:`push` (see the module doc).

    Args:
        remote: The server's client (:class:`rl_rollout.RemoteEngine`).
        policy: The agent's :class:`rl_adapters.PolicyModel` (its actor is what is sent).
        accelerator: Under DDP, the run's accelerator: the main process pushes, all wait.
        adapter_name: The name the actor adapter is served under.
        served: What the server holds, shared with the engines of clones (:meth:`twin`).
    """

    def __init__(
        self,
        remote: Any,
        policy: Any,
        accelerator: Any = None,
        adapter_name: str = ADAPTER_NAME,
        served: _Served | None = None,
    ) -> None:
        self.remote = remote
        self.policy = policy
        self.accelerator = accelerator
        self.adapter_name = adapter_name
        self.served = served if served is not None else _Served()
        self.lora = policy.peft is not None
        self.version = -1
        """The version last pushed (-1: none yet; the first ``generate`` pushes version 0)."""
        self.sync_bytes = 0
        """Request bytes of the last push (LoRA: the adapter's tensor bytes plus a header)."""
        self.sync_seconds = 0.0
        """Seconds the last push took (serialisation, transfer and the server's load)."""

    @property
    def base_url(self) -> str:
        """The server's URL."""
        return str(self.remote.base_url)

    def push(self, version: int) -> int:
        """Send the actor (LoRA: the adapter only) as ``version``; returns the bytes sent."""
        main = self.accelerator is None or self.accelerator.is_main_process
        start = time.perf_counter()
        if main and self.lora:
            tensors, config = actor_adapter(self.policy)
            self.remote.load_adapter(self.adapter_name, tensors, config, version)
            self.sync_bytes = int(self.remote.last_sync["bytes"])
        elif main:
            named = list(self.policy.causal_lm.named_parameters())
            self.remote.update_weights(named)
            self.sync_bytes = sum(p.numel() * p.element_size() for _, p in named)
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()  # nobody samples before the push landed
        self.sync_seconds = time.perf_counter() - start
        self.version = version
        self.served.by = self
        return self.sync_bytes if main else 0

    def twin(self, policy: Any) -> ServerEngine:
        """The engine of a clone whose actor is ``policy``: the same server and client.

        Its adapter has a name of its own (``actor-1``, ``actor-2``, ...) and is sent before
        the clone's first sample, and again whenever another engine's was loaded since; the
        version goes on from this engine's.
        """
        name = f"{ADAPTER_NAME}-{self.served.engines}"
        self.served.engines += 1
        other = ServerEngine(self.remote, policy, self.accelerator, name, self.served)
        other.version = max(self.version, 0)
        return other

    def apply_update(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Load trainer tensors (names in ``policy.causal_lm``) locally, then :meth:`push` them."""
        targets = dict(self.policy.causal_lm.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in targets:
                    raise KeyError(f"the worker's model has no parameter {name!r}")
                targets[name].copy_(tensor)
        return self.push(version)

    def generate(self, prompts: Any, params: Any) -> Any:
        """Sample on the server; a result of another adapter version raises ``RuntimeError``."""
        if self.version < 0:
            self.push(0)  # the weights as they are now (a resumed run's, too)
        elif self.served.by is not self:  # a clone's actor is on the server: send this one
            self.push(self.version)
        result = self.remote.generate(prompts, params)
        if self.lora and result.weight_version != self.version:
            raise RuntimeError(
                f"the rollout server at {self.base_url} sampled with adapter "
                f"{self.adapter_name!r} version {result.weight_version}, but this trainer pushed "
                f"version {self.version}: another run or client loads adapters into the same "
                "server; give each run its own server"
            )
        return result

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The server's full-weight sync."""
        self.remote.update_weights(named_tensors)

    def load_lora(self, name: str, path: str) -> None:
        """The server's path-based LoRA load."""
        self.remote.load_lora(name, path)

    def load_adapter(
        self,
        name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        version: int,
    ) -> None:
        """The server's in-memory adapter load."""
        self.remote.load_adapter(name, tensors, config, version)

    def sleep(self, level: int = 1) -> None:
        """Put the server's engine to sleep."""
        self.remote.sleep(level)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake the server's engine."""
        self.remote.wake_up(tags)


def use_server(agent: Any, url: str, accelerator: Any = None, timeout: float = 600.0) -> None:
    """Make ``agent`` generate on the rollout server at ``url`` (health-checked first).

    The agent's engine becomes a :class:`ServerEngine` over its policy; its
    ``merge_lora_for_generation`` is switched off, since the server samples and a local merge
    would only hold a copy of the adapted weights.

    Args:
        agent: An rl-algos agent.
        url: ``http://host:port`` of an ``rl-rollout-server`` serving the policy's base model.
        accelerator: Under DDP, the run's accelerator.
        timeout: Seconds any call (generation, each weight-sync try) may take.

    Raises:
        ValueError: the agent replays the sampler's routes (``router_replay="R3"``) and the
            server does not record them.
    """
    from rl_algos.generation import remote_engine

    remote = remote_engine(url, timeout)
    if getattr(agent.config, "router_replay", None) == "R3" and not remote.health().get(
        "record_routes"
    ):
        raise ValueError(
            f"router_replay='R3' replays the experts the sampler routed each token to, and the "
            f"rollout server at {url} does not return them: start it with --record-routes "
            "(rl-rollout-server --engine hf --record-routes), or use router_replay='R2'"
        )
    agent.engine = ServerEngine(remote, agent.policy, accelerator)
    agent.config.merge_lora_for_generation = False
