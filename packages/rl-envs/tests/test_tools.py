"""ToolEnvWrapper: TRL environment_factory-style tool episodes, spliced token-in/token-out."""

from __future__ import annotations

import asyncio
import math
import re
import string
import threading
from functools import cache
from typing import Any

import pytest
import torch
from rl_envs import EnvTimeoutError, SyncMultiTurnVecEnv
from rl_envs.tools import (
    TINY_TOOL_CHAT_TEMPLATE,
    SecretDigitEnv,
    ToolCall,
    ToolCallParseError,
    ToolEnvWrapper,
    parse_compact_tool_calls,
    parse_hermes_tool_calls,
    secret_digit_reward,
    secret_digit_rows,
    tool_methods,
    tool_schemas,
)
from rl_testing.tokenizer import DEFAULT_ALPHABET, char_tokenizer

EOS = 2

# A Hermes/Qwen2.5-style tool template over the char tokenizer's role markers: the tools header
# is the JSON schemas, tool results are <|tool|> messages.
HERMES_TEMPLATE = (
    "{%- if tools -%}{{ '<|system|>tools:' }}{%- for t in tools -%}{{ '\\n' + (t | tojson) }}"
    "{%- endfor -%}{{ '<eos>' }}{%- endif -%}"
    "{%- for m in messages -%}{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


@cache
def _tok(template: str) -> Any:
    tok = char_tokenizer(DEFAULT_ALPHABET + string.ascii_uppercase + '<>{}[]"_')
    tok.chat_template = template
    return tok


def hermes_tok() -> Any:
    return _tok(HERMES_TEMPLATE)


def tiny_tok() -> Any:
    return _tok(TINY_TOOL_CHAT_TEMPLATE)


def encode(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


class Calculator:
    """A calculator whose reward is the number of successful calls made."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.calls = 0

    def reset(self, **row: Any) -> str | None:
        self.rows.append(row)
        self.calls = 0
        return row.get("hint")

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        self.calls += 1
        return a + b

    def divide(self, a: int, b: int) -> float:
        """Divide a by b.

        Args:
            a: The dividend.
            b: The divisor.
        """
        quotient = a / b
        self.calls += 1
        return quotient

    def get_reward(self) -> float:
        return float(self.calls)

    def _private(self) -> None:
        """Not a tool."""


ROWS = [{"prompt": "what is 2+3?", "answer": "5"}, {"prompt": "what is 7/0?", "answer": "x"}]


def call(name: str, **arguments: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def wrap(env: Any = None, tok: Any = None, **kw: Any) -> ToolEnvWrapper:
    args: dict[str, Any] = {
        "rows": ROWS,
        "max_tool_calls": 3,
        "pad_id": 0,
        "max_model_len": 1024,
        "max_output_tokens": 96,
    }
    args.update(kw)
    rows = args.pop("rows")
    return ToolEnvWrapper(env or Calculator(), tok or hermes_tok(), rows, **args)


def act(w: ToolEnvWrapper, text: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
    return w.step([*encode(w.tokenizer, text), EOS])


def test_public_methods_are_the_tools_with_schemas_from_signature_and_docstring() -> None:
    env = Calculator()
    assert list(tool_methods(env)) == ["add", "divide"]
    add = tool_schemas(env)[0]["function"]
    assert add["name"] == "add" and add["description"] == "Add two integers."
    assert add["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first."}
    assert add["parameters"]["required"] == ["a", "b"]


def test_spliced_ids_equal_the_chat_template_rendering_with_the_tools_header() -> None:
    """Token-in/token-out: after every turn the trajectory is the template's own rendering of
    the conversation so far (tools header, tool messages), and the policy's ids are kept."""
    w = wrap()
    tok = hermes_tok()
    obs, info = w.reset(seed=0)
    assert info["row"] == ROWS[0]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "what is 2+3?"}]
    render = lambda gp: tok.apply_chat_template(  # noqa: E731
        msgs, tools=w.schemas, tokenize=False, add_generation_prompt=gp
    )
    assert obs["input_ids"][0].tolist() == encode(tok, render(True))
    assert render(True).startswith('<|system|>tools:\n{"type": "function"')
    text = call("add", a=2, b=3)
    obs, reward, term, trunc, info = act(w, text)
    assert (reward, term, trunc) == (0.0, False, False)
    assert info == {"tool_calls": 1, "tool_errors": 0}
    msgs += [
        {"role": "assistant", "content": text},
        {"role": "tool", "name": "add", "content": "5"},
    ]
    assert obs["input_ids"][0].tolist() == encode(tok, render(True))
    obs, reward, term, trunc, _ = act(w, "5")
    assert (reward, term, trunc) == (1.0, True, False)  # get_reward: one successful call
    msgs.append({"role": "assistant", "content": "5"})
    t = w.trajectory()
    assert t.input_ids.tolist() == encode(tok, render(False))
    assert w.messages == msgs
    actions = t.input_ids[t.action_mask].tolist()
    assert actions == [*encode(tok, text), EOS, *encode(tok, "5"), EOS]
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert t.turn_rewards.tolist() == [0.0, 1.0]


