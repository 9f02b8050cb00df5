"""Reward helpers: answer extraction, exact number comparison, format and length rewards.

Everything here is pure Python. A *reward function* has the signature
``reward_fn(completion, answer, question) -> float`` (:data:`RewardFn`);
:func:`exact_match_reward` is one, and :func:`weighted_reward` combines several.
:func:`format_reward` and :func:`tagged_format_reward` take extra arguments: bind them first,
e.g. ``lambda c, a, q: tagged_format_reward(c, ("think", "answer"))``.

Numbers are compared exactly as :class:`fractions.Fraction` (``"0.5" == "1/2" == "2/4"``), never
as floats, so ``"0.1"`` is exactly one tenth.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction

__all__ = [
    "RewardFn",
    "exact_match_reward",
    "extract_boxed",
    "extract_final_answer",
    "extract_tagged",
    "format_reward",
    "numbers_equal",
    "overlong_reward",
    "parse_number",
    "tagged_format_reward",
    "weighted_reward",
]

RewardFn = Callable[[str, str, str], float]
"""``reward_fn(completion, answer, question) -> float``."""

# An unsigned integer: plain digits, or digits grouped by thousands with commas ("1,234").
_INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)"
# A number as it may appear in free text: a fraction "3/4", a decimal "0.25" or an integer. A
# minus sign counts only when it does not follow a word character or ")" (so "5-3" is 5 and 3).
_NUMBER_IN_TEXT = re.compile(
    rf"(?:(?<![\w)])-)?(?:[0-9]+/[0-9]+(?![0-9])|{_INT}(?:\.[0-9]+)?)",
)
# A whole string that is one number (after the sign and "$" are removed).
_FRACTION_BODY = re.compile(rf"({_INT})\s*/\s*({_INT})")
_DECIMAL_BODY = re.compile(rf"({_INT})?(?:\.([0-9]+))?")
_ANSWER_IS = re.compile(r"\banswer(?:\s+is\b\s*:?|\s*:)[ \t]*([^\n]*)", re.IGNORECASE)
_TRAILING = re.compile(r"[\s.]+$")


def _check_tag(name: str, tag: object) -> str:
    if not isinstance(tag, str) or not tag.isidentifier():
        raise ValueError(
            f"`{name}` must be a non-empty identifier such as 'answer' (letters, digits, "
            f"underscores), got {tag!r}"
        )
    return tag


def extract_tagged(text: str, tag: str = "answer") -> str | None:
    """Return the content of the last ``<tag>...</tag>`` in ``text``, stripped.

    Args:
        text: The text to search.
        tag: The tag name, a non-empty identifier (``"answer"`` matches ``<answer>``).

    Returns:
        The whitespace-stripped content of the last complete pair, or None if there is none.

    Raises:
        ValueError: If ``tag`` is not a non-empty identifier.
    """
    tag = _check_tag("tag", tag)
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def extract_boxed(text: str) -> str | None:
    r"""Return the content of the last ``\boxed{...}`` in ``text``, stripped.

    Braces nested inside are balanced, so ``\boxed{\frac{1}{2}}`` gives ``\frac{1}{2}``. A
    ``\boxed{`` whose brace never closes is skipped in favour of an earlier complete one.

    Args:
        text: The text to search.

    Returns:
        The whitespace-stripped content, or None if no complete ``\boxed{...}`` is present.
    """
    marker = "\\boxed{"
    end = len(text)
    while (start := text.rfind(marker, 0, end)) != -1:
        depth = 1
        i = start + len(marker)
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len(marker) : i].strip()
            i += 1
        end = start
    return None


def _clean(candidate: str | None) -> str | None:
    if candidate is None:
        return None
    cleaned = _TRAILING.sub("", candidate).strip()
    return cleaned or None


def extract_final_answer(text: str) -> str | None:
    r"""Extract the final answer from a model completion.

    Rules, first match wins (an empty candidate falls through to the next rule):

    1. the content of the last ``<answer>...</answer>``;
    2. the content of the last ``\boxed{...}``;
    3. the first non-empty line after the last ``####`` (GSM8K style);
    4. the rest of the line after the last "answer is" or "answer:" (case-insensitive);
    5. the last number in the text: an integer, a decimal, a fraction like ``3/4``, possibly
       negative, possibly with thousands commas (``1,234``).

    Trailing periods and whitespace are stripped from the result.

    Args:
        text: The completion.

    Returns:
        The answer string, or None if no rule matches.
    """
    candidate = _clean(extract_tagged(text, "answer"))
    if candidate is None:
        candidate = _clean(extract_boxed(text))
    if candidate is None and "####" in text:
        candidate = _clean(text.rsplit("####", 1)[1].strip().split("\n", 1)[0])
    if candidate is None:
        said = list(_ANSWER_IS.finditer(text))
        candidate = _clean(said[-1].group(1)) if said else None
    if candidate is None:
        numbers = _NUMBER_IN_TEXT.findall(text)
        candidate = _clean(numbers[-1]) if numbers else None
    return candidate


def parse_number(text: str) -> Fraction | None:
    """Parse ``text`` as an exact rational number.

    Accepted: integers (``"12"``, ``"-3"``, ``"+5"``), thousands commas (``"1,234"``), decimals
    (``"0.25"``, ``".5"``), fractions (``"3/4"``), with surrounding whitespace, one leading
    ``"$"`` (before or after the sign) and trailing periods ignored. Rejected (None): scientific
    notation (``"1e3"``), ``inf``/``nan``, misplaced commas (``"1,23"``), a zero denominator
    (``"1/0"``) and anything else that is not a number.

    Args:
        text: The string to parse.

    Returns:
        The exact value (``"0.1"`` gives ``Fraction(1, 10)``, not the float's value), or None.
    """
    s = text.strip().rstrip(".").rstrip()
    negative = False
    if s.startswith("$"):
        s = s[1:]
    if s[:1] in ("+", "-"):
        negative = s[0] == "-"
        s = s[1:]
        if s.startswith("$"):
            s = s[1:]
    if not s:
        return None
    value: Fraction
    if fraction := _FRACTION_BODY.fullmatch(s):
        denominator = int(fraction.group(2).replace(",", ""))
        if denominator == 0:
            return None
        value = Fraction(int(fraction.group(1).replace(",", "")), denominator)
    elif (decimal := _DECIMAL_BODY.fullmatch(s)) and (decimal.group(1) or decimal.group(2)):
        whole = (decimal.group(1) or "0").replace(",", "")
        value = Fraction(f"{whole}.{decimal.group(2) or '0'}")
    else:
        return None
    return -value if negative else value


def numbers_equal(a: str, b: str) -> bool:
    """Whether two answer strings are equal, as numbers when both parse.

    When both parse with :func:`parse_number` they are compared exactly (``"0.5"``, ``"1/2"``
    and ``"2/4"`` are all equal; so are ``"1,000"`` and ``"1000"``). Otherwise the strings are
    compared after stripping whitespace and case folding (``"abc"`` equals ``"ABC "``).

    Args:
        a: One answer.
        b: The other answer.

    Returns:
        True if they are equal.
    """
    x, y = parse_number(a), parse_number(b)
    if x is not None and y is not None:
        return x == y
    return a.strip().casefold() == b.strip().casefold()


def exact_match_reward(completion: str, answer: str, question: str | None = None) -> float:
    """1.0 if the completion's final answer equals ``answer``, else 0.0.

    The final answer is :func:`extract_final_answer` of the completion, or the whole stripped
    completion when nothing can be extracted; it is compared with :func:`numbers_equal`.

    Args:
        completion: The model's completion.
        answer: The reference answer.
        question: Unused; present so this is a :data:`RewardFn`.

    Returns:
        1.0 or 0.0.
    """
    del question
    predicted = extract_final_answer(completion)
    if predicted is None:
        predicted = completion.strip()
    return 1.0 if numbers_equal(predicted, answer) else 0.0


def format_reward(completion: str, pattern: str, *, reward: float = 1.0) -> float:
    """``reward`` if the stripped completion fully matches the regular expression ``pattern``.

    The match is ``re.fullmatch(pattern, completion.strip(), re.DOTALL)``, so ``.`` also
    matches newlines.

    Args:
        completion: The model's completion.
        pattern: A Python regular expression that the whole completion must match.
        reward: The reward for a match.

    Returns:
        ``reward`` on a match, else 0.0.

    Raises:
        ValueError: If ``pattern`` is not a valid regular expression.
    """
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(
            f"`pattern` is not a valid regular expression ({exc}): {pattern!r}; fix the regex "
            "or escape literal characters with re.escape"
        ) from exc
    return reward if compiled.fullmatch(completion.strip()) else 0.0


def tagged_format_reward(
    completion: str, tags: Sequence[str] = ("think", "answer"), reward: float = 1.0
) -> float:
    """``reward`` if each tag appears exactly once as an open/close pair, in the given order.

    For the default tags the completion must contain exactly one ``<think>``, one ``</think>``,
    one ``<answer>`` and one ``</answer>``, ordered ``<think> ... </think> ... <answer> ...
    </answer>`` (pairs do not overlap or nest). Text before, between and after the pairs is
    allowed.

    Args:
        completion: The model's completion.
        tags: The tag names, in the required order: distinct non-empty identifiers.
        reward: The reward when the format is right.

    Returns:
        ``reward`` or 0.0.

    Raises:
        ValueError: If ``tags`` is a string, is empty, repeats a name or holds a name that is not
            an identifier. (A string here usually means the function was called as a
            ``RewardFn`` with the answer in place of ``tags``: bind ``tags`` first.)
    """
    if isinstance(tags, str):
        raise ValueError(
            f"`tags` must be a sequence of tag names such as ('think', 'answer'), got the string "
            f"{tags!r}; to use this as reward_fn(completion, answer, question), bind tags first, "
            "e.g. lambda c, a, q: tagged_format_reward(c)"
        )
    if len(tags) == 0:
        raise ValueError("`tags` must name at least one tag, got an empty sequence")
    for i, tag in enumerate(tags):
        _check_tag(f"tags[{i}]", tag)
    if len(set(tags)) != len(tags):
        raise ValueError(f"`tags` must not repeat a name, got {tuple(tags)!r}")
    position = 0
    for tag in tags:
        opening, closing = f"<{tag}>", f"</{tag}>"
        if completion.count(opening) != 1 or completion.count(closing) != 1:
            return 0.0
        start = completion.find(opening)
        end = completion.find(closing)
        if start < position or end < start + len(opening):
            return 0.0
        position = end + len(closing)
    return reward


def overlong_reward(length: int, max_length: int, cache_length: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13).

    With ``L = max_length - cache_length``: 0 when ``length <= L``; a linear ramp
    ``(L - length) / cache_length * penalty`` from 0 down to ``-penalty`` when
    ``L < length <= max_length``; ``-penalty`` when ``length > max_length``. The result is added
    to the task reward.

    Args:
        length: The completion's length in tokens (>= 0).
        max_length: The maximum completion length (>= 1).
        cache_length: The width of the soft-punishment band, in ``(0, max_length]``.
        penalty: The largest punishment (>= 0); DAPO uses 1.

    Returns:
        The reward, in ``[-penalty, 0]``.

    Raises:
        ValueError: If an argument is out of range (the message names it).
    """
    if max_length < 1:
        raise ValueError(f"`max_length` must be >= 1, got {max_length!r}")
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"`cache_length` must be in (0, max_length={max_length}], got {cache_length!r}"
        )
    if length < 0:
        raise ValueError(f"`length` must be >= 0, got {length!r}")
    if not penalty >= 0:  # also rejects NaN
        raise ValueError(f"`penalty` must be >= 0, got {penalty!r}")
    expected = max_length - cache_length
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / cache_length * penalty + 0.0
    return -penalty + 0.0


def _fn_name(fn: object) -> str:
    inner = getattr(fn, "func", None)  # functools.partial
    name = getattr(fn, "__name__", None) or getattr(inner, "__name__", None)
    return str(name) if name else type(fn).__name__


def weighted_reward(fns: Sequence[RewardFn], weights: Sequence[float] | None = None) -> RewardFn:
    """Combine reward functions into one: ``sum_i weights[i] * fns[i](completion, answer, q)``.

    The returned function's ``__name__`` reads like
    ``"weighted(exact_match_reward*1.0+format*0.5)"``.

    Args:
        fns: The reward functions, each ``fn(completion, answer, question) -> float``.
        weights: One finite weight per function; None gives 1.0 to each.

    Returns:
        The combined reward function.

    Raises:
        ValueError: If ``fns`` is empty, or ``weights`` has the wrong length or a non-finite
            value.
    """
    fns = tuple(fns)
    if not fns:
        raise ValueError("`fns` must hold at least one reward function, got none")
    ws = tuple(1.0 for _ in fns) if weights is None else tuple(float(w) for w in weights)
    if len(ws) != len(fns):
        raise ValueError(
            f"`weights` must have one entry per function: got {len(ws)} weights for "
            f"{len(fns)} functions"
        )
    if not all(math.isfinite(w) for w in ws):
        raise ValueError(f"`weights` must all be finite, got {ws!r}")

    def weighted(completion: str, answer: str, question: str) -> float:
        return float(
            sum(w * fn(completion, answer, question) for fn, w in zip(fns, ws, strict=True))
        )

    weighted.__name__ = weighted.__qualname__ = (
        "weighted(" + "+".join(f"{_fn_name(fn)}*{w!r}" for fn, w in zip(fns, ws, strict=True)) + ")"
    )
    return weighted
