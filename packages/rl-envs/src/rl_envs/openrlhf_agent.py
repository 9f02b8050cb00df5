"""OpenRLHF's agent convention (``--agent_func_path``): an ``AgentInstance`` as an environment.

OpenRLHF runs one ``AgentInstance`` per episode, as its ``AgentExecutorBase.execute`` does:

1. ``await AgentInstance()`` (its ``__init__`` may be ``async``), then
   ``reset({"observation": prompt, "label": label}) -> {"observation": text}``; the text is
   tokenised as it is (the prompt was rendered by the chat template beforehand, as
   ``--apply_chat_template`` does);
2. after each generation, ``step({"observation_text", "action_text", "label",
   "sampling_params"}) -> {"rewards", "environment_feedback", "done", ...}``: the policy's
   tokens are kept as generated and the feedback, tokenised alone, is appended
   (token-in/token-out); ``observation_text`` grows by the action's text and the feedback;
3. the episode ends at ``done``, after ``max_steps`` generations, or when the next one would not
   fit; its return is the sum of the step ``rewards`` (each turn's reward is that step's).

:class:`OpenRLHFAgentEnv` is that loop as a :class:`~rl_envs.multiturn.TextEnv`;
:func:`openrlhf_agent_env` wraps it in a :class:`~rl_envs.multiturn.TokenObservationWrapper`
(no chat template between turns: OpenRLHF appends the feedback text as it is). An agent file
written for OpenRLHF runs after one change: import :class:`AgentInstanceBase` from here
(``from rl_envs.openrlhf_agent import AgentInstanceBase``) instead of ``openrlhf.utils.agent``.
Its ``AgentExecutor`` class is not used (the loop above is ``AgentExecutorBase.execute``'s);
drop it, or keep it out of the import.

Each ``step`` result's ``scores`` and ``extra_logs`` are in the turn's ``info``; a
``sampling_params`` other than the one passed in (None here) is refused, since the engine's
sampling is set once per run.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_envs import _timeout
from rl_envs.multiturn import TokenObservationWrapper

__all__ = ["AgentInstanceBase", "OpenRLHFAgentEnv", "openrlhf_agent_env"]


class AgentInstanceBase(ABC):
    """OpenRLHF's ``openrlhf.utils.agent.AgentInstanceBase``, for agent files to import."""

    @abstractmethod
    async def __init__(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[misc]
        """Set up one episode's state (may be ``async``, as in OpenRLHF)."""

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """``{"observation": text}`` to start from (default: the prompt as it is)."""
        return states

    @abstractmethod
    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The environment's answer to ``states["action_text"]``."""
        raise NotImplementedError("AgentInstance.step is not implemented")


def _run(value: Any, timeout: float | None) -> Any:
    """``value``, or its result when it is awaitable (on rl-envs' shared event loop)."""
    from rl_envs.tools import _awaited

    try:
        return _awaited(value, timeout)
    except _timeout.CallTimeoutError:
        raise _timeout.EnvTimeoutError(
            f"an AgentInstance coroutine did not finish within {timeout} s (step_timeout)"
        ) from None


class OpenRLHFAgentEnv:
    """One OpenRLHF ``AgentInstance`` per episode, as a text environment.

    Args:
        agent_cls: The ``AgentInstance`` class (``reset`` and ``step``, either may be
            ``async``; so may ``__init__``).
        rows: The tasks: a sequence of rows (``reset(seed)`` takes row ``seed % len(rows)``)
            or ``rows(seed) -> row``.
        tokenizer: Renders a prompt given as messages (``apply_chat_template`` with the
            generation prompt, as OpenRLHF's ``--apply_chat_template``); a string prompt is
            used as it is.
        prompt_column: The prompt's column (OpenRLHF's ``--input_key``).
        label_column: The label's column (``--label_key``); None passes ``""``, as OpenRLHF
            does without one.
        step_timeout: Seconds an ``async`` ``reset``/``step`` may take (None: no limit).

    Raises:
        ValueError: A bad argument, naming it; later, a row without the columns, or a
            ``reset``/``step`` result without what OpenRLHF reads from it (naming the key).
    """

    def __init__(
        self,
        agent_cls: type,
        rows: Sequence[Mapping[str, Any]] | Callable[[int], Mapping[str, Any]],
        *,
        tokenizer: Any = None,
        prompt_column: str = "prompt",
        label_column: str | None = "answer",
        step_timeout: float | None = None,
    ) -> None:
        if not isinstance(agent_cls, type) or not callable(getattr(agent_cls, "step", None)):
            raise ValueError(
                f"`agent_cls` must be OpenRLHF's AgentInstance class (with reset and step), "
                f"got {agent_cls!r}"
            )
        if not callable(rows) and len(rows) == 0:
            raise ValueError(f"`rows` is empty: pass at least one row with {prompt_column!r}")
        self.agent_cls = agent_cls
        self.rows = rows
        self.tokenizer = tokenizer
        self.prompt_column = prompt_column
        self.label_column = label_column
        self.step_timeout = _timeout.check_timeout("step_timeout", step_timeout)
        self.agent: Any = None
        self.label: Any = ""
        self.observation_text = ""
        self.where = ""

    def _row(self, seed: int | None) -> tuple[dict[str, Any], str]:
        index = random.randrange(2**31) if seed is None else seed
        if callable(self.rows):
            return dict(self.rows(index)), f"the row of seed {index}"
        return dict(self.rows[index % len(self.rows)]), f"row {index % len(self.rows)}"

    def _prompt(self, row: dict[str, Any]) -> str:
        if self.prompt_column not in row:
            raise ValueError(
                f"{self.where} has no {self.prompt_column!r} column (columns: {sorted(row)}); "
                "pass prompt_column= naming the prompt (OpenRLHF's --input_key)"
            )
        prompt = row[self.prompt_column]
        if isinstance(prompt, str):
            return prompt
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"the prompt of {self.where} is a list of messages: pass a tokenizer with a chat "
                "template to render it (OpenRLHF's --apply_chat_template), or give text prompts"
            )
        return str(self.tokenizer.apply_chat_template(
            list(prompt), tokenize=False, add_generation_prompt=True
        ))  # fmt: skip

    def _result(self, method: str, out: Any, keys: Sequence[str]) -> dict[str, Any]:
        name = f"{self.agent_cls.__name__}.{method}"
        if not isinstance(out, Mapping):
            raise ValueError(
                f"{name} returned a {type(out).__name__} on {self.where}; OpenRLHF reads a dict "
                f"with {list(keys)}"
            )
        missing = [k for k in keys if k not in out]
        if missing:
            raise ValueError(
                f"{name} returned a dict without {missing} on {self.where} (keys "
                f"{sorted(out)}); OpenRLHF reads {list(keys)}"
            )
        return dict(out)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """A new ``AgentInstance`` on the seed's row: ``(observation text, {"row": row})``."""
        row, self.where = self._row(seed)
        prompt = self._prompt(row)
        if self.label_column is None:
            self.label = ""
        elif self.label_column in row:
            self.label = row[self.label_column]
        else:
            raise ValueError(
                f"{self.where} has no {self.label_column!r} column (columns: {sorted(row)}); "
                "pass label_column= naming the label (OpenRLHF's --label_key), or None"
            )
        cls: Any = self.agent_cls
        agent = cls.__new__(cls)
        _run(agent.__init__(), self.step_timeout)  # OpenRLHF's __init__ may be async
        out = _run(agent.reset({"observation": prompt, "label": self.label}), self.step_timeout)
        observation = self._result("reset", out, ["observation"])["observation"]
        if not isinstance(observation, str):
            raise ValueError(
                f"{self.agent_cls.__name__}.reset returned an observation of type "
                f"{type(observation).__name__} on {self.where}; it must be the prompt text"
            )
        self.agent, self.observation_text = agent, observation
        return observation, {"row": row}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``AgentInstance.step`` on the action's text: ``(feedback, reward, done, False, info)``.

        ``info`` holds the step's ``scores`` and ``extra_logs`` when it returns them.
        """
        if self.agent is None:
            raise RuntimeError("call reset() before step()")
        states = {"observation_text": self.observation_text, "action_text": action,
                  "label": self.label, "sampling_params": None}  # fmt: skip
        out = _run(self.agent.step(states), self.step_timeout)
        result = self._result("step", out, ["rewards", "environment_feedback", "done"])
        feedback = result["environment_feedback"]
        if not isinstance(feedback, str):
            raise ValueError(
                f"{self.agent_cls.__name__}.step returned environment_feedback of type "
                f"{type(feedback).__name__} on {self.where}; it must be text (may be empty)"
            )
        if result.get("sampling_params") is not None:
            raise ValueError(
                f"{self.agent_cls.__name__}.step returned sampling_params on {self.where}: the "
                "sampling settings are set once per run here; return None (or "
                "states['sampling_params'], which is None)"
            )
        reward = _reward(result["rewards"], f"{self.agent_cls.__name__}.step", self.where)
        self.observation_text += action + feedback
        info: dict[str, Any] = {k: result[k] for k in ("scores", "extra_logs") if k in result}
        return feedback, reward, bool(result["done"]), False, info


def _reward(value: Any, what: str, where: str) -> float:
    """A step's ``rewards`` as a number (OpenRLHF calls ``.item()`` on it)."""
    from rl_envs.tools import _finite

    return _finite(what + "'s 'rewards'", value, where)