def test_the_policys_tokens_are_never_retokenised() -> None:
    """An action holding an id its text would not encode to (``<unk>`` for a character outside
    the vocabulary) stays in the trajectory as generated."""
    w = wrap()
    w.reset(seed=0)
    action = [*encode(hermes_tok(), "4"), 3, EOS]  # 3 = <unk>
    w.step(action)
    t = w.trajectory()
    assert t.input_ids[t.action_mask].tolist() == action


def test_a_tool_that_raises_answers_with_an_error_and_the_episode_goes_on() -> None:
    w = wrap()
    w.reset(seed=1)
    obs, reward, term, trunc, info = act(w, call("divide", a=7, b=0))
    assert (reward, term, trunc) == (0.0, False, False)
    assert info == {"tool_calls": 1, "tool_errors": 1}
    assert w.messages[-1] == {
        "role": "tool",
        "name": "divide",
        "content": "error: ZeroDivisionError: division by zero",
    }
    assert obs["text"].endswith(
        "<|tool|>error: ZeroDivisionError: division by zero<eos><|assistant|>"
    )
    _, _, term, _, _ = act(w, call("divide", a=8, b=2))
    assert w.messages[-1]["content"] == "4.0" and not term
    _, reward, term, _, _ = act(w, "4")
    assert (reward, term) == (1.0, True)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (call("mul", a=1, b=2), "error: unknown tool 'mul'; tools: add, divide"),
        (call("add", a=1), "error: bad arguments for add: missing a required argument: 'b'"),
        (
            call("add", a=1.5, b=True),
            "error: bad arguments for add: `a` must be an integer, got "
            "1.5 (float); `b` must be an integer, got True (bool)",
        ),  # they ran: 3.5
        ("<tool_call>{oops</tool_call>", "error: the tool call is not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "error: a tool call must be"),
    ],
)
def test_unknown_tools_bad_arguments_and_unparseable_calls_are_error_messages(
    text: str, error: str
) -> None:
    w = wrap()
    w.reset(seed=0)
    _, reward, term, trunc, info = act(w, text)
    assert (reward, term, trunc) == (0.0, False, False)
    assert info["tool_errors"] == 1
    assert w.messages[-1]["role"] == "tool"
    assert w.messages[-1]["content"].startswith(error)


def test_max_tool_calls_truncates_without_running_the_extra_call() -> None:
    env = Calculator()
    w = wrap(env, max_tool_calls=2)
    assert w.max_turns == 3
    w.reset(seed=0)
    for _ in range(2):
        _, _, term, trunc, _ = act(w, call("add", a=1, b=1))
        assert not (term or trunc)
    _, reward, term, trunc, info = act(w, call("add", a=1, b=1))
    assert (term, trunc, info["truncated_by"]) == (False, True, "max_tool_calls")
    assert env.calls == 2 and reward == 2.0
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert w.done and w.trajectory().turn_rewards.tolist() == [0.0, 0.0, 2.0]


