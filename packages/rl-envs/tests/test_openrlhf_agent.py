"""OpenRLHF's ``AgentInstance`` (``--agent_func_path``) driven as OpenRLHF's executor drives it.

The agent below is written as for OpenRLHF (``async def __init__``, ``reset`` and ``step``
taking ``states`` dicts, a tensor reward); only its base class comes from rl-envs. The episode's
ids must be OpenRLHF's: the prompt text tokenised, then per turn the policy's tokens as
generated and the feedback tokenised alone; the return is the sum of the step rewards.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from envs_testlib import encode, tok
from rl_envs.openrlhf_agent import AgentInstanceBase, OpenRLHFAgentEnv, openrlhf_agent_env

PAD, EOS = 0, 2
ROWS = [{"prompt": f"guess {i}:", "answer": str(i)} for i in range(3)]


class AgentInstance(AgentInstanceBase):
    """Guess the label: reward 1 and done when right; two wrong guesses end the episode."""

    seen: ClassVar[list[dict[str, Any]]] = []

    async def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.step_idx = 0

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        AgentInstance.seen.append(dict(states))
        return {"observation": states["observation"]}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        AgentInstance.seen.append(dict(states))
        self.step_idx += 1
        right = states["action_text"].strip() == states["label"]
        done = right or self.step_idx >= 2
        return {
            "rewards": torch.tensor([1.0 if right else -0.25]),
            "scores": torch.tensor([float(right)]),
            "environment_feedback": "" if done else " no, again:",
            "done": done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": {"guesses": torch.tensor(self.step_idx)},
        }


def env(rows: list[dict[str, Any]] = ROWS) -> Any:
    return openrlhf_agent_env(AgentInstance, tok(), rows, max_steps=3, pad_id=PAD,
                              max_model_len=64, max_output_tokens=4)  # fmt: skip


def test_an_episode_has_openrlhfs_tokens_states_and_return() -> None:
    AgentInstance.seen = []
    wrapped = env()
    observation, _ = wrapped.reset(seed=4)  # row 4 % 3 = 1
    assert observation["text"] == "guess 1:"
    _, r0, done0, _, info0 = wrapped.step([*encode(" 7"), EOS])
    _, r1, done1, _, info1 = wrapped.step(encode("1"))
    assert (r0, done0, r1, done1) == (-0.25, False, 1.0, True)
    assert info0["extra_logs"]["guesses"].item() == 1 and info1["scores"].item() == 1.0
    trajectory = wrapped.trajectory()
    want = [*encode("guess 1:"), *encode(" 7"), EOS, *encode(" no, again:"), *encode("1")]
    assert trajectory.input_ids.tolist() == want  # token-in/token-out, as OpenRLHF appends
    actions = [False] * 8 + [True] * 3 + [False] * 11 + [True]
    assert trajectory.action_mask.tolist() == actions
    assert trajectory.turn_rewards.tolist() == [-0.25, 1.0]  # bit-exact: dyadic rewards
    reset, first, second = AgentInstance.seen
    assert reset == {"observation": "guess 1:", "label": "1"}
    assert first == {"observation_text": "guess 1:", "action_text": " 7", "label": "1",
                     "sampling_params": None}  # fmt: skip
    assert second["observation_text"] == "guess 1: 7 no, again:"  # action text + feedback


def test_message_prompts_are_rendered_by_the_chat_template() -> None:
    rows = [{"prompt": [{"role": "user", "content": "guess 2:"}], "answer": "2"}]
    wrapped = env(rows=rows)
    observation, _ = wrapped.reset(seed=0)
    want = tok().apply_chat_template(rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    assert observation["text"] == want
    assert observation["input_ids"][0].tolist() == encode(want)


class SyncAgent:
    """An agent without the base class and without ``async`` (also accepted)."""

    def __init__(self) -> None:
        self.label = None

    def reset(self, states: dict[str, Any]) -> dict[str, Any]:
        return {"observation": states["observation"] + "!"}

    def step(self, states: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": 0.5, "environment_feedback": "", "done": True}


def test_a_synchronous_agent_and_label_column_none() -> None:
    text_env = OpenRLHFAgentEnv(SyncAgent, ROWS, label_column=None)
    assert text_env.reset(seed=0) == ("guess 0:!", {"row": ROWS[0]})
    assert text_env.label == ""
    assert text_env.step("x") == ("", 0.5, True, False, {})


def bad_agent(result: dict[str, Any]) -> type:
    class Bad(SyncAgent):
        def step(self, states: dict[str, Any]) -> dict[str, Any]:
            return result

    return Bad


@pytest.mark.parametrize(
    ("result", "match"),
    [
        ({"rewards": 1.0, "environment_feedback": ""}, r"Bad.step returned a dict without \['done'\]"),
        ({"rewards": float("nan"), "environment_feedback": "", "done": True},
         r"Bad.step's 'rewards' returned nan on row 0"),
        ({"rewards": torch.ones(2), "environment_feedback": "", "done": True}, r"'rewards'"),
        ({"rewards": 1.0, "environment_feedback": None, "done": False},
         r"environment_feedback of type NoneType"),
        ({"rewards": 1.0, "environment_feedback": "", "done": False, "sampling_params": {"t": 1}},
         r"returned sampling_params on row 0: the sampling settings are set once per run"),
    ],
)  # fmt: skip
def test_bad_step_results_name_the_key(result: dict[str, Any], match: str) -> None:
    text_env = OpenRLHFAgentEnv(bad_agent(result), ROWS)
    text_env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        text_env.step("x")


def test_bad_rows_and_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"row 0 has no 'answer' column .* pass label_column="):
        OpenRLHFAgentEnv(SyncAgent, [{"prompt": "p"}]).reset(seed=0)
    with pytest.raises(ValueError, match=r"row 0 has no 'prompt' column .* --input_key"):
        OpenRLHFAgentEnv(SyncAgent, [{"query": "p", "answer": "a"}]).reset(seed=0)
    with pytest.raises(ValueError, match=r"a list of messages: pass a tokenizer"):
        OpenRLHFAgentEnv(SyncAgent, [{"prompt": [{"role": "user", "content": "p"}],
                                      "answer": "a"}]).reset(seed=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"`agent_cls` must be OpenRLHF's AgentInstance class"):
        OpenRLHFAgentEnv(object(), ROWS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`rows` is empty"):
        OpenRLHFAgentEnv(SyncAgent, [])

    class NoDict(SyncAgent):
        def reset(self, states: dict[str, Any]) -> Any:
            return "text"

    with pytest.raises(ValueError, match=r"NoDict.reset returned a str on row 0"):
        OpenRLHFAgentEnv(NoDict, ROWS).reset(seed=0)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        OpenRLHFAgentEnv(SyncAgent, ROWS).step("x")
