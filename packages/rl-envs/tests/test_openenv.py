"""OpenEnv environments through the multi-turn wrapper: in-process and served identically,
token-in/token-out, and every bad input a clear error (rl_envs.openenv, rl_envs.openenv_game)."""

from __future__ import annotations

import random
import string
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State
from rl_envs import SyncMultiTurnVecEnv
from rl_envs.openenv import OpenEnvError, OpenEnvTextEnv, OpenEnvWrapper, observation_text
from rl_envs.openenv_game import EchoAction, EchoDigitEnvironment, EchoObservation
from rl_testing.serving import free_port, raised_by, serving
from rl_testing.tokenizer import char_tokenizer

EOS = 2
TEMPLATE = (
    "{%- for m in messages -%}{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


def tok() -> Any:
    t = char_tokenizer()
    t.chat_template = TEMPLATE
    return t


def encode(t: Any, text: str) -> list[int]:
    return list(t(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The game behind OpenEnv's own create_app, served by uvicorn on a loopback port."""
    app = create_app(EchoDigitEnvironment, EchoAction, EchoObservation, max_concurrent_envs=16)
    with serving(app) as url:
        yield url


def wrapper(t: Any, environment: Any = None, **kw: Any) -> OpenEnvWrapper:
    args: dict[str, Any] = {
        "max_turns": 4,
        "pad_id": 0,
        "max_model_len": 256,
        "max_output_tokens": 4,
    }
    args.update(kw)
    return OpenEnvWrapper(environment, t, **args)


def echo_policy(t: Any) -> Any:
    """Actions drawn from a generator seeded by the observation's ids: any difference in what
    the environment said changes every later action."""

    def policy(obs: list[dict[str, Any]]) -> list[torch.Tensor]:
        out = []
        for o in obs:
            rng = random.Random(sum(i * (k + 1) for k, i in enumerate(o["input_ids"][0].tolist())))
            out.append(torch.tensor([*encode(t, rng.choice("0123x")), EOS]))
        return out

    return policy


def test_served_and_in_process_runs_give_identical_trajectories(server: str) -> None:
    t = tok()
    local = SyncMultiTurnVecEnv(
        lambda: wrapper(t, EchoDigitEnvironment), batch_size=4, group_size=2
    )
    remote = SyncMultiTurnVecEnv(
        lambda: wrapper(
            t, url=server, action_cls=EchoAction, observation_cls=EchoObservation, timeout=20
        ),
        batch_size=4,
        group_size=2,
    )
    a = local.rollout(echo_policy(t), seed=11)
    b = remote.rollout(echo_policy(t), seed=11)
    for name in ("input_ids", "action_mask", "turn_ids", "turn_rewards", "turn_mask"):
        # bit-exact: the same integers and dyadic/decimal rewards from the same game code
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.turn_mask.sum(1).tolist() != [1] * 8  # multi-turn episodes happened
    assert all(w.text_env.client is None for w in remote.envs)  # sessions closed at the end


def test_ids_are_the_templates_rendering_and_observations_are_masked() -> None:
    t = tok()
    w = wrapper(t, EchoDigitEnvironment(digits="7", digit_reward=0.25))
    obs, _ = w.reset(seed=0)
    assert obs["input_ids"][0].tolist() == encode(t, "<|user|>say 7?<eos><|assistant|>")
    action = [*encode(t, "3"), EOS]
    _, reward, done, _, _ = w.step(action)
    assert (reward, done) == (0.25, False)  # a wrong digit is worth digit_reward
    action2 = [*encode(t, "7"), EOS]
    _, reward, done, _, _ = w.step(action2)
    assert (reward, done) == (1.0, True)
    traj = w.trajectory()
    messages = [
        {"role": "user", "content": "say 7?"},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "no, say 7?"},
        {"role": "assistant", "content": "7"},
    ]
    rendered = t.apply_chat_template(messages, tokenize=False)
    assert traj.input_ids.tolist() == encode(t, rendered)
    ids = traj.input_ids.tolist()
    assert [i for i, m in zip(ids, traj.action_mask.tolist(), strict=True) if m] == action + action2
    assert traj.turn_rewards.tolist() == [0.25, 1.0]  # dyadic: exact in float32


def test_default_mappings() -> None:
    assert observation_text(EchoObservation(prompt="hi", reward=1.0, done=True)) == "hi"
    assert observation_text({"prompt": "a", "board": [1, 2]}) == "a"
    assert observation_text({"x": 1, "y": [2]}) == '{"x": 1, "y": [2]}'
    env = OpenEnvTextEnv(EchoDigitEnvironment)  # the action class read from step's annotation
    assert env.action_fn("5") == EchoAction(text="5")


class _Broken(Environment):  # type: ignore[misc]
    """An environment whose behaviour each test picks."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        return EchoObservation(prompt="go")

    def step(self, action: EchoAction, timeout_s: float | None = None, **kw: Any) -> Any:
        if self.mode == "raise":
            raise KeyError("board exploded")
        if self.mode == "no_reward":
            return EchoObservation(prompt="over", done=True)
        if self.mode == "none":
            return None
        return EchoObservation(prompt="again", reward=0.5)  # never ends

    @property
    def state(self) -> State:
        return State()


def test_an_environment_that_raises_names_itself_and_the_call() -> None:
    w = wrapper(tok(), _Broken("raise"))
    w.reset(seed=0)
    with pytest.raises(OpenEnvError, match=r"_Broken\.step raised KeyError: 'board exploded'"):
        w.step([*encode(w.tokenizer, "1"), EOS])


def test_an_episode_ending_without_a_reward_says_how_to_give_one() -> None:
    w = wrapper(tok(), _Broken("no_reward"))
    w.reset(seed=0)
    with pytest.raises(OpenEnvError, match=r"without a reward.*reward=fn"):
        w.step([*encode(w.tokenizer, "1"), EOS])
    w = wrapper(tok(), _Broken("no_reward"), reward=lambda obs: 2.0)
    w.reset(seed=0)
    assert w.step([*encode(w.tokenizer, "1"), EOS])[1:3] == (2.0, True)


def test_an_environment_that_never_ends_is_truncated_at_max_turns() -> None:
    w = wrapper(tok(), _Broken("endless"), max_turns=3)
    w.reset(seed=0)
    for _ in range(3):
        _, reward, terminated, truncated, info = w.step([*encode(w.tokenizer, "1"), EOS])
    assert (reward, terminated, truncated, info["truncated_by"]) == (0.5, False, True, "max_turns")
    assert w.done


def test_an_action_the_mapping_refuses_is_a_clear_error() -> None:
    def strict(text: str) -> EchoAction:
        if not text.isdigit():
            raise ValueError("not a digit")
        return EchoAction(text=text)

    w = wrapper(tok(), EchoDigitEnvironment, action=strict)
    w.reset(seed=0)
    with pytest.raises(OpenEnvError, match=r"refused 'x' \(ValueError: not a digit\)"):
        w.step([*encode(w.tokenizer, "x"), EOS])


def test_a_down_server_fails_within_the_timeout_naming_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    w = wrapper(tok(), url=url, action_cls=EchoAction, timeout=2)
    with pytest.raises(OpenEnvError, match=f"server at {url} is unreachable within 2s"):
        w.reset(seed=0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of `environment`"):
        OpenEnvTextEnv()
    with pytest.raises(ValueError, match="cannot tell the action class"):
        OpenEnvTextEnv(url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="`timeout` must be > 0"):
        OpenEnvTextEnv(EchoDigitEnvironment, timeout=0)


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import rl_envs.openenv as adapter

    for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openenv", None)
    with pytest.raises(ImportError, match=r"^rl_envs\.openenv needs the 'openenv' extra: "):
        adapter.OpenEnvTextEnv(url="http://127.0.0.1:1", action_cls=EchoAction)
    with pytest.raises(ImportError) as info:
        adapter.OpenEnvTextEnv(url="http://127.0.0.1:1", action_cls=EchoAction)
    assert "\n" not in str(info.value)
    assert "pip install 'rl-envs[openenv]'" in str(info.value)


def test_rl_envs_imports_without_the_extras() -> None:
    """Both extras blocked in a fresh interpreter: the package and the adapter modules import;
    only using them asks for the extra."""
    import subprocess

    code = (
        "import sys; sys.modules['openenv'] = None; sys.modules['verifiers'] = None\n"
        "import rl_envs, rl_envs.openenv, rl_envs.verifiers\n"
        "rl_envs.SyncMultiTurnVecEnv, rl_envs.OpenEnvWrapper, rl_envs.TasksetEnvWrapper\n"
        "try:\n    import rl_envs.openenv_game\nexcept ImportError as exc:\n    print(exc)\n"
    )
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = "rl_envs.openenv_game needs the 'openenv' extra: pip install 'rl-envs[openenv]'"
    assert out.stdout.strip() == expected


def _calculator(other: float = 0.0) -> Any:
    """A real MCP tool environment: FastMCP's server with one tool, OpenEnv's MCPEnvironment;
    the episode ends on the first call whose result is 5 (reward 1), other calls earn `other`.
    `steps` counts the environment's steps."""
    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment

    mcp = FastMCP("calculator")

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class Calculator(MCPEnvironment):  # type: ignore[misc]
        steps = 0

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
            return EchoObservation(prompt="make 5 with add")

        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            self.steps += 1
            obs = super().step(action, timeout_s=timeout_s, **kw)
            done = observation_text(obs) == "5"
            return obs.model_copy(update={"reward": 1.0 if done else other, "done": done})

        def _step_impl(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            raise ValueError("only tool calls")

        @property
        def state(self) -> State:
            return State()

    return Calculator(mcp)


def json_tok() -> Any:
    """The char tokenizer with the characters of JSON tool calls."""
    from rl_testing.tokenizer import DEFAULT_ALPHABET

    t = char_tokenizer(DEFAULT_ALPHABET + string.ascii_uppercase + '<>{}[]"_;')
    t.chat_template = TEMPLATE
    return t


def test_mcp_tool_environments_take_hermes_calls_by_default() -> None:
    w = wrapper(json_tok(), _calculator(), max_model_len=512, max_output_tokens=96)
    w.reset(seed=0)

    def act(text: str) -> tuple[Any, ...]:
        obs, reward, done, _, _ = w.step([*encode(w.tokenizer, text), EOS])
        return obs["text"].rsplit("<|user|>", 1)[-1], reward, done

    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    assert act(call) == ("3<eos><|assistant|>", 0.0, False)
    assert act(call.replace('"b": 2', '"b": 4'))[1:] == (1.0, True)


def _call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def _mcp_episode(**kw: Any) -> tuple[OpenEnvWrapper, Any]:
    environment = _calculator(**kw)
    w = wrapper(json_tok(), environment, max_model_len=1024, max_output_tokens=256)
    w.reset(seed=0)
    return w, environment


def _last_message(w: OpenEnvWrapper, obs: dict[str, Any]) -> str:
    return str(obs["text"]).rsplit("<|user|>", 1)[-1].removesuffix("<eos><|assistant|>")


HERMES = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("hi", "no tool call in the answer"),
        ("<tool_call>{add}</tool_call>", "the tool call is not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'a tool call must be {"name"'),
    ],
)
def test_an_mcp_answer_without_a_usable_call_is_answered_with_an_error(
    answer: str, why: str
) -> None:
    w, environment = _mcp_episode()
    obs, reward, terminated, truncated, info = w.step([*encode(w.tokenizer, answer), EOS])
    message = _last_message(w, obs)
    assert message.startswith(f"error: {why}") and message.endswith(f"; write {HERMES}")
    assert (reward, terminated, truncated, environment.steps) == (0.0, False, False, 0)
    assert (info["tool_calls"], info["tool_errors"]) == (0, 1)
    assert info["observation"].prompt == "make 5 with add"  # still reset's
    # the model gets another turn, and a call then runs
    obs, reward, terminated, _, info = w.step([*encode(w.tokenizer, _call(2, 3)), EOS])
    assert (reward, terminated, environment.steps) == (1.0, True, 1)
    assert (info["tool_calls"], info["tool_errors"]) == (1, 1)


def test_every_mcp_call_of_an_answer_runs_in_order_and_the_rewards_add_up() -> None:
    w, environment = _mcp_episode(other=0.25)
    answer = f"{_call(1, 2)}\n{_call(0, 4)}"
    obs, reward, terminated, truncated, info = w.step([*encode(w.tokenizer, answer), EOS])
    assert _last_message(w, obs) == "3\n4"  # each result's text, in the calls' order
    assert (reward, terminated, truncated, environment.steps) == (0.5, False, False, 2)
    assert (info["tool_calls"], info["tool_errors"]) == (2, 0)
    assert observation_text(info["observation"]) == "4"  # the last call's observation
    assert w.trajectory().turn_rewards.tolist() == [0.5]  # dyadic: exact in float32


def test_an_mcp_call_that_ends_the_episode_stops_the_rest() -> None:
    w, environment = _mcp_episode(other=0.25)
    answer = _call(1, 1) + _call(2, 3) + _call(3, 3)
    _, reward, terminated, truncated, info = w.step([*encode(w.tokenizer, answer), EOS])
    assert (reward, terminated, truncated, environment.steps) == (1.25, True, False, 2)
    assert info["tool_calls"] == 2 and w.done


def test_an_mcp_episode_of_only_bad_answers_is_truncated_at_max_turns() -> None:
    environment = _calculator()
    w = wrapper(json_tok(), environment, max_turns=3, max_model_len=1024, max_output_tokens=16)
    w.reset(seed=0)
    for answer in ("hi", "<tool_call>{", "5"):
        _, reward, terminated, truncated, info = w.step([*encode(w.tokenizer, answer), EOS])
    assert (reward, terminated, truncated, info["truncated_by"]) == (0.0, False, True, "max_turns")
    assert (environment.steps, info["tool_errors"], w.trajectory().turn_rewards.tolist()) == (
        0,
        3,
        [0.0, 0.0, 0.0],
    )


def test_a_users_own_action_mapping_that_raises_still_ends_the_run() -> None:
    from rl_envs.openenv import mcp_action

    def strict(text: str) -> Any:
        if "<tool_call>" not in text:
            raise ValueError("not a call")
        return mcp_action(text)

    w = wrapper(json_tok(), _calculator(), action=strict)
    w.reset(seed=0)
    with pytest.raises(OpenEnvError, match=r"refused 'hi' \(ValueError: not a call\)"):
        w.step([*encode(w.tokenizer, "hi"), EOS])


def test_mcp_action_is_the_first_call_and_mcp_actions_all_of_them() -> None:
    from openenv.core.env_server.mcp_types import CallToolAction
    from rl_envs.openenv import mcp_action, mcp_actions

    answer = _call(1, 2) + "then" + _call(3, 4)
    first, second = (CallToolAction(tool_name="add", arguments={"a": a, "b": b}) for a, b in [(1, 2), (3, 4)])  # fmt: skip
    assert mcp_actions(answer) == [first, second]
    assert mcp_action(answer) == first
    with pytest.raises(ValueError, match=r"^no tool call in the answer; write <tool_call>"):
        mcp_action("hi")


def test_a_step_that_returns_no_observation_names_the_environment() -> None:
    w = wrapper(tok(), _Broken("none"))
    w.reset(seed=0)
    with pytest.raises(OpenEnvError, match=r"^_Broken\.step returned None; it must return an OpenEnv Observation \(with `done` and `reward`\)"):  # fmt: skip
        w.step([*encode(w.tokenizer, "1"), EOS])


_RELEASE = threading.Event()


class _Stuck(EchoDigitEnvironment):
    """The game, except that an answer starting with 'h' blocks the server until released."""

    def step(self, action: EchoAction, timeout_s: float | None = None, **kw: Any) -> Any:
        if action.text.startswith("h"):
            _RELEASE.wait()
        return super().step(action)


def test_a_server_that_stops_answering_mid_episode_is_an_error_naming_it_and_the_timeout() -> None:
    app = create_app(_Stuck, EchoAction, EchoObservation, max_concurrent_envs=2)
    t = tok()
    _RELEASE.clear()
    try:
        with serving(app) as url:
            w = wrapper(t, url=url, action_cls=EchoAction, observation_cls=EchoObservation, timeout=1)  # fmt: skip
            w.reset(seed=0)
            error = raised_by(lambda: w.step([*encode(t, "h"), EOS]), 120)
            _RELEASE.set()
    finally:
        _RELEASE.set()
    assert isinstance(error, OpenEnvError), repr(error)
    assert str(error).startswith(f"the OpenEnv server at {url} did not answer within 1s on step")
    assert w.text_env.client is None  # the session is dropped
