"""verifiers v1 tasksets as token episodes (rl_envs.verifiers, rl_envs.verifiers_taskset): the
task's own rewards score a verifiers Trace whose tokens are the trajectory's."""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import verifiers.v1 as vf
from rl_envs import SyncMultiTurnVecEnv
from rl_envs.verifiers import TasksetEnvWrapper, load_taskset, tasks
from rl_envs.verifiers_taskset import EchoDigitTaskset
from rl_testing.tokenizer import char_tokenizer

EOS = 2


def tok() -> Any:
    return char_tokenizer()  # its chat template: <|role|>content<eos>, <|assistant|> prompt


def encode(t: Any, text: str) -> list[int]:
    return list(t(text, add_special_tokens=False)["input_ids"])


def wrapper(taskset: Any = "rl_envs.verifiers_taskset", **kw: Any) -> TasksetEnvWrapper:
    args: dict[str, Any] = {"pad_id": 0, "max_model_len": 128, "max_output_tokens": 4}
    args.update(kw)
    return TasksetEnvWrapper(taskset, tok(), **args)


def test_the_trace_holds_the_episodes_tokens_and_the_tasks_reward() -> None:
    w = wrapper(system_prompt="be brief")
    t = w.tokenizer
    obs, _ = w.reset(seed=1)  # task 1 asks for "1"
    prompt = t.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say 1?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert obs["input_ids"][0].tolist() == encode(t, prompt)
    action = [*encode(t, "1"), EOS]
    _, reward, terminated, truncated, info = w.step(action)
    assert (reward, terminated, truncated) == (1.0, True, False)
    trace = info["trace"]
    assert trace.rewards["echo"].score == 1.0
    assert trace.last_reply == "1"
    traj = w.trajectory()
    branch = trace.branches[0]
    assert branch.token_ids == traj.input_ids.tolist()
    assert branch.sampled_mask == traj.action_mask.tolist()
    assert [i for i, m in zip(branch.token_ids, branch.sampled_mask, strict=True) if m] == action
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "say 1?"},
        {"role": "assistant", "content": "1"},
    ]
    rendered = t.apply_chat_template(messages, tokenize=False)
    assert traj.input_ids.tolist() == encode(t, rendered)


def test_rewards_of_other_digits_and_other_text() -> None:
    w = wrapper(load_taskset("rl_envs.verifiers_taskset", digits="7", digit_reward=0.25))
    for answer, expected in (("7", 1.0), ("3", 0.25), ("x", 0.0)):
        w.reset(seed=0)
        assert w.step([*encode(w.tokenizer, answer), EOS])[1] == expected


def test_load_taskset_forms() -> None:
    by_id = load_taskset("rl_envs.verifiers_taskset", repeats=1)
    by_name = load_taskset("rl_envs.verifiers_taskset:EchoDigitTaskset", repeats=1)
    instance = EchoDigitTaskset(by_id.config)
    assert [x.data.prompt for x in by_id] == ["say 0?", "say 1?", "say 2?", "say 3?"]
    assert [x.data.prompt for x in by_name] == [x.data.prompt for x in instance]
    assert load_taskset(by_id) is by_id
    assert len(tasks(by_id.take(2))) == 2


def test_a_vec_env_plays_one_turn_per_task() -> None:
    t = tok()
    vec = SyncMultiTurnVecEnv(wrapper, batch_size=4, group_size=2)

    def policy(obs: list[dict[str, Any]]) -> list[list[int]]:
        asked = [re.search(r"say (\d)", o["text"]).group(1) for o in obs]  # type: ignore[union-attr]
        return [[*encode(t, digit), EOS] for digit in asked]

    batch = vec.rollout(policy, seed=0)  # type: ignore[arg-type]
    assert batch.returns.tolist() == [1.0] * 8
    assert batch.turn_mask.sum(1).tolist() == [1] * 8


class _Infinite(vf.Taskset):  # type: ignore[misc]
    INFINITE = True

    def load(self) -> Iterator[Any]:
        while True:
            yield vf.Task(vf.TaskData(prompt="x"))


class _Raising(vf.Task):  # type: ignore[misc]
    @vf.reward
    async def broken(self, trace: Any) -> float:
        raise KeyError("grader down")


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="taskset 'no_such_module_x:T' does not resolve"):
        load_taskset("no_such_module_x:T")
    with pytest.raises(ValueError, match="is a int, not a verifiers Taskset"):
        load_taskset(3)
    with pytest.raises(ValueError, match="is infinite: bound it first"):
        tasks(_Infinite(vf.TasksetConfig()))
    with pytest.raises(ValueError, match="no prompt"):
        wrapper([vf.Task(vf.TaskData())]).reset(seed=0)
    with pytest.raises(ValueError, match="played in one turn"):
        wrapper(max_turns=2)
    w = wrapper([_Raising(vf.TaskData(prompt="hi"))])
    w.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"scoring task 0 \(_Raising\) failed: .*grader down"):
        w.step([*encode(w.tokenizer, "a"), EOS])


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import rl_envs.verifiers as adapter

    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ImportError) as info:
        adapter.load_taskset("rl_envs.verifiers_taskset")
    assert str(info.value) == (
        "rl_envs.verifiers needs the 'verifiers' extra: pip install 'rl-envs[verifiers]'"
    )


class _Echo(vf.Task):  # type: ignore[misc]
    """Reward 1 when the answer repeats the last prompt message's text, else ``value``."""

    value: Any = 0.0

    @vf.reward
    async def echo(self, trace: Any) -> float:
        last = self.data.prompt[-1] if isinstance(self.data.prompt, list) else None
        asked = self.data.prompt if last is None else last.content
        return 1.0 if trace.last_reply == asked else self.value


def test_a_few_shot_prompt_with_assistant_messages_is_scored() -> None:
    """verifiers prompts may hold assistant turns (few-shot); they used to be a bare
    KeyError: 'assistant' when the trace was built."""
    from verifiers.v1.types import AssistantMessage, UserMessage

    prompt = [
        UserMessage(role="user", content="a"),
        AssistantMessage(role="assistant", content="a"),
        UserMessage(role="user", content="b"),
    ]
    w = wrapper([_Echo(vf.TaskData(prompt=prompt))])
    obs, _ = w.reset(seed=0)
    assert obs["text"] == "<|user|>a<eos><|assistant|>a<eos><|user|>b<eos><|assistant|>"
    _, reward, terminated, _, info = w.step([*encode(w.tokenizer, "b"), EOS])
    assert (reward, terminated) == (1.0, True)
    roles = [n.message.role for n in info["trace"].nodes]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert info["trace"].branches[0].token_ids == w.trajectory().input_ids.tolist()


def test_a_task_scores_from_inside_a_running_event_loop() -> None:
    """A notebook or an async rollout worker runs a loop: asyncio.run() used to refuse there."""

    async def episode() -> float:
        w = wrapper()
        w.reset(seed=2)
        return w.step([*encode(w.tokenizer, "2"), EOS])[1]

    assert asyncio.run(episode()) == 1.0


def test_a_non_finite_task_reward_names_the_task_and_its_rewards() -> None:
    w = wrapper([_Echo(vf.TaskData(prompt="hi"))])
    w.text_env.tasks[0].value = math.nan
    w.reset(seed=0)
    with pytest.raises(ValueError, match=r"^task 0 \(_Echo\) scored nan \(rewards \{'echo': nan\}\): its rewards must return finite numbers"):  # fmt: skip
        w.step([*encode(w.tokenizer, "x"), EOS])
