"""The ``env:`` section of a run config: train on a multi-turn environment instead of prompts.

One of four sources (torch-free: checked when the YAML is read):

* ``openenv: "module:EnvClass"``: an OpenEnv ``Environment`` class (or a function that builds
  one), run in-process (:class:`rl_envs.openenv.OpenEnvWrapper`);
* ``openenv_url: "http://host:port"``: the same environment served by OpenEnv's
  ``create_app``, driven over its WebSocket by ``EnvClient``;
* ``verifiers: "module:taskset"`` (or a module with ``load_taskset()``): a ``verifiers`` v1
  ``Taskset``, each task one episode (:mod:`rl_envs.verifiers`);
* ``openrlhf_agent: "module:AgentInstance"``: OpenRLHF's agent class (``--agent_func_path``),
  one instance per episode on the rows of ``data`` (``data.prompt_column``,
  ``data.answer_column`` as its label; :mod:`rl_envs.openrlhf_agent`).

Each step plays ``data.prompts_per_step`` tasks x ``G`` episodes to their end and learns from
them with per-turn rewards (:class:`rl_train.sources.MultiTurnSource`); ``data`` then only
sets ``prompts_per_step`` (and, for ``openrlhf_agent``, the rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rl_train.user_code import ConfigError

__all__ = ["EnvConfig", "check_env"]


@dataclass
class EnvConfig:
    """A multi-turn environment (YAML ``env:``)."""

    openenv: str | None = None
    """``module:EnvClass``: an OpenEnv ``Environment`` class or factory, run in-process."""
    openenv_url: str | None = None
    """``http://host:port`` of an OpenEnv ``create_app`` server (its ``max_concurrent_envs``
    must be at least ``prompts_per_step x G``)."""
    verifiers: str | None = None
    """``module:attribute`` of a ``verifiers`` v1 ``Taskset`` (or a function returning one), or
    a module with ``load_taskset(**kwargs)``."""
    openrlhf_agent: str | None = None
    """``module:AgentInstance``: OpenRLHF's agent class, run on ``data``'s rows (episodes of at
    most ``max_turns`` steps, OpenRLHF's ``max_steps``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment class / factory or of ``load_taskset``."""
    action: str | None = None
    """OpenEnv: ``module:function`` mapping the model's text to an ``Action`` (default: the
    action class's one string field)."""
    observation: str | None = None
    """OpenEnv: ``module:function`` mapping an ``Observation`` to the next user message
    (default: :func:`rl_envs.openenv.observation_text`)."""
    action_class: str | None = None
    """OpenEnv: ``module:Class`` of the actions (needed with ``openenv_url`` unless ``action``
    is given; in-process it is read from ``step``'s annotation)."""
    observation_class: str | None = None
    """OpenEnv with ``openenv_url``: ``module:Class`` the served observations are rebuilt as
    (None: plain dicts)."""
    max_turns: int = 3
    """Most model turns per episode (an environment that never ends is truncated here)."""
    timeout: float = 30.0
    """OpenEnv server: seconds to connect and to wait for each reply."""
    system_prompt: str | None = None
    """An optional system message in front of every episode."""
    eval_episodes: int = 32
    """Episodes of the greedy evaluation (mean return) before, during and after training."""


def check_env(env: EnvConfig | None, algo_online: bool, *, asynchronous: bool = False) -> None:
    """Values of ``env:`` the types do not pin (no import happens here).

    Raises:
        ConfigError: not exactly one source, a malformed name or URL, a bad number, an
            ``async:`` section (env runs are synchronous).
    """
    if env is None:
        return
    if asynchronous:
        raise ConfigError("env: runs are synchronous; remove the async section")
    sources = [
        k
        for k in ("openenv", "openenv_url", "verifiers", "openrlhf_agent")
        if getattr(env, k) is not None
    ]
    if len(sources) != 1:
        raise ConfigError(
            "env: set exactly one of openenv (module:EnvClass), openenv_url (http://host:port), "
            f"verifiers (module:taskset) and openrlhf_agent (module:AgentInstance); got "
            f"{sources or 'none'}"
        )
    if not algo_online:
        raise ConfigError("env: an offline algorithm learns from data.offline_path, not an env")
    if env.openrlhf_agent is not None:
        _check_openrlhf(env)
    for key in ("openenv", "openrlhf_agent", "action", "observation", "action_class",
                "observation_class"):  # fmt: skip
        value = getattr(env, key)
        if value is not None and (":" not in value or value.startswith(":")):
            raise ConfigError(f"env.{key} must look like 'module:name', got {value!r}")
    if env.openenv_url is not None:
        _check_url(env)
    if env.max_turns < 1:
        raise ConfigError(f"env.max_turns must be >= 1, got {env.max_turns}")
    if not env.timeout > 0:
        raise ConfigError(f"env.timeout must be > 0 seconds, got {env.timeout}")
    if env.eval_episodes < 1:
        raise ConfigError(f"env.eval_episodes must be >= 1, got {env.eval_episodes}")


def _check_openrlhf(env: EnvConfig) -> None:
    """Keys that do not apply to ``openrlhf_agent``, refused by name."""
    given = [k for k in ("action", "observation", "action_class", "observation_class",
                         "system_prompt") if getattr(env, k) is not None]  # fmt: skip
    if env.kwargs:
        given.append("kwargs")
    if given:
        raise ConfigError(
            f"env.{given[0]} does not apply to env.openrlhf_agent (OpenRLHF builds "
            "AgentInstance() without arguments and its prompt is the data's); remove it"
        )


def _check_url(env: EnvConfig) -> None:
    """``openenv_url`` an http(s)/ws(s) URL, with the action class or function it needs."""
    assert env.openenv_url is not None
    parts = urlsplit(env.openenv_url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise ConfigError(
            f"env.openenv_url must look like 'http://host:port', got {env.openenv_url!r}"
        )
    if env.action is None and env.action_class is None:
        raise ConfigError(
            "env.openenv_url needs env.action_class (module:Class of the actions) or "
            "env.action (module:function text -> action)"
        )