def test_max_model_len_truncation_still_scores_the_episode() -> None:
    w = wrap(max_model_len=800, max_output_tokens=100)
    obs, _ = w.reset(seed=0)
    assert obs["input_ids"].shape[1] + 100 <= 800
    _, reward, _, trunc, info = act(w, call("add", a=1, b=1) + " " * 30)
    assert trunc and info["truncated_by"] == "max_model_len" and reward == 1.0
    assert [m["role"] for m in w.messages] == ["user", "assistant"]  # the reply did not fit
    rendered = hermes_tok().apply_chat_template(w.messages, tools=w.schemas, tokenize=False)
    assert w.trajectory().input_ids.tolist() == encode(hermes_tok(), rendered)


def test_reward_fn_and_reset_text_and_message_prompts() -> None:
    class NoReward:
        def reset(self, **row: Any) -> str | None:
            return " (use tools)"

    seen: list[tuple[str, Any, dict[str, Any]]] = []

    def reward_fn(completion: str, environment: Any, **row: Any) -> float:
        seen.append((completion, environment, row))
        return float(completion == row["answer"])

    env = NoReward()
    rows = [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
             "answer": "42"}]  # fmt: skip
    w = wrap(env, rows=rows, reward_fn=reward_fn)
    assert w.schemas == [] and w.tools == {}
    obs, _ = w.reset(seed=5)
    assert obs["text"] == "<|system|>s<eos><|user|>q (use tools)<eos><|assistant|>"
    _, reward, term, _, _ = act(w, "42")
    assert (reward, term) == (1.0, True)
    assert seen == [("42", env, rows[0])]


def test_bad_arguments_name_the_fix() -> None:
    class NoReward:
        def reset(self, **row: Any) -> None:
            return None

    with pytest.raises(ValueError, match="reward_fn=fn"):
        wrap(NoReward())
    with pytest.raises(ValueError, match="reset"):
        wrap(object(), reward_fn=secret_digit_reward)
    plain = char_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match="TINY_TOOL_CHAT_TEMPLATE"):
        wrap(tok=plain)
    with pytest.raises(ValueError, match="max_tool_calls"):
        wrap(max_tool_calls=-1)
    with pytest.raises(ValueError, match=r"^`max_tool_calls` must be an int >= 0, got None"):
        wrap(max_tool_calls=None)  # TRL's max_tool_calling_iterations=None has no counterpart
    with pytest.raises(ValueError, match="'prompt'"):
        wrap(rows=[{"question": "q"}]).reset(seed=0)

    class Undocumented(Calculator):
        def mul(self, a, b):  # type: ignore[no-untyped-def]
            return a * b

    with pytest.raises(ValueError, match="tool 'mul' needs a docstring"):
        wrap(Undocumented())


def test_a_hung_tool_times_out_with_tool_timeout_and_the_episode_is_kept() -> None:
    release = threading.Event()

    class Slow(Calculator):
        def wait(self, seconds: int) -> str:
            """Wait for the operator.

            Args:
                seconds: How long.
            """
            release.wait()
            return "done"

    w = wrap(Slow(), tool_timeout=0.2, max_model_len=4096)
    w.reset(seed=0)
    assert act(w, call("add", a=1, b=2))[4] == {"tool_calls": 1, "tool_errors": 0}
    before = (w.trajectory().input_ids.tolist(), w.trajectory().action_mask.tolist(), w.messages)
    try:
        with pytest.raises(
            EnvTimeoutError,
            match=r"^tool wait of Slow did not return within 0\.2 s \(tool_timeout\) on turn 1; raise tool_timeout or fix the tool$",
        ):
            act(w, call("wait", seconds=5))
    finally:
        release.set()
    after = (w.trajectory().input_ids.tolist(), w.trajectory().action_mask.tolist(), w.messages)
    assert after == before
    # the episode goes on, and the timed-out call is not counted
    assert act(w, call("add", a=2, b=2))[4] == {"tool_calls": 2, "tool_errors": 0}
    for bad in (0, -1.0, math.inf):
        with pytest.raises(ValueError, match="`tool_timeout` must be a finite number of seconds > 0"):  # fmt: skip
            wrap(tool_timeout=bad)