def openrlhf_agent_env(
    agent_cls: type,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]] | Callable[[int], Mapping[str, Any]],
    *,
    max_steps: int,
    pad_id: int,
    max_model_len: int,
    max_output_tokens: int,
    prompt_column: str = "prompt",
    label_column: str | None = "answer",
    step_timeout: float | None = None,
) -> TokenObservationWrapper:
    """An OpenRLHF ``AgentInstance`` episode as tokens (:class:`OpenRLHFAgentEnv`, wrapped).

    Args:
        agent_cls: The ``AgentInstance`` class.
        tokenizer: The policy's tokenizer.
        rows: The tasks (see :class:`OpenRLHFAgentEnv`).
        max_steps: Most generations per episode (OpenRLHF's ``--max_steps`` of the agent).
        pad_id: Padding id, stripped from the end of actions.
        max_model_len: Longest episode in tokens (OpenRLHF's ``max_length``).
        max_output_tokens: Most tokens per generation.
        prompt_column: As for :class:`OpenRLHFAgentEnv`.
        label_column: As for :class:`OpenRLHFAgentEnv`.
        step_timeout: Seconds each ``reset``/``step`` may take.

    Returns:
        A :class:`~rl_envs.multiturn.TokenObservationWrapper` (``apply_chat_template=False``:
        the feedback is appended as it is).
    """
    env = OpenRLHFAgentEnv(agent_cls, rows, tokenizer=tokenizer, prompt_column=prompt_column,
                           label_column=label_column, step_timeout=step_timeout)  # fmt: skip
    return TokenObservationWrapper(
        env, tokenizer, max_turns=max_steps, pad_id=pad_id, max_model_len=max_model_len,
        max_output_tokens=max_output_tokens, apply_chat_template=False,
        step_timeout=step_timeout,
    )  # fmt: skip
