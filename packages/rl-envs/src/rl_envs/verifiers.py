"""``verifiers`` v1 tasksets as token-level episodes (the ``rl-envs[verifiers]`` extra).

A ``verifiers.v1.Taskset`` yields ``Task``s: a prompt (text or messages, with an optional
system prompt) and data fields, scored by the task's ``@vf.reward`` methods (weighted sum,
``Trace.reward``). :class:`TasksetEnvWrapper` plays each task as one episode in-process, with
no harness program, sandbox, ``uv`` or network:

1. ``reset(seed)`` takes task ``seed % len(tasks)``; its prompt (few-shot assistant turns
   included), rendered with the tokenizer's chat template, is the prompt the policy answers;
2. the policy's answer (its tokens kept exactly as generated) ends the episode: a
   ``verifiers`` ``Trace`` of the conversation is built, its nodes carrying the episode's
   token ids and sampled mask (``Trace.branches[0].token_ids`` equals the ids the trainer
   learns on), and ``await task.score(trace)`` scores it with the task's own rewards (rewards
   that need a sandbox runtime are skipped, as verifiers does offline);
3. the reward is ``trace.reward`` (a non-finite one is a ``ValueError`` naming the task and
   its rewards); the trace is kept (``wrapper.trace``). Scoring runs on a shared event loop in
   a daemon thread, so it also works where a loop is running (a notebook).

One model turn per task (verifiers' single-call tasks); multi-turn harnesses (tools, user
simulators) are not run here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from rl_envs._extras import require
from rl_envs.multiturn import TokenObservationWrapper

__all__ = ["TasksetEnvWrapper", "TasksetTextEnv", "load_taskset", "tasks"]


def _vf() -> Any:
    return require("verifiers.v1", "verifiers", "rl_envs.verifiers")


def load_taskset(name: Any, **kwargs: Any) -> Any:
    """A ``verifiers`` v1 ``Taskset`` from a name, a class, a factory or an instance.

    Args:
        name: ``"module:attribute"`` (a ``Taskset`` subclass, a function returning a taskset,
            or a taskset), a verifiers taskset id (an installed package or module exporting
            its ``Taskset`` subclass in ``__all__``, as ``vf-eval`` loads them), or the object.
        **kwargs: Fields of the taskset's config (a class or an id) or the function's
            arguments.

    Returns:
        The taskset.

    Raises:
        ValueError: ``name`` does not resolve to a taskset.
    """
    vf = _vf()
    from importlib import import_module

    from verifiers.v1.utils.generic import concrete_type  # type: ignore[import-untyped]
    from verifiers.v1.utils.loaders import (  # type: ignore[import-untyped]
        _plugin_class,
        taskset_class,
    )

    obj = name
    if isinstance(name, str):
        try:
            if ":" in name:
                module, _, attr = name.partition(":")
                obj = getattr(import_module(module), attr)
            elif "." in name:  # a dotted module exporting its Taskset in __all__
                obj = _plugin_class(import_module(name), vf.Taskset, "taskset")
            else:
                obj = taskset_class(name)
        except (ImportError, AttributeError, TypeError) as exc:
            raise ValueError(f"taskset {name!r} does not resolve: {exc}") from exc
    if isinstance(obj, type) and issubclass(obj, vf.Taskset):
        config_cls = concrete_type(obj, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        obj = obj(config_cls(**kwargs))
    elif callable(obj) and not isinstance(obj, vf.Taskset):
        obj = obj(**kwargs)
    if not isinstance(obj, vf.Taskset):
        raise ValueError(f"taskset {name!r} is a {type(obj).__name__}, not a verifiers Taskset")
    return obj


def tasks(taskset: Any) -> list[Any]:
    """The tasks of a finite taskset (or of anything :func:`load_taskset` takes), as a list.

    A list or tuple of tasks is returned as a list (a factory can load the taskset once and
    hand every episode's wrapper the same tasks).

    Raises:
        ValueError: an infinite (unbounded) taskset, or one without tasks.
    """
    if isinstance(taskset, list | tuple):
        out = list(taskset)
    else:
        taskset = load_taskset(taskset)
        if not taskset.bounded:
            raise ValueError(
                f"{type(taskset).__name__} is infinite: bound it first, e.g. taskset.take(1000)"
            )
        out = list(taskset)
    if not out:
        raise ValueError("the taskset yields no task")
    return out


def _messages(task: Any) -> list[dict[str, Any]]:
    """The task's prompt as chat messages (``system_prompt`` first when set)."""
    from verifiers.v1.types import content_text  # type: ignore[import-untyped]

    data = task.data
    out: list[dict[str, Any]] = []
    if data.system_prompt:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        for message in data.prompt or []:
            out.append({"role": message.role, "content": content_text(message.content)})
    if not out:
        raise ValueError(f"task {data.idx} ({type(task).__name__}) has no prompt")
    return out


class TasksetTextEnv:
    """The text side of a taskset's episodes; :class:`TasksetEnvWrapper` drives it.

    A :class:`~rl_envs.multiturn.TextEnv` whose observations are message lists (text without
    a chat template).

    Args:
        taskset: A ``verifiers`` v1 ``Taskset`` (finite), anything :func:`load_taskset` takes,
            or a list of its tasks.
    """

    def __init__(self, taskset: Any) -> None:
        self.tasks = tasks(taskset)
        self.task: Any = None
        self.index = 0
        """The position of the episode's task in ``tasks``."""
        self.prompt: list[dict[str, Any]] = []
        self.score: Callable[[str], tuple[float, Any]] | None = None
        self.as_text = False
        """Observations as text (the messages' contents, one per line): no chat template."""

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Task ``seed % len(tasks)`` (a random one for None)."""
        index = random.randrange(2**31) if seed is None else seed
        self.index = index % len(self.tasks)
        self.task = self.tasks[self.index]
        self.prompt = _messages(self.task)
        if self.as_text:
            return "\n".join(str(m["content"]) for m in self.prompt), {"task": self.task}
        return [dict(m) for m in self.prompt], {"task": self.task}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Score the answer; the episode ends."""
        assert self.score is not None, "driven by TasksetEnvWrapper"
        reward, trace = self.score(action)
        return [], reward, True, False, {"trace": trace}


class TasksetEnvWrapper(TokenObservationWrapper):
    """A ``verifiers`` taskset's tasks as one-turn token episodes, scored by the tasks.

    Args:
        taskset: A ``verifiers`` v1 ``Taskset`` or anything :func:`load_taskset` takes.
        tokenizer: A Hugging Face tokenizer (its chat template renders the prompt).
        pad_id: Padding id.
        max_model_len: Longest episode in tokens.
        max_output_tokens: Most tokens of the answer.
        max_turns: Must be 1 (one model call per task); accepted for a common signature.
        apply_chat_template: Render with the chat template (False: the messages' text).
        system_prompt: A system message for tasks that have none.
        step_timeout: As for :class:`~rl_envs.multiturn.TokenObservationWrapper`: seconds each
            ``reset`` and each task's scoring (the step) may take.
    """

    _observation_types = (str, list)

    def __init__(
        self,
        taskset: Any,
        tokenizer: Any,
        *,
        pad_id: int,
        max_model_len: int,
        max_output_tokens: int,
        max_turns: int = 1,
        apply_chat_template: bool = True,
        system_prompt: str | None = None,
        step_timeout: float | None = None,
    ) -> None:
        if max_turns != 1:
            raise ValueError(f"verifiers tasks are played in one turn; got max_turns={max_turns}")
        self.text_env = TasksetTextEnv(taskset)
        self.text_env.score = self._score
        self.default_system_prompt = system_prompt
        self.trace: Any = None
        super().__init__(
            self.text_env,
            tokenizer,
            max_turns=1,
            pad_id=pad_id,
            max_model_len=max_model_len,
            max_output_tokens=max_output_tokens,
            apply_chat_template=apply_chat_template,
            step_timeout=step_timeout,
        )
        self.text_env.as_text = not self.apply_chat_template

    def _prompt_messages(self, observation: Any) -> list[dict[str, Any]]:
        messages = list(observation)
        if self.default_system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.default_system_prompt})
        return messages

    def _trace_prompt(self, task: Any) -> list[Any]:
        """The prompt as verifiers messages.

        The task's own (few-shot assistant turns included), after its system prompt or the
        wrapper's default one.
        """
        from verifiers.v1.types import SystemMessage, UserMessage

        data = task.data
        out: list[Any] = []
        if data.system_prompt:
            out.append(SystemMessage(role="system", content=data.system_prompt))
        if isinstance(data.prompt, str):
            out.append(UserMessage(role="user", content=data.prompt))
        else:
            out.extend(data.prompt or [])
        system = self.default_system_prompt
        if self.apply_chat_template and system and out[0].role != "system":
            out.insert(0, SystemMessage(role="system", content=system))
        return out

    def _score(self, answer: str) -> tuple[float, Any]:
        """Build the verifiers ``Trace`` of the episode and score it with the task."""
        vf = _vf()
        from verifiers.v1.graph import MessageNode  # type: ignore[import-untyped]
        from verifiers.v1.types import AssistantMessage

        from rl_envs.reward_functions import _gather

        task = self.text_env.task
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=message)
            for i, message in enumerate(self._trace_prompt(task))
        ]
        nodes[-1].token_ids = list(self._ids[: self._prompt_length])
        nodes[-1].mask = [False] * self._prompt_length
        completion = list(self._step_tokens)  # the answer (scored before the wrapper keeps it)
        nodes.append(
            MessageNode(
                parent=len(nodes) - 1,
                message=AssistantMessage(role="assistant", content=answer),
                sampled=True,
                token_ids=completion,
                mask=[True] * len(completion),
            )
        )
        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
            nodes=nodes,
        )
        where = f"task {self.text_env.index} ({type(task).__name__})"
        # on the shared event loop's thread: works inside a running loop (a notebook) too
        result = _gather([task.score(trace)])[0]
        if isinstance(result, Exception):
            raise RuntimeError(f"scoring {where} failed: {result}") from result
        if isinstance(result, BaseException):
            raise result
        reward = float(trace.reward)
        if not math.isfinite(reward):
            scores = {k: None if r is None else r.score for k, r in trace.rewards.items()}
            raise ValueError(
                f"{where} scored {reward} (rewards {scores}): its rewards must return finite "
                "numbers"
            )
        self.trace = trace
        return reward, trace