def test_hermes_parser() -> None:
    assert parse_hermes_tool_calls("the answer is 5", {}) == []
    two = call("add", a=1, b=2) + " and " + call("divide", a=4, b=2)
    assert parse_hermes_tool_calls(two, {}) == [
        ToolCall("add", {"a": 1, "b": 2}),
        ToolCall("divide", {"a": 4, "b": 2}),
    ]
    cut = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}'  # no closing tag, str args
    assert parse_hermes_tool_calls(cut, {}) == [ToolCall("add", {"a": 1})]
    with pytest.raises(ToolCallParseError, match="JSON object"):
        parse_hermes_tool_calls('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', {})


def test_compact_parser() -> None:
    tools = tool_methods(Calculator())
    assert parse_compact_tool_calls("5", tools) == []
    assert parse_compact_tool_calls("!add(1, 2)", tools) == [ToolCall("add", args=("1", "2"))]
    assert parse_compact_tool_calls("!d(4,2)", tools) == [ToolCall("divide", args=("4", "2"))]
    peek = tool_methods(SecretDigitEnv())
    assert parse_compact_tool_calls("!", peek) == [ToolCall("peek")]
    assert parse_compact_tool_calls("!pe", peek) == [ToolCall("peek")]
    with pytest.raises(ToolCallParseError, match="ambiguous tool name ''"):
        parse_compact_tool_calls("!", tools)
    with pytest.raises(ToolCallParseError, match="unknown tool name 'x'"):
        parse_compact_tool_calls("!x", peek)
    with pytest.raises(ToolCallParseError, match="cannot parse"):
        parse_compact_tool_calls("!add 1", tools)


def test_compact_calls_convert_arguments_by_annotation() -> None:
    w = wrap(tok=tiny_tok(), parser=parse_compact_tool_calls, max_model_len=256)
    obs, _ = w.reset(seed=0)
    assert obs["text"] == "tools:add,divide\nwhat is 2+3?\n"
    obs, _, _, _, _ = act(w, "!add(2,3)")
    assert obs["text"].endswith("\n!add(2,3)<eos>=5")
    act(w, "!add(2,x)")
    assert w.messages[-1]["content"].startswith("error: ValueError: invalid literal for int()")


def test_secret_digit_task_rewards() -> None:
    def episode(*texts: str) -> float:
        w = ToolEnvWrapper(
            SecretDigitEnv(), tiny_tok(), secret_digit_rows, max_tool_calls=1,
            parser=parse_compact_tool_calls, reward_fn=secret_digit_reward, pad_id=EOS,
            max_model_len=48, max_output_tokens=3,
        )  # fmt: skip
        w.reset(seed=3)
        for text in texts:
            _, reward, _, _, _ = act(w, text)
        return reward

    secret = secret_digit_rows(3)["secret"]
    wrong = str((int(secret) + 1) % 10)
    assert {secret_digit_rows(s)["secret"] for s in range(50)} == set("0123456789")
    assert episode("!", secret) == 1.0
    assert episode("!", secret + "1") == 0.5
    assert episode("!", wrong) == 0.0
    assert episode("!", "!") == 0.0  # truncated by max_tool_calls, no answer
    assert episode(secret) == 0.0  # a right guess without peeking


