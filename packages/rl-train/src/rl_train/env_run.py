"""``rl-train run`` with an ``env:`` section: episodes of an OpenEnv, verifiers or OpenRLHF agent.

:func:`env_factory` turns ``config.env`` into the picklable factory of token-level episodes
that :func:`rl_train.finetune_llm_multiturn` plays; :func:`fit_episodes` is
:func:`rl_train.run.fit` for such a run, reporting the greedy mean episode return before and
after training.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_train.checkpoint import resume, resume_point
from rl_train.collective import is_main_process
from rl_train.config import ConfigError, RunConfig, to_dict
from rl_train.evaluation import greedy_return
from rl_train.loops import finetune_llm_multiturn

if TYPE_CHECKING:
    from rl_train.builder import Built

__all__ = ["env_factory", "fit_episodes", "greedy_episode_return", "max_turns", "resolve"]


def resolve(key: str, name: str) -> Any:
    """The object ``module:attribute`` names (``key``: the config key, for the error)."""
    module_name, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
    except ImportError as exc:
        raise ConfigError(f"{key} {name!r} does not resolve: {exc}".splitlines()[0]) from exc
    except AttributeError as exc:
        raise ConfigError(f"{key} {name!r} does not resolve: {exc}") from exc
    return obj


def _optional(key: str, name: str | None) -> Any:
    return None if name is None else resolve(key, name)


def _require(module: str, extra: str, key: str) -> None:
    """A missing extra as a one-line ConfigError naming it (``rl-train run`` prints it)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != module.partition(".")[0]:
            raise
        raise ConfigError(
            f"{key} needs the {extra!r} extra: pip install 'rl-envs[{extra}]'"
        ) from None


def max_turns(config: RunConfig) -> int:
    """Model turns per episode: ``env.max_turns``; 1 for a verifiers taskset (one call)."""
    assert config.env is not None
    return 1 if config.env.verifiers is not None else config.env.max_turns


