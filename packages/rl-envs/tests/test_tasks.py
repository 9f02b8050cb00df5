"""rl_envs.tasks: built-in single-turn tasks, the registry, splits and the toy environments."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

import pytest
from datasets import Dataset
from rl_envs.tasks import (
    TASK_ALPHABET,
    TASKS,
    GuessTheNumberEnv,
    ToyArithmeticEnv,
    available_tasks,
    get_task,
    reverse_string,
    small_arithmetic,
    sort_string,
    successor_digit,
    train_test_split_task,
)

ALLOWED = set(string.digits + string.ascii_lowercase + " \n" + "+-*/=?.,:()!'")


def _arith(question: str) -> str:
    m = re.fullmatch(r"(\d+)([+\-*])(\d+)=", question)
    assert m, question
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


# (task, options, independent recomputation of the answer from the question)
CASES: list[tuple[Callable[..., Dataset], dict[str, Any], Callable[[str], str]]] = [
    (successor_digit, {}, lambda q: str((int(q) + 1) % 10)),
    (small_arithmetic, {}, _arith),
    (small_arithmetic, {"max_operand": 30, "ops": "+-*"}, _arith),
    (small_arithmetic, {"ops": "*"}, _arith),
    (reverse_string, {}, lambda q: q[::-1]),
    (reverse_string, {"length": 6, "alphabet": "xyz019!"}, lambda q: q[::-1]),
    (sort_string, {}, lambda q: "".join(sorted(q))),
    (sort_string, {"length": 5, "alphabet": "zy.a9"}, lambda q: "".join(sorted(q))),
]
IDS = [f"{task.__name__}-{i}" for i, (task, _, _) in enumerate(CASES)]


def test_task_alphabet() -> None:
    assert set(TASK_ALPHABET) == ALLOWED
    assert len(TASK_ALPHABET) == len(ALLOWED)


def test_task_alphabet_matches_the_test_char_tokenizer() -> None:
    # The char-level tokenizer used to train tiny models on these tasks must cover every char.
    from rl_testing.tokenizer import DEFAULT_ALPHABET

    assert set(TASK_ALPHABET) <= set(DEFAULT_ALPHABET)


@pytest.mark.parametrize(("task", "options", "solve"), CASES, ids=IDS)
def test_task_columns_answers_and_chars(
    task: Callable[..., Dataset], options: dict[str, Any], solve: Callable[[str], str]
) -> None:
    ds = task(200, seed=3, **options)
    assert isinstance(ds, Dataset)
    assert len(ds) == 200
    assert ds.column_names == ["question", "answer"]
    assert all(ds.features[c].dtype == "string" for c in ds.column_names)
    for row in ds:
        q, a = row["question"], row["answer"]
        assert isinstance(q, str)
        assert isinstance(a, str)
        assert q
        assert a
        assert a == solve(q)
        assert set(q) | set(a) <= ALLOWED
        assert len(q) <= 8
        assert len(a) <= 6


@pytest.mark.parametrize(("task", "options", "solve"), CASES, ids=IDS)
def test_task_deterministic_per_seed(
    task: Callable[..., Dataset], options: dict[str, Any], solve: Callable[[str], str]
) -> None:
    a = task(60, seed=7, **options)
    b = task(60, seed=7, **options)
    c = task(60, seed=8, **options)
    assert a.to_dict() == b.to_dict()
    assert a["question"] != c["question"]
    assert task(1, **options).to_dict() == task(1, seed=0, **options).to_dict()


@pytest.mark.parametrize(("task", "options", "solve"), CASES, ids=IDS)
def test_task_does_not_touch_the_global_rng(
    task: Callable[..., Dataset], options: dict[str, Any], solve: Callable[[str], str]
) -> None:
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    task(20, seed=1, **options)
    assert random.random() == expected


@pytest.mark.parametrize("task", list(TASKS.values()))
@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3"])
def test_task_rejects_bad_n(task: Callable[..., Dataset], n: object) -> None:
    with pytest.raises(ValueError, match="`n`"):
        task(n)


def test_successor_digit_covers_all_digits() -> None:
    ds = successor_digit(300)
    assert set(ds["question"]) == set(string.digits)
    assert successor_digit(300).filter(lambda r: r["question"] == "9")["answer"][0] == "0"


def test_small_arithmetic_details() -> None:
    ds = small_arithmetic(500, seed=1, max_operand=4, ops="+-*")
    ops = {re.search(r"[+\-*]", q).group() for q in ds["question"]}  # type: ignore[union-attr]
    assert ops == {"+", "-", "*"}
    operands = {int(x) for q in ds["question"] for x in re.findall(r"\d+", q)}
    assert operands == {0, 1, 2, 3, 4}
    minus = small_arithmetic(300, seed=2, ops="-")
    assert all(int(a) >= 0 for a in minus["answer"])
    assert all("-" in q for q in minus["question"])
    assert small_arithmetic(1, max_operand=1, ops="+")[0]["question"] in {
        "0+0=",
        "0+1=",
        "1+0=",
        "1+1=",
    }


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"ops": ""}, "`ops`"),
        ({"ops": "/"}, "`ops`"),
        ({"ops": "+x"}, "`ops`"),
        ({"max_operand": 0}, "`max_operand`"),
        ({"max_operand": -3}, "`max_operand`"),
    ],
)
def test_small_arithmetic_rejects(options: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        small_arithmetic(5, **options)


@pytest.mark.parametrize("task", [reverse_string, sort_string])
@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"length": 0}, "`length`"),
        ({"alphabet": ""}, "`alphabet`"),
        ({"alphabet": "aB"}, "`alphabet`"),
        ({"alphabet": "a b"}, "`alphabet`"),
        ({"alphabet": "a\n"}, "`alphabet`"),
        ({"alphabet": "a#"}, "`alphabet`"),
    ],
)
def test_string_tasks_reject(
    task: Callable[..., Dataset], options: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        task(5, **options)


def test_string_tasks_length_and_alphabet() -> None:
    rev = reverse_string(100, length=4, alphabet="ab")
    assert all(len(q) == 4 and set(q) <= {"a", "b"} for q in rev["question"])
    srt = sort_string(100, seed=5)
    assert all(len(q) == 3 and set(q) <= set("abcd") for q in srt["question"])
    assert sort_string(50, seed=1, length=1, alphabet="q")["answer"] == ["q"] * 50


# ---------------------------------------------------------------------------------- registry


def test_registry() -> None:
    names = ["reverse_string", "small_arithmetic", "sort_string", "successor_digit"]
    assert available_tasks() == names
    assert sorted(TASKS) == names
    assert get_task("successor_digit") is successor_digit
    assert get_task("small_arithmetic") is small_arithmetic
    assert get_task("reverse_string") is reverse_string
    assert get_task("sort_string") is sort_string
    assert TASKS["sort_string"](3, seed=1).to_dict() == sort_string(3, seed=1).to_dict()


def test_get_task_unknown_lists_names() -> None:
    with pytest.raises(ValueError, match="`name`") as info:
        get_task("nope")
    for name in available_tasks():
        assert name in str(info.value)


def test_train_test_split_task() -> None:
    train, test = train_test_split_task("small_arithmetic", 50, 20, seed=4, max_operand=40)
    assert (len(train), len(test)) == (50, 20)
    assert train.column_names == test.column_names == ["question", "answer"]
    assert train.to_dict() == small_arithmetic(50, seed=4, max_operand=40).to_dict()
    assert test["question"] != train["question"][:20]
    assert all(_arith(q) == a for q, a in zip(test["question"], test["answer"], strict=True))
    assert max(int(x) for q in test["question"] for x in re.findall(r"\d+", q)) > 9
    again = train_test_split_task("small_arithmetic", 50, 20, seed=4, max_operand=40)
    assert again[0].to_dict() == train.to_dict()
    assert again[1].to_dict() == test.to_dict()
    other = train_test_split_task("small_arithmetic", 50, 20, seed=5, max_operand=40)
    assert other[1]["question"] != test["question"]


def test_train_test_split_small_space_may_overlap() -> None:
    train, test = train_test_split_task("successor_digit", 100, 100)
    assert set(train["question"]) & set(test["question"])  # documented: 10 questions only


@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        (("unknown", 5, 5), {}, "`name`"),
        (("successor_digit", 0, 5), {}, "`n_train`"),
        (("successor_digit", 5, 0), {}, "`n_test`"),
        (("reverse_string", 5, 5), {"length": 0}, "`length`"),
    ],
)
def test_train_test_split_rejects(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name) as info:
        train_test_split_task(*args, **kwargs)
    if name == "`name`":
        assert all(task in str(info.value) for task in available_tasks())


# ------------------------------------------------------------------------- GuessTheNumberEnv


def test_guess_reset_reproducible_and_prompt() -> None:
    env = GuessTheNumberEnv()
    obs, info = env.reset(seed=11)
    assert obs == "guess a number from 0 to 9."
    assert info == {"secret": info["secret"], "guesses": 0, "correct": False}
    assert 0 <= info["secret"] <= 9
    assert env.reset(seed=11)[1]["secret"] == info["secret"]
    assert GuessTheNumberEnv().reset(seed=11)[1]["secret"] == info["secret"]
    secrets = {env.reset(seed=s)[1]["secret"] for s in range(200)}
    assert secrets == set(range(10))
    unseeded = {env.reset()[1]["secret"] for _ in range(200)}
    assert len(unseeded) > 1


def test_guess_correct_first_time() -> None:
    env = GuessTheNumberEnv(correct_reward=2.0)
    _, info = env.reset(seed=0)
    secret = info["secret"]
    obs, reward, terminated, truncated, info = env.step(f"i guess {secret}.")
    assert (obs, reward, terminated, truncated) == ("correct!", 2.0, True, False)
    assert info == {"secret": secret, "guesses": 1, "correct": True}
    assert env.done
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        env.step(str(secret))


@pytest.mark.parametrize("seed", range(20))
def test_guess_binary_search_hints_are_consistent(seed: int) -> None:
    env = GuessTheNumberEnv(low=0, high=9, max_guesses=4)
    _, info = env.reset(seed=seed)
    secret = info["secret"]
    lo, hi = 0, 9
    for turn in range(1, 5):
        guess = (lo + hi) // 2
        obs, reward, terminated, truncated, info = env.step(str(guess))
        assert info["guesses"] == turn
        assert info["secret"] == secret
        if guess == secret:
            assert (obs, reward, terminated, truncated) == ("correct!", 1.0, True, False)
            break
        assert obs == ("higher." if guess < secret else "lower.")
        assert (reward, terminated, info["correct"]) == (0.0, False, False)
        lo, hi = (guess + 1, hi) if obs == "higher." else (lo, guess - 1)
    else:
        pytest.fail("binary search over 10 numbers must finish within 4 guesses")


def test_guess_invalid_actions() -> None:
    env = GuessTheNumberEnv(low=0, high=9, max_guesses=10, invalid_reward=-0.5)
    env.reset(seed=1)
    for action in ["no idea", "", "42", "-1", "ten"]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == "invalid. guess a number from 0 to 9."
        assert (reward, terminated, truncated, info["correct"]) == (-0.5, False, False, False)
    assert info["guesses"] == 5


def test_guess_parses_first_integer_and_negative_ranges() -> None:
    env = GuessTheNumberEnv(low=-5, high=5, max_guesses=3)
    obs, info = env.reset(seed=2)
    assert obs == "guess a number from -5 to 5."
    secret = info["secret"]
    wrong = -5 if secret != -5 else 5
    obs, *_ = env.step(f"first {wrong} then {secret}")
    assert obs == ("higher." if wrong < secret else "lower.")
    assert env.step(f"{secret}")[0] == "correct!"


def test_guess_truncates_after_max_guesses() -> None:
    env = GuessTheNumberEnv(max_guesses=3, wrong_reward=-0.01)
    _, info = env.reset(seed=5)
    wrong = str((info["secret"] + 1) % 10)
    assert env.step(wrong)[1:4] == (-0.01, False, False)
    assert env.step("invalid")[1:4] == (-0.1, False, False)
    obs, reward, terminated, truncated, info = env.step(wrong)
    assert obs in {"higher.", "lower."}
    assert (reward, terminated, truncated, info["guesses"]) == (-0.01, False, True, 3)
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        env.step(str(info["secret"]))
    env.reset(seed=5)  # a new episode starts fresh
    assert env.step(str(info["secret"]))[0] == "correct!"


def test_guess_truncation_on_an_invalid_last_guess_and_win_on_the_last() -> None:
    env = GuessTheNumberEnv(max_guesses=1)
    env.reset(seed=3)
    assert env.step("?")[3] is True
    _, info = env.reset(seed=3)
    assert env.step(str(info["secret"]))[2:4] == (True, False)


def test_guess_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        GuessTheNumberEnv().step("3")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"low": 5, "high": 5}, "`low`"),
        ({"low": 6, "high": 5}, "`low`"),
        ({"max_guesses": 0}, "`max_guesses`"),
    ],
)
def test_guess_rejects(kwargs: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        GuessTheNumberEnv(**kwargs)


def test_guess_observations_use_the_task_alphabet() -> None:
    env = GuessTheNumberEnv(low=-20, high=20, max_guesses=50)
    texts = [env.reset(seed=0)[0]]
    texts += [env.step(a)[0] for a in ["x", "-20", "20", "0", "99"]]
    assert set("".join(texts)) <= ALLOWED


# ------------------------------------------------------------------------- ToyArithmeticEnv


def test_toy_arithmetic_env() -> None:
    env = ToyArithmeticEnv()
    obs, info = env.reset(seed=4)
    m = re.fullmatch(r"what is (\d)\+(\d)\?", obs)
    assert m
    answer = str(int(m.group(1)) + int(m.group(2)))
    assert info["answer"] == answer
    assert env.reset(seed=4)[0] == obs
    assert set(obs) <= ALLOWED
    result = env.step(f"the answer is {answer}.")
    assert result[1:4] == (1.0, True, False)
    assert result[0] == "correct!"
    assert result[4] == {"answer": answer, "correct": True}
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        env.step(answer)


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        ("{a}", 1.0),
        (" {a} ", 1.0),
        ("<answer>{a}</answer>", 1.0),
        ("{a}.0", 1.0),
        ("{w}", 0.0),
        ("dunno", 0.0),
    ],
)
def test_toy_arithmetic_env_rewards(action: str, reward: float) -> None:
    env = ToyArithmeticEnv()
    _, info = env.reset(seed=9)
    answer = info["answer"]
    obs, r, terminated, truncated, info = env.step(action.format(a=answer, w=int(answer) + 1))
    assert (r, terminated, truncated, info["correct"]) == (reward, True, False, reward == 1.0)
    assert obs == ("correct!" if reward else "wrong.")


def test_toy_arithmetic_env_seeds_vary_and_step_needs_reset() -> None:
    env = ToyArithmeticEnv()
    questions = {env.reset(seed=s)[0] for s in range(50)}
    assert len(questions) > 10
    with pytest.raises(RuntimeError, match=r"reset\(\)"):
        ToyArithmeticEnv().step("3")
