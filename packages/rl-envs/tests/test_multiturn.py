"""TokenObservationWrapper and SyncMultiTurnVecEnv on scripted text environments."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch
from envs_testlib import encode, tok
from rl_envs import EnvTimeoutError
from rl_envs.multiturn import SyncMultiTurnVecEnv, TokenObservationWrapper, TrajectoryBatch

PAD, EOS, USER, ASSISTANT = 0, 2, 5, 6


class Scripted:
    """Replies 'r1', 'r2', ... with reward 0.1 * turn; terminates after ``length`` turns."""

    def __init__(self, length: int = 3, first: str = "go") -> None:
        self.length, self.first, self.turn, self.actions = length, first, 0, []
        self.seeds: list[int | None] = []

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.turn, self.actions = 0, []
        self.seeds.append(seed)
        return f"{self.first}{'' if seed is None else seed}", {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.actions.append(action)
        self.turn += 1
        return f"r{self.turn}", 0.1 * self.turn, self.turn >= self.length, False, {"t": self.turn}


def wrap(env: Scripted, **kw: Any) -> TokenObservationWrapper:
    args: dict[str, Any] = {
        "max_turns": 4,
        "pad_id": PAD,
        "max_model_len": 64,
        "max_output_tokens": 6,
    }
    args.update(kw)
    return TokenObservationWrapper(env, tok(), **args)


def test_scripted_episode_ids_mask_turns_and_rewards() -> None:
    env = Scripted(length=2)
    w = wrap(env)
    obs, info = w.reset(seed=None)
    prompt = [USER, *encode("go"), EOS, ASSISTANT]
    assert obs["input_ids"][0].tolist() == prompt
    assert info == {"seed": None}
    a0 = [*encode("ab"), EOS, PAD, PAD]  # generated with eos, then right padding
    obs, r, term, trunc, info = w.step(torch.tensor(a0))
    assert (r, term, trunc) == (pytest.approx(0.1), False, False)
    reply1 = [USER, *encode("r1"), EOS, ASSISTANT]
    assert obs["input_ids"][0].tolist() == prompt + encode("ab") + [EOS] + reply1
    a1 = encode("cde")  # no eos: cut by the generation budget
    obs, r, term, trunc, info = w.step(a1)
    assert (r, term, trunc) == (pytest.approx(0.2), True, False)
    assert env.actions == ["ab", "cde"]
    t = w.trajectory()
    expected = prompt + encode("ab") + [EOS] + reply1 + encode("cde")
    assert t.input_ids.tolist() == expected
    n_p, n_a0, n_r = len(prompt), 3, len(reply1)
    assert t.action_mask.tolist() == [False] * n_p + [True] * n_a0 + [False] * n_r + [True] * 3
    assert t.turn_ids.tolist() == [-1] * n_p + [0] * n_a0 + [-1] * n_r + [1] * 3
    assert t.turn_rewards.tolist() == pytest.approx([0.1, 0.2])
    assert (t.terminated, t.truncated, t.prompt_length) == (True, False, n_p)
    with pytest.raises(RuntimeError, match="call reset"):
        w.step(encode("x"))


def test_action_without_eos_gets_the_closing_marker_as_environment_tokens() -> None:
    w = wrap(Scripted(length=3))
    w.reset()
    w.step(encode("ab"))
    t = w.trajectory()
    tail = [EOS, USER, *encode("r1"), EOS, ASSISTANT]
    assert t.input_ids.tolist()[-len(tail) - 2 :] == encode("ab") + tail
    assert t.action_mask.tolist()[-len(tail) - 2 :] == [True, True] + [False] * len(tail)


def test_the_conversation_equals_the_chat_template_rendering() -> None:
    """The spliced token sequence is what the chat template renders for the same messages."""
    w = wrap(Scripted(length=3), system_prompt="be brief")
    w.reset(seed=7)
    for text in ["one", "two"]:
        w.step([*encode(text), EOS])
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go7"},
            {"role": "assistant", "content": "one"}, {"role": "user", "content": "r1"},
            {"role": "assistant", "content": "two"}, {"role": "user", "content": "r2"}]  # fmt: skip
    rendered = tok().apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert w.trajectory().input_ids.tolist() == encode(rendered)


def test_max_turns_truncates() -> None:
    w = wrap(Scripted(length=10), max_turns=2)
    w.reset()
    _, _, term, trunc, _ = w.step(encode("a"))
    assert (term, trunc) == (False, False)
    _, _, term, trunc, info = w.step(encode("b"))
    assert (term, trunc, info["truncated_by"]) == (False, True, "max_turns")
    assert w.trajectory().turn_rewards.numel() == 2


def test_truncation_at_max_model_len() -> None:
    # prompt 5 tokens; +2 action; reply 5 -> 12; 12 + 6 > 17 -> truncated before appending
    w = wrap(Scripted(length=10), max_model_len=17, max_output_tokens=6)
    obs, _ = w.reset()
    assert obs["input_ids"].shape[1] == 5
    _, _, term, trunc, info = w.step([*encode("a"), EOS])
    assert (term, trunc, info["truncated_by"]) == (False, True, "max_model_len")
    t = w.trajectory()
    assert len(t.input_ids) == 5 + 2  # the reply was not appended
    assert len(t.input_ids) <= 17


def test_without_chat_template_observations_are_tokenized_as_they_are() -> None:
    w = wrap(Scripted(length=2), apply_chat_template=False)
    obs, _ = w.reset()
    assert obs["input_ids"][0].tolist() == encode("go")
    w.step([*encode("x"), EOS])
    assert w.trajectory().input_ids.tolist() == encode("go") + encode("x") + [EOS] + encode("r1")


def test_bad_actions_and_arguments() -> None:
    w = wrap(Scripted())
    w.reset()
    with pytest.raises(ValueError, match="no generated token"):
        w.step([PAD, PAD])
    with pytest.raises(ValueError, match="more than max_output_tokens=6"):
        w.step(encode("abcdefg"))
    with pytest.raises(ValueError, match=r"generated token ids \[T\]"):
        w.step(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="`max_turns` must be >= 1"):
        wrap(Scripted(), max_turns=0)
    with pytest.raises(ValueError, match="must exceed `max_output_tokens`"):
        wrap(Scripted(), max_model_len=6, max_output_tokens=6)
    long_first = wrap(Scripted(first="x" * 40), max_model_len=30, max_output_tokens=6)
    with pytest.raises(ValueError, match="exceeds max_model_len=30"):
        long_first.reset()


class Faulty(Scripted):
    """Scripted, but ``step`` returns ``bad`` (or raises it, for an exception) on its first call."""

    def __init__(self, bad: Any) -> None:
        super().__init__(length=3)
        self.bad, self.failed = bad, False

    def step(self, action: str) -> Any:
        if not self.failed:
            self.failed = True
            if isinstance(self.bad, BaseException):
                raise self.bad
            return self.bad
        return super().step(action)


def state(w: TokenObservationWrapper) -> tuple[list[Any], ...]:
    t = w.trajectory()
    return (t.input_ids.tolist(), t.action_mask.tolist(), t.turn_ids.tolist(),
            t.turn_rewards.tolist(), list(w._messages))  # fmt: skip


def test_an_env_that_raises_leaves_the_episode_as_it_was() -> None:
    w = wrap(Faulty(RuntimeError("env died")))
    w.reset(seed=1)
    w.env.failed = True  # the first turn goes through
    w.step([*encode("ab"), EOS])
    w.env.failed = False  # the second raises
    before = state(w)
    with pytest.raises(RuntimeError, match="env died"):
        w.step([*encode("cd"), EOS])
    assert state(w) == before  # no action tokens without their reply, no reward
    assert not w.done
    w.step([*encode("ef"), EOS])  # a retry continues the episode as if the failure never was
    clean = wrap(Scripted(length=3))
    clean.reset(seed=1)
    clean.step([*encode("ab"), EOS])
    clean.step([*encode("ef"), EOS])
    assert state(w) == state(clean)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            ("obs", 1.0, False, {}),
            r"Faulty\.step returned a 4-tuple; it must return \(observation, reward, terminated, truncated, info\), Gymnasium's five-tuple",
        ),
        (None, r"Faulty\.step returned a NoneType; it must return \(observation, reward"),
        (
            ("obs", math.nan, False, False, {}),
            r"Faulty\.step returned the reward nan;.*a finite number as reward",
        ),
        (("obs", None, False, False, {}), r"Faulty\.step returned the reward None;"),
        (("obs", "1.0", False, False, {}), r"Faulty\.step returned the reward '1\.0';"),
        (
            (None, 0.0, False, False, {}),
            r"Faulty\.step returned the observation None \(NoneType\);.*the observation a str",
        ),
        (
            ("obs", 0.0, False, False, None),
            r"Faulty\.step returned info is a NoneType;.*info a dict",
        ),
    ],
)
def test_a_wrong_step_return_names_the_env_and_the_form(bad: Any, match: str) -> None:
    w = wrap(Faulty(bad))
    w.reset()
    before = state(w)
    with pytest.raises(ValueError, match=match):
        w.step([*encode("ab"), EOS])
    assert state(w) == before


def test_step_timeout_names_the_env_the_turn_and_the_option() -> None:
    release = threading.Event()

    class Stuck(Scripted):
        def __init__(self) -> None:
            super().__init__(length=3)
            self.stuck_at_reset = False

        def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
            if self.stuck_at_reset:
                release.wait()
            return super().reset(seed)

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            if action == "stuck":
                release.wait()
            return super().step(action)

    env = Stuck()
    w = wrap(env, step_timeout=0.2)
    w.reset(seed=0)
    w.step([*encode("ab"), EOS])
    before = state(w)
    try:
        with pytest.raises(
            EnvTimeoutError,
            match=r"^Stuck\.step did not return within 0\.2 s \(step_timeout\) on turn 1; raise step_timeout or fix the environment$",
        ):
            w.step([*encode("stuck"), EOS])
        assert state(w) == before
        env.stuck_at_reset = True
        with pytest.raises(EnvTimeoutError, match=r"^Stuck\.reset did not return within 0\.2 s \(step_timeout\) on reset \(seed=3\)"):  # fmt: skip
            w.reset(seed=3)
    finally:
        release.set()


def test_without_step_timeout_the_env_runs_on_the_calling_thread() -> None:
    threads: list[threading.Thread] = []

    class Where(Scripted):
        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            threads.append(threading.current_thread())
            return super().step(action)

    w = wrap(Where())
    w.reset()
    w.step(encode("a"))
    assert threads == [threading.current_thread()]
    w = wrap(Where(), step_timeout=10.0)
    w.reset()
    w.step(encode("a"))
    assert threads[1] is not threading.current_thread() and threads[1].daemon
    for bad in (0, -1.0, math.nan, "1"):
        with pytest.raises(ValueError, match="`step_timeout` must be a finite number of seconds > 0"):  # fmt: skip
            wrap(Scripted(), step_timeout=bad)


def test_vec_env_groups_share_seeds_and_collate() -> None:
    envs: list[Scripted] = []

    def factory() -> TokenObservationWrapper:
        envs.append(Scripted(length=2))
        return wrap(envs[-1])

    vec = SyncMultiTurnVecEnv(factory, batch_size=2, group_size=3)
    calls: list[int] = []

    def policy(observations: list[dict[str, Any]]) -> list[list[int]]:
        calls.append(len(observations))
        return [[*encode("a" * (1 + i % 3)), EOS] for i in range(len(observations))]

    batch = vec.rollout(policy, seed=10)
    assert isinstance(batch, TrajectoryBatch)
    assert [e.seeds[-1] for e in envs] == [10, 10, 10, 11, 11, 11]
    assert calls == [6, 6]
    assert batch.group_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.turn_rewards.shape == (6, 4)
    assert batch.turn_mask.tolist() == [[True, True, False, False]] * 6
    assert batch.returns.tolist() == pytest.approx([0.3] * 6)
    assert batch.terminated.all()
    assert not batch.truncated.any()
    for r in range(6):
        t = vec.envs[r].trajectory()
        n = len(t.input_ids)
        assert batch.input_ids[r, :n].tolist() == t.input_ids.tolist()
        assert (batch.input_ids[r, n:] == PAD).all()
        assert not batch.attention_mask[r, n:].any()
        assert (batch.turn_ids[r, n:] == -1).all()
        assert torch.equal(batch.action_mask[r, :n], t.action_mask)  # bit-exact: bool mask


def test_vec_env_step_checks() -> None:
    vec = SyncMultiTurnVecEnv(lambda: wrap(Scripted(length=1)), batch_size=2)
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="`actions` has 1 entries for 2 environments"):
        vec.step([encode("a")])
    with pytest.raises(ValueError, match="environment 1 is still running"):
        vec.step([encode("a"), None])
    vec.step([encode("a"), encode("b")])
    with pytest.raises(ValueError, match="environment 0 has finished"):
        vec.step([encode("a"), None])
    with pytest.raises(ValueError, match="`group_size` must be >= 1"):
        SyncMultiTurnVecEnv(lambda: wrap(Scripted()), batch_size=1, group_size=0)


def test_factory_is_picklable_and_wraps_a_fresh_env_per_call() -> None:
    import functools
    import pickle

    from rl_envs.tasks import GuessTheNumberEnv

    factory = TokenObservationWrapper.factory(
        functools.partial(GuessTheNumberEnv, 0, 3, max_guesses=2), tok(), max_turns=2,
        pad_id=0, max_model_len=64, max_output_tokens=2, apply_chat_template=False,
    )  # fmt: skip
    again = pickle.loads(pickle.dumps(factory))
    a, b = factory(), again()
    assert isinstance(a, TokenObservationWrapper) and a.env is not b.env
    assert (a.max_turns, a.max_model_len) == (2, 64)
    assert a.reset(seed=3)[0]["input_ids"].tolist() == b.reset(seed=3)[0]["input_ids"].tolist()


def test_a_template_that_drops_the_generation_prompt_says_so() -> None:
    """The assistant marker only inside assistant messages, none for add_generation_prompt:
    the error used to say the template changes the assistant's text."""
    from rl_testing.tokenizer import char_tokenizer

    t = char_tokenizer()
    t.chat_template = (
        "{%- for m in messages -%}{%- if m['role'] == 'assistant' -%}"
        "{{ '<|assistant|>' + m['content'] + '<eos>' }}"
        "{%- else -%}{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}{%- endif -%}"
        "{%- endfor -%}"
    )
    w = TokenObservationWrapper(Scripted(), t, max_turns=3, pad_id=PAD, max_model_len=64,
                                max_output_tokens=6)  # fmt: skip
    w.reset(seed=0)
    with pytest.raises(ValueError, match=r"^the chat template puts '<\|assistant\|>' in front of the assistant's text, but its generation prompt \(add_generation_prompt=True\) does not end with it"):  # fmt: skip
        w.step([*encode("ab"), EOS])


def test_a_reply_the_chat_template_drops_is_an_error() -> None:
    from rl_testing.tokenizer import char_tokenizer

    class System(Scripted):
        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return "r", 0.0, False, False, {}

    class SystemReplies(TokenObservationWrapper):
        def _reply_messages(self, observation: Any) -> list[dict[str, Any]]:
            return [{"role": "observation", "content": observation}]

    t = char_tokenizer()
    t.chat_template = (
        "{%- for m in messages if m['role'] in ['system', 'user', 'assistant'] -%}"
        "{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
    )
    w = SystemReplies(System(), t, max_turns=3, pad_id=PAD, max_model_len=64, max_output_tokens=6)
    w.reset(seed=0)
    with pytest.raises(ValueError, match=r"^the chat template dropped message 0 \(role 'observation'\) of the reply on turn 0"):  # fmt: skip
        w.step([*encode("ab"), EOS])