def test_vec_env_rolls_out_tool_episodes() -> None:
    """Works with SyncMultiTurnVecEnv: a scripted policy that peeks, then copies the result."""

    def factory() -> ToolEnvWrapper:
        return ToolEnvWrapper(
            SecretDigitEnv(), tiny_tok(), secret_digit_rows, max_tool_calls=1,
            parser=parse_compact_tool_calls, reward_fn=secret_digit_reward, pad_id=EOS,
            max_model_len=48, max_output_tokens=2,
        )  # fmt: skip

    tok = tiny_tok()

    def policy(obs: list[dict[str, Any]]) -> list[torch.Tensor]:
        out = []
        for o in obs:
            text = o["text"]
            reply = text[-1] if "=" in text else "!"
            out.append(torch.tensor([*encode(tok, reply), EOS]))
        return out

    vec = SyncMultiTurnVecEnv(factory, batch_size=4, group_size=2)
    batch = vec.rollout(policy, seed=0)
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert batch.returns.tolist() == [1.0] * 8
    assert batch.turn_mask.sum(1).tolist() == [2] * 8
    for env in vec.envs:  # the tiny template's own rendering, tools header included
        text = tok.apply_chat_template(env.messages, tools=env.schemas, tokenize=False)
        assert text.startswith("tools:peek\nsecret?\n!<eos>=")
        assert env.trajectory().input_ids.tolist() == encode(tok, text)


def test_call_reward_pays_turns_whose_calls_all_ran() -> None:
    w = wrap(call_reward=0.25, max_model_len=4096)
    w.reset(seed=1)
    assert act(w, call("add", a=1, b=2))[1] == 0.25
    assert act(w, call("divide", a=1, b=0))[1] == 0.0  # raised
    assert act(w, call("mul", a=1, b=0))[1] == 0.0  # unknown
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert w.trajectory().turn_rewards.tolist() == [0.25, 0.0, 0.0]


def test_async_tools_and_an_async_get_reward_are_awaited_as_in_trl() -> None:
    """TRL awaits ``async def`` tools and ``get_reward``: the model sees the result, not a
    coroutine's repr; a raising async tool is an error message like a raising sync one."""

    class AsyncCalculator(Calculator):
        async def mul(self, a: int, b: int) -> int:
            """Multiply two integers.

            Args:
                a: The first.
                b: The second.
            """
            await asyncio.sleep(0)
            if b == 0:
                raise ValueError("zero")
            self.calls += 1
            return a * b

        async def get_reward(self) -> float:
            await asyncio.sleep(0)
            return self.calls * 0.5

    w = wrap(AsyncCalculator(), max_model_len=4096)
    w.reset(seed=0)
    _, _, _, _, info = act(w, call("mul", a=2, b=3))
    assert w.messages[-1] == {"role": "tool", "name": "mul", "content": "6"}
    assert info == {"tool_calls": 1, "tool_errors": 0}
    act(w, call("mul", a=2, b=0))
    assert w.messages[-1]["content"] == "error: ValueError: zero"
    _, reward, term, _, _ = act(w, "6")
    assert (reward, term) == (0.5, True)


def test_a_hung_async_tool_times_out_with_tool_timeout() -> None:
    release = threading.Event()

    class SlowAsync(Calculator):
        async def wait(self, seconds: int) -> str:
            """Wait for the operator.

            Args:
                seconds: How long.
            """
            while not release.is_set():
                await asyncio.sleep(0.01)
            return "done"

    w = wrap(SlowAsync(), tool_timeout=0.2)
    w.reset(seed=0)
    try:
        with pytest.raises(EnvTimeoutError, match=r"^tool wait of SlowAsync did not return within 0\.2 s \(tool_timeout\) on turn 0"):  # fmt: skip
            act(w, call("wait", seconds=5))
    finally:
        release.set()


