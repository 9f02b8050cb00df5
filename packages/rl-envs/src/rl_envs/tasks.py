"""Built-in tasks, generated locally: tiny single-turn datasets and two toy text environments.

The single-turn tasks return a :class:`datasets.Dataset` with exactly two string columns,
``question`` and ``answer``. They are small enough for a ~150k-parameter character-level model
to learn from scratch on CPU: questions and answers are a few characters long and use only
:data:`TASK_ALPHABET` (digits, lowercase letters, space, newline and ``+-*/=?.,:()!'``).
Each is deterministic for a given ``seed`` (a private :class:`random.Random`; the global RNG is
never used) and has the signature ``task(n, *, seed=0, **options) -> Dataset``.

The environments follow the text-environment protocol ``reset(seed) -> (observation, info)``
and ``step(action) -> (observation, reward, terminated, truncated, info)``.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset

from rl_envs.rewards import extract_final_answer, numbers_equal

__all__ = [
    "TASKS",
    "TASK_ALPHABET",
    "GuessTheNumberEnv",
    "ToyArithmeticEnv",
    "available_tasks",
    "get_task",
    "reverse_string",
    "small_arithmetic",
    "sort_string",
    "successor_digit",
    "train_test_split_task",
]

TASK_ALPHABET: str = string.digits + string.ascii_lowercase + " \n" + "+-*/=?.,:()!'"
"""Every character a built-in task or environment may emit (questions, answers, observations)."""

_SYMBOLS = frozenset(TASK_ALPHABET) - frozenset(" \n")
_INTEGER = re.compile(r"(?:(?<![0-9])[-+])?[0-9]+")


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1 (a number of examples), got {value!r}")
    return value


def _check_alphabet(alphabet: object) -> str:
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"`alphabet` must be a non-empty string, got {alphabet!r}")
    bad = sorted(set(alphabet) - _SYMBOLS)
    if bad:
        raise ValueError(
            f"`alphabet` may only use the non-whitespace characters of TASK_ALPHABET "
            f"({''.join(sorted(_SYMBOLS))!r}); these are not allowed: {bad!r}"
        )
    return alphabet


def _check_length(length: object) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"`length` must be an integer >= 1, got {length!r}")
    return length


def _dataset(questions: list[str], answers: list[str]) -> Dataset:
    from datasets import Dataset, Features, Value  # heavy (pyarrow, pandas): only when used

    features = Features({"question": Value("string"), "answer": Value("string")})
    return Dataset.from_dict({"question": questions, "answer": answers}, features=features)


def successor_digit(n: int, *, seed: int = 0) -> Dataset:
    """The next digit, wrapping around: question ``"7"``, answer ``"8"``; ``"9"`` gives ``"0"``.

    The easiest task: a tiny model learns it in about a hundred GRPO steps.

    Args:
        n: Number of examples (>= 1).
        seed: Seed of the private random generator.

    Returns:
        A dataset with string columns ``question`` and ``answer``.

    Raises:
        ValueError: If ``n`` < 1.
    """
    n = _check_count("n", n)
    rng = random.Random(seed)
    digits = [rng.randrange(10) for _ in range(n)]
    return _dataset([str(d) for d in digits], [str((d + 1) % 10) for d in digits])


def small_arithmetic(n: int, *, seed: int = 0, max_operand: int = 9, ops: str = "+-") -> Dataset:
    """One-operation arithmetic on small non-negative integers: question ``"3+4="``, answer ``"7"``.

    Operands are drawn uniformly from ``[0, max_operand]`` and the operator uniformly from
    ``ops``. For ``-`` the operands are ordered so the result is never negative (``"7-3="``).

    Args:
        n: Number of examples (>= 1).
        seed: Seed of the private random generator.
        max_operand: The largest operand (>= 1).
        ops: The operators to draw from: a non-empty string over ``"+-*"`` (a repeated
            operator is drawn more often).

    Returns:
        A dataset with string columns ``question`` and ``answer``.

    Raises:
        ValueError: If ``n`` < 1, ``max_operand`` < 1 or ``ops`` is empty or has another
            character.
    """
    n = _check_count("n", n)
    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"`max_operand` must be an integer >= 1, got {max_operand!r}")
    if not isinstance(ops, str) or not ops or set(ops) - set("+-*"):
        raise ValueError(f"`ops` must be a non-empty string over '+-*' (e.g. '+-'), got {ops!r}")
    rng = random.Random(seed)
    questions: list[str] = []
    answers: list[str] = []
    for _ in range(n):
        op = rng.choice(ops)
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if op == "-" and a < b:
            a, b = b, a
        result = a + b if op == "+" else a - b if op == "-" else a * b
        questions.append(f"{a}{op}{b}=")
        answers.append(str(result))
    return _dataset(questions, answers)


def _random_strings(n: int, seed: int, length: int, alphabet: str) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(length)) for _ in range(n)]


def reverse_string(n: int, *, seed: int = 0, length: int = 3, alphabet: str = "abc") -> Dataset:
    """Reverse a short string: question ``"abc"``, answer ``"cba"``.

    Args:
        n: Number of examples (>= 1).
        seed: Seed of the private random generator.
        length: Length of each string (>= 1).
        alphabet: Characters to draw from, uniformly per position (repeat one to draw it more
            often); only non-whitespace characters of :data:`TASK_ALPHABET`.

    Returns:
        A dataset with string columns ``question`` and ``answer``.

    Raises:
        ValueError: If ``n`` or ``length`` < 1 or ``alphabet`` is empty or has a character
            outside the allowed set.
    """
    n = _check_count("n", n)
    strings = _random_strings(n, seed, _check_length(length), _check_alphabet(alphabet))
    return _dataset(strings, [s[::-1] for s in strings])


def sort_string(n: int, *, seed: int = 0, length: int = 3, alphabet: str = "abcd") -> Dataset:
    """Sort the characters of a short string: question ``"dba"``, answer ``"abd"``.

    Characters are sorted by code point, as :func:`sorted` does (``"!"`` < ``"0"`` < ``"a"``).

    Args:
        n: Number of examples (>= 1).
        seed: Seed of the private random generator.
        length: Length of each string (>= 1).
        alphabet: Characters to draw from, uniformly per position (repeat one to draw it more
            often); only non-whitespace characters of :data:`TASK_ALPHABET`.

    Returns:
        A dataset with string columns ``question`` and ``answer``.

    Raises:
        ValueError: If ``n`` or ``length`` < 1 or ``alphabet`` is empty or has a character
            outside the allowed set.
    """
    n = _check_count("n", n)
    strings = _random_strings(n, seed, _check_length(length), _check_alphabet(alphabet))
    return _dataset(strings, ["".join(sorted(s)) for s in strings])


TASKS: dict[str, Callable[..., Dataset]] = {
    "successor_digit": successor_digit,
    "small_arithmetic": small_arithmetic,
    "reverse_string": reverse_string,
    "sort_string": sort_string,
}
"""The built-in single-turn tasks by name: ``TASKS[name](n, seed=..., **options)``."""


def available_tasks() -> list[str]:
    """Return the names of the built-in single-turn tasks, sorted."""
    return sorted(TASKS)


def get_task(name: str) -> Callable[..., Dataset]:
    """Return the built-in task called ``name``.

    Args:
        name: One of :func:`available_tasks`.

    Returns:
        The task function, ``task(n, *, seed=0, **options) -> Dataset``.

    Raises:
        ValueError: If there is no task of that name (the message lists the available ones).
    """
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"`name` must be one of the built-in tasks {available_tasks()}, got {name!r}"
        ) from None


def _derive_seed(seed: int, purpose: str) -> int:
    digest = hashlib.sha256(f"rl_envs.tasks:{purpose}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def train_test_split_task(
    name: str, n_train: int, n_test: int, *, seed: int = 0, **options: Any
) -> tuple[Dataset, Dataset]:
    """Build a train set and a test set of the built-in task ``name``.

    The train set is drawn with ``seed``; the test set with a different seed derived from it
    (a hash, so it never equals the train seed of another ``seed``). The two are drawn
    independently, so when the task's question space is small (``successor_digit`` has 10
    questions, ``reverse_string`` with defaults 27) they overlap: the test set then measures
    accuracy on the task's distribution, not generalisation to unseen questions.

    Args:
        name: One of :func:`available_tasks`.
        n_train: Number of training examples (>= 1).
        n_test: Number of test examples (>= 1).
        seed: Seed of the split.
        **options: Task options, e.g. ``max_operand=20`` for ``small_arithmetic``.

    Returns:
        ``(train, test)`` datasets with string columns ``question`` and ``answer``.

    Raises:
        ValueError: If ``name`` is unknown (the message lists the available tasks), a count is
            < 1 or an option is invalid.
    """
    task = get_task(name)
    n_train = _check_count("n_train", n_train)
    n_test = _check_count("n_test", n_test)
    train = task(n_train, seed=seed, **options)
    test = task(n_test, seed=_derive_seed(seed, "test"), **options)
    return train, test


class GuessTheNumberEnv:
    """Guess a secret integer in ``[low, high]`` from "higher."/"lower." hints.

    ``reset`` draws the secret and returns ``"guess a number from 0 to 9."``. Each ``step``
    reads the first integer in the action (``"i guess 5"`` is 5) and answers:

    * the secret: ``"correct!"``, ``correct_reward``, terminated;
    * another number in range: ``"higher."`` or ``"lower."``, ``wrong_reward``;
    * no integer, or one out of range: ``"invalid. guess a number from 0 to 9."``,
      ``invalid_reward``.

    Every step, invalid ones included, uses one of the ``max_guesses`` guesses; an episode not
    won by the last guess ends truncated. ``info`` holds ``"secret"``, ``"guesses"`` (used so
    far) and ``"correct"`` (whether this step's guess was right).

    Args:
        low: The smallest possible secret.
        high: The largest possible secret (> ``low``).
        max_guesses: Guesses per episode (>= 1).
        correct_reward: Reward for guessing the secret.
        wrong_reward: Reward for a valid wrong guess.
        invalid_reward: Reward for an action without a valid guess.
    """

    def __init__(
        self,
        low: int = 0,
        high: int = 9,
        max_guesses: int = 4,
        *,
        correct_reward: float = 1.0,
        wrong_reward: float = 0.0,
        invalid_reward: float = -0.1,
    ) -> None:
        if not low < high:
            raise ValueError(f"`low` must be < `high`, got low={low!r} and high={high!r}")
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"`max_guesses` must be an integer >= 1, got {max_guesses!r}")
        self.low = low
        self.high = high
        self.max_guesses = max_guesses
        self.correct_reward = correct_reward
        self.wrong_reward = wrong_reward
        self.invalid_reward = invalid_reward
        self._secret: int | None = None
        self._guesses = 0
        self._done = True

    @property
    def prompt(self) -> str:
        """The instruction shown at reset: ``"guess a number from {low} to {high}."``."""
        return f"guess a number from {self.low} to {self.high}."

    @property
    def done(self) -> bool:
        """Whether the episode has ended (or not started): ``step`` needs a ``reset`` first."""
        return self._done

    def _info(self, correct: bool) -> dict[str, Any]:
        return {"secret": self._secret, "guesses": self._guesses, "correct": correct}

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        Args:
            seed: Seed for drawing the secret; None draws it nondeterministically.

        Returns:
            ``(observation, info)``: the prompt and the info dict.
        """
        rng = random.Random(seed) if seed is not None else random.Random()
        self._secret = rng.randint(self.low, self.high)
        self._guesses = 0
        self._done = False
        return self.prompt, self._info(False)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Take one guess.

        Args:
            action: The policy's text; its first integer is the guess.

        Returns:
            ``(observation, reward, terminated, truncated, info)``.

        Raises:
            RuntimeError: If the episode has ended or was never started; call ``reset()``.
        """
        if self._done or self._secret is None:
            raise RuntimeError(
                "GuessTheNumberEnv.step() called with no episode in progress (it ended or was "
                "never started); call reset() first"
            )
        self._guesses += 1
        match = _INTEGER.search(action)
        guess = int(match.group()) if match else None
        if guess == self._secret:
            self._done = True
            return "correct!", self.correct_reward, True, False, self._info(True)
        truncated = self._guesses >= self.max_guesses
        self._done = truncated
        if guess is None or not self.low <= guess <= self.high:
            observation, reward = f"invalid. {self.prompt}", self.invalid_reward
        else:
            observation = "higher." if guess < self._secret else "lower."
            reward = self.wrong_reward
        return observation, reward, False, truncated, self._info(False)


class ToyArithmeticEnv:
    """A one-turn environment: ``"what is 3+4?"``, rewarded 1.0 for the right sum.

    ``reset(seed)`` draws two digits ``a`` and ``b``. The single ``step`` scores the action
    with ``numbers_equal(extract_final_answer(action) or action, str(a + b))`` and ends the
    episode (terminated). The final observation is ``"correct!"`` or ``"wrong."``; ``info``
    holds ``"answer"`` (the sum as a string) and ``"correct"``.
    """

    def __init__(self) -> None:
        self._question: str | None = None
        self._answer: str | None = None
        self._done = True

    @property
    def done(self) -> bool:
        """Whether the episode has ended (or not started): ``step`` needs a ``reset`` first."""
        return self._done

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        Args:
            seed: Seed for drawing the two digits; None draws them nondeterministically.

        Returns:
            ``(observation, info)``: the question and ``{"answer": ..., "correct": False}``.
        """
        rng = random.Random(seed) if seed is not None else random.Random()
        a, b = rng.randrange(10), rng.randrange(10)
        self._question = f"what is {a}+{b}?"
        self._answer = str(a + b)
        self._done = False
        return self._question, {"answer": self._answer, "correct": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Answer the question; the episode ends after this one step.

        Args:
            action: The policy's answer text.

        Returns:
            ``(observation, reward, terminated, truncated, info)`` with reward 1.0 or 0.0 and
            ``terminated`` True.

        Raises:
            RuntimeError: If the episode has ended or was never started; call ``reset()``.
        """
        if self._done or self._answer is None:
            raise RuntimeError(
                "ToyArithmeticEnv.step() called with no episode in progress (it ended or was "
                "never started); call reset() first"
            )
        self._done = True
        correct = numbers_equal(extract_final_answer(action) or action, self._answer)
        info = {"answer": self._answer, "correct": correct}
        return ("correct!" if correct else "wrong."), float(correct), True, False, info