def env_factory(config: RunConfig, tokenizer: Any, agent: Any) -> Callable[[], Any]:
    """A picklable factory of one episode's token wrapper for ``config.env``.

    Args:
        config: The run configuration (``env`` set).
        tokenizer: The model's tokenizer.
        agent: The agent (its ``max_model_len`` and ``max_output_tokens`` size the episodes).

    Returns:
        ``() -> TokenObservationWrapper`` (an :class:`rl_envs.openenv.OpenEnvWrapper`, a
        :class:`rl_envs.verifiers.TasksetEnvWrapper`, or OpenRLHF's agent in
        :func:`rl_envs.openrlhf_agent.openrlhf_agent_env`).

    Raises:
        ConfigError: A name that does not resolve.
    """
    e = config.env
    assert e is not None
    max_model_len = int(agent.max_model_len)
    common: dict[str, Any] = {
        "max_turns": max_turns(config),
        "pad_id": int(tokenizer.eos_token_id),  # a sampled pad id stays a token
        "max_model_len": max_model_len,
        "max_output_tokens": int(agent.max_output_tokens or max_model_len // 2),
        "system_prompt": e.system_prompt,
    }
    if e.openrlhf_agent is not None:
        return _openrlhf_factory(config, tokenizer, common)
    if e.verifiers is not None:
        _require("verifiers.v1", "verifiers", "env.verifiers")
        from rl_envs.verifiers import TasksetEnvWrapper, load_taskset, tasks

        try:
            loaded = tasks(load_taskset(e.verifiers, **e.kwargs))
        except ValueError as exc:
            raise ConfigError(f"env.verifiers {e.verifiers!r}: {exc}") from exc
        return functools.partial(TasksetEnvWrapper, loaded, tokenizer, **common)
    _require("openenv.core", "openenv", "env.openenv" if e.openenv else "env.openenv_url")
    from rl_envs.openenv import OpenEnvWrapper

    environment = None
    if e.openenv is not None:
        environment = resolve("env.openenv", e.openenv)
        if e.kwargs:
            environment = functools.partial(environment, **e.kwargs)
    return functools.partial(
        OpenEnvWrapper,
        environment,
        tokenizer,
        url=e.openenv_url,
        action=_optional("env.action", e.action),
        observation=_optional("env.observation", e.observation),
        action_cls=_optional("env.action_class", e.action_class),
        observation_cls=_optional("env.observation_class", e.observation_class),
        timeout=e.timeout,
        **common,
    )


def _openrlhf_factory(
    config: RunConfig, tokenizer: Any, common: dict[str, Any]
) -> Callable[[], Any]:
    """OpenRLHF's ``AgentInstance`` on the training rows of ``config.data``."""
    from rl_envs.openrlhf_agent import openrlhf_agent_env

    from rl_train.builder import training_rows

    assert config.env is not None
    assert config.env.openrlhf_agent is not None
    agent_cls = resolve("env.openrlhf_agent", config.env.openrlhf_agent)
    if not isinstance(agent_cls, type):
        raise ConfigError(
            f"env.openrlhf_agent {config.env.openrlhf_agent!r} is a {type(agent_cls).__name__}, "
            "not a class: name OpenRLHF's AgentInstance class"
        )
    return functools.partial(
        openrlhf_agent_env,
        agent_cls,
        tokenizer,
        training_rows(config),
        max_steps=common["max_turns"],
        pad_id=common["pad_id"],
        max_model_len=common["max_model_len"],
        max_output_tokens=common["max_output_tokens"],
        prompt_column=config.data.prompt_column,
        label_column=config.data.answer_column,
    )


def fit_episodes(
    built: Built, *, verbose: bool = True, say: Callable[[str], None]
) -> tuple[float, float]:
    """:func:`rl_train.run.fit` for an ``env:`` run: greedy mean return, train, return again.

    The evaluation plays ``env.eval_episodes`` fresh tasks (seeds from 10**6, never trained
    on) greedily; :func:`rl_train.run.fit` reports the two mean returns as its Summary's
    ``accuracy_before`` / ``accuracy_after``.

    Args:
        built: What :func:`rl_train.run.prepare` built (its ``env`` is None).
        verbose: Show progress.
        say: Where the report lines go (process 0).

    Returns:
        ``(mean return before, mean return after)``; a resumed run: the return at the
        checkpoint it resumes from first, and NaN for both when it had already finished.
    """
    config, agent = built.config, built.agent
    assert config.env is not None  # and no async: section (rl_train.env_config.check_env)
    t = config.train
    run_dir = Path(t.run_dir)
    main = is_main_process()
    report = say if main else (lambda _: None)
    checkpoint = resume_point(config, report)
    if checkpoint is not None and checkpoint[1] >= t.steps:
        return math.nan, math.nan
    factory = env_factory(config, built.tokenizer, agent)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    episodes = config.env.eval_episodes
    resumed = None
    if checkpoint is not None:  # loaded once, with the optimizer: the loop continues from it
        resumed = resume(run_dir, [agent])
        step = checkpoint[1]
        before = greedy_return(agent, factory, episodes, seed=10**6)
        report(f"resuming from step {step}; greedy mean return at step {step}: {before:.3f}")
    else:
        before = greedy_return(agent, factory, episodes, seed=10**6)
        report(f"greedy mean return before training: {before:.3f}")
    finetune_llm_multiturn(
        [agent],
        max_turns(config),
        factory,
        max_steps=t.steps,
        evaluation_interval=t.evaluation_interval,
        batch_size=config.data.prompts_per_step,
        seed=t.seed,
        run_dir=run_dir,
        resume=resumed if resumed is not None else t.resume,
        checkpoint_steps=t.checkpoint_steps,
        max_reward=t.max_reward,
        verbose=verbose,
        eval_episodes=episodes,
        report_to=t.report_to,
        project=t.project,
    )
    after = greedy_return(agent, factory, episodes, seed=10**6)
    if main:
        say(f"greedy mean return after training:  {after:.3f}")
    return before, after


def greedy_episode_return(built: Built) -> float:
    """The agent's greedy mean return over ``env.eval_episodes`` fresh episodes.

    The seeds start at 10**6, as in :func:`fit_episodes`'s reports before and after training.

    Args:
        built: What :func:`rl_train.builder.build` built from a config with ``env:``.

    Returns:
        The mean return.
    """
    config = built.config
    assert config.env is not None
    factory = env_factory(config, built.tokenizer, built.agent)
    return greedy_return(built.agent, factory, config.env.eval_episodes, seed=10**6)