@pytest.mark.parametrize("value", [None, math.nan, "1.5", [1.0]])
def test_a_get_reward_that_returns_no_number_names_it_and_the_row(value: Any) -> None:
    class Bad(Calculator):
        def get_reward(self) -> Any:
            return value

    w = wrap(Bad())
    w.reset(seed=1)
    with pytest.raises(ValueError, match=rf"^`Bad\.get_reward\(\)` returned {re.escape(repr(value))} on row 1 \(seed 1\); it must return a finite number"):  # fmt: skip
        act(w, "5")
    assert w.messages[-1]["role"] == "user"  # the episode is as it was before the step


def test_a_reward_fn_that_returns_none_names_it() -> None:
    class NoReward:
        def reset(self, **row: Any) -> None:
            return None

    def judge(completion: str, environment: Any, **row: Any) -> Any:
        return None if completion == "?" else torch.tensor(0.25)

    w = wrap(NoReward(), reward_fn=judge)
    w.reset(seed=0)
    with pytest.raises(ValueError, match=r"^`reward_fn` judge returned None on row 0 \(seed 0\); it must return a finite number"):  # fmt: skip
        act(w, "?")
    assert act(w, "5")[1] == 0.25  # a one-element tensor is a number


def test_reset_must_take_the_rows_columns_and_return_text_or_none() -> None:
    class Narrow(Calculator):
        def reset(self, prompt: str) -> None:  # type: ignore[override]
            return None

    with pytest.raises(ValueError, match=r"^`Narrow\.reset` does not take the columns \['answer', 'prompt'\] of row 0 \(seed 0\): .*add \*\*kwargs"):  # fmt: skip
        wrap(Narrow()).reset(seed=0)

    class GymStyle(Calculator):
        def reset(self, **row: Any) -> Any:
            return "obs", {}

    with pytest.raises(ValueError, match=r"^`GymStyle\.reset\(\*\*row\)` returned a tuple on row 0 \(seed 0\); it must return the text to add to the prompt \(a str\) or None"):  # fmt: skip
        wrap(GymStyle()).reset(seed=0)

    class NoUser(Calculator):
        def reset(self, **row: Any) -> str:
            return "!"

    rows = [{"prompt": [{"role": "system", "content": "s"}]}]
    with pytest.raises(ValueError, match=r"^`NoUser\.reset\(\*\*row\)` returned text for row 0 \(seed 0\), whose prompt has no user message"):  # fmt: skip
        wrap(NoUser(), rows=rows).reset(seed=0)


def test_tools_with_star_args_are_refused_with_the_fix() -> None:
    class Variadic(Calculator):
        def total(self, *numbers: int) -> int:
            """Sum numbers.

            Args:
                numbers: The numbers.
            """
            return sum(numbers)

    class Keywords(Calculator):
        def config(self, name: str, **options: str) -> str:
            """Configure.

            Args:
                name: The name.
                options: More.
            """
            return name

    with pytest.raises(ValueError, match=r"^tool 'total' takes \*numbers, which a JSON tool call cannot pass: give it named parameters"):  # fmt: skip
        wrap(Variadic())
    with pytest.raises(ValueError, match=r"^tool 'config' takes \*\*options"):
        wrap(Keywords())


def test_a_template_that_drops_tool_messages_is_an_error_not_a_silent_reply() -> None:
    """A chat template without a 'tool' role used to leave the tool's result out: the model
    went on without ever seeing it."""
    no_tool = HERMES_TEMPLATE.replace(
        "{%- for m in messages -%}", "{%- for m in messages if m['role'] != 'tool' -%}"
    )
    w = wrap(tok=_tok(no_tool))
    w.reset(seed=0)
    with pytest.raises(ValueError, match=r"^the chat template dropped message 0 \(role 'tool'\) of the reply on turn 0: its content is not in the rendering"):  # fmt: skip
        act(w, call("add", a=2, b=3))
    assert [m["role"] for m in w.messages] == ["user"]  # the episode is as it was
