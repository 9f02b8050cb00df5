"""rl_envs.rewards: extractors, exact number parsing/comparison, format, overlong and weighted."""

from __future__ import annotations

import functools
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rl_envs.rewards import (
    exact_match_reward,
    extract_boxed,
    extract_final_answer,
    extract_tagged,
    format_reward,
    numbers_equal,
    overlong_reward,
    parse_number,
    tagged_format_reward,
    weighted_reward,
)

# ----------------------------------------------------------------------------- extract_tagged


@pytest.mark.parametrize(
    ("text", "tag", "expected"),
    [
        ("<answer>42</answer>", "answer", "42"),
        ("<answer>  42 \n</answer>", "answer", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "answer", "2"),
        ("<answer>multi\nline</answer>", "answer", "multi\nline"),
        ("<think>hmm</think><answer>x</answer>", "think", "hmm"),
        ("<answer></answer>", "answer", ""),
        ("no tags here", "answer", None),
        ("<answer>unclosed", "answer", None),
        ("</answer>reversed<answer>", "answer", None),
        ("<Answer>case</Answer>", "answer", None),
    ],
)
def test_extract_tagged(text: str, tag: str, expected: str | None) -> None:
    assert extract_tagged(text, tag) == expected


@pytest.mark.parametrize("tag", ["", "a b", "1x", "<answer>", "an-swer"])
def test_extract_tagged_rejects_bad_tag(tag: str) -> None:
    with pytest.raises(ValueError, match="`tag`"):
        extract_tagged("<answer>1</answer>", tag)


# ------------------------------------------------------------------------------ extract_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{42}", "42"),
        (r"so \boxed{ 7 } done", "7"),
        (r"\boxed{1} and finally \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        (r"\boxed{3} then \boxed{unclosed", "3"),
        (r"\boxed{unclosed", None),
        ("no box", None),
        (r"\boxed{}", ""),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


# ----------------------------------------------------------------------- extract_final_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # 1. <answer> wins over everything else
        (r"<answer>5</answer> \boxed{6} #### 7 the answer is 8", "5"),
        ("<answer> cba. </answer>", "cba"),
        # 2. \boxed
        (r"\boxed{6} #### 7 the answer is 8", "6"),
        # 3. after the last ####, to the end of that line
        ("#### 1\nreasoning\n#### 1,234.\nmore text 99", "1,234"),
        ("####\n 12", "12"),
        # 4. answer is / answer:, case-insensitive, to the end of the line
        ("so the answer is 7.\nbye 3", "7"),
        ("The Answer Is: 1/2", "1/2"),
        ("ANSWER: cba", "cba"),
        ("answer: 1\nanswer: 2", "2"),
        # 5. the last number
        ("3 apples and 4 pears make 7", "7"),
        ("first 1,234 then 5,678.", "5,678"),
        ("the result was -2.5.", "-2.5"),
        ("ratio 3/4", "3/4"),
        ("x=-3", "-3"),
        ("5-3 is two", "3"),
        ("value 0.25", "0.25"),
        ("1,2,3", "3"),
        # an empty candidate falls through to the next rule
        ("<answer></answer> 12", "12"),
        ("the answer is.\n 9", "9"),
        # nothing at all
        ("no digits here", None),
        ("", None),
        ("...", None),
    ],
)
def test_extract_final_answer(text: str, expected: str | None) -> None:
    assert extract_final_answer(text) == expected


# ------------------------------------------------------------------------------- parse_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", Fraction(12)),
        ("-3", Fraction(-3)),
        ("+5", Fraction(5)),
        ("1,234", Fraction(1234)),
        ("1,234,567", Fraction(1234567)),
        ("0.25", Fraction(1, 4)),
        ("0.1", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("-0.5", Fraction(-1, 2)),
        ("3/4", Fraction(3, 4)),
        ("-3/4", Fraction(-3, 4)),
        ("2/4", Fraction(1, 2)),
        ("3 / 4", Fraction(3, 4)),
        ("0/5", Fraction(0)),
        (" 7 ", Fraction(7)),
        ("\t7\n", Fraction(7)),
        ("$12", Fraction(12)),
        ("-$5", Fraction(-5)),
        ("$-5", Fraction(-5)),
        ("12.", Fraction(12)),
        ("1,234.5.", Fraction(2469, 2)),
        ("007", Fraction(7)),
    ],
)
def test_parse_number(text: str, expected: Fraction) -> None:
    value = parse_number(text)
    assert value == expected
    assert isinstance(value, Fraction)


def test_parse_number_is_exact_not_float() -> None:
    assert parse_number("0.1") == Fraction(1, 10)
    assert parse_number("0.1") != Fraction(0.1)


@pytest.mark.parametrize(
    "text",
    [
        "1e3",
        "1E3",
        "2.5e-1",
        "1/0",
        "abc",
        "",
        " ",
        "-",
        "+",
        "$",
        ".",
        "1,23",
        "12,34,567",
        "1.2.3",
        "3/-4",
        "+-5",
        "--5",
        "inf",
        "nan",
        "12%",
        "1 2",
        "0x10",
        "٣",  # a non-ASCII digit
    ],
)
def test_parse_number_rejects(text: str) -> None:
    assert parse_number(text) is None


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_parse_number_round_trips_ints(k: int) -> None:
    assert parse_number(str(k)) == k


@given(st.integers(min_value=-(10**12), max_value=10**12), st.integers(1, 10**12))
def test_parse_number_fractions(p: int, q: int) -> None:
    assert parse_number(f"{p}/{q}") == Fraction(p, q)


@given(st.integers(min_value=0, max_value=10**15))
def test_parse_number_thousands_commas(k: int) -> None:
    assert parse_number(f"{k:,}") == k


# ------------------------------------------------------------------------------ numbers_equal


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("0.5", "1/2", True),
        ("1/2", "2/4", True),
        ("0.5", "2/4", True),
        ("1,000", "1000", True),
        ("7", " 7.", True),
        ("-0", "0", True),
        ("$12", "12", True),
        ("abc", "ABC ", True),
        ("abc", "abd", False),
        ("0.5", "0.51", False),
        ("1e3", "1000", False),  # "1e3" does not parse: compared as strings
        ("1e3", "1E3", True),
        ("12", "twelve", False),
    ],
)
def test_numbers_equal(a: str, b: str, expected: bool) -> None:
    assert numbers_equal(a, b) is expected
    assert numbers_equal(b, a) is expected


# ------------------------------------------------------------------------- exact_match_reward


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("7", "7", 1.0),
        ("the answer is 0.5", "1/2", 1.0),
        ("<answer>1,000</answer>", "1000", 1.0),
        (r"\boxed{3/4}", "0.75", 1.0),
        ("3+4=7", "7", 1.0),
        ("8", "7", 0.0),
        ("cba", "cba", 1.0),  # nothing extractable: the whole completion is compared
        ("  CBA \n", "cba", 1.0),
        ("cab", "cba", 0.0),
        ("", "7", 0.0),
    ],
)
def test_exact_match_reward(completion: str, answer: str, expected: float) -> None:
    assert exact_match_reward(completion, answer) == expected
    assert exact_match_reward(completion, answer, "what?") == expected


# ------------------------------------------------------------------------------ format_reward


def test_format_reward() -> None:
    pattern = r"<think>.*</think><answer>.*</answer>"
    assert format_reward("<think>a\nb</think><answer>1</answer>", pattern) == 1.0
    assert format_reward("  <think>a</think><answer>1</answer>\n", pattern) == 1.0
    assert format_reward("<think>a</think><answer>1</answer> extra", pattern) == 0.0
    assert format_reward("<answer>1</answer>", pattern, reward=0.5) == 0.0
    assert format_reward("<think></think><answer></answer>", pattern, reward=0.5) == 0.5
    assert format_reward("123", r"\d+") == 1.0
    assert format_reward("12a", r"\d+") == 0.0


@pytest.mark.parametrize("pattern", ["(", "[a-", "*x", "a{2,1}"])
def test_format_reward_invalid_regex(pattern: str) -> None:
    with pytest.raises(ValueError, match="`pattern`"):
        format_reward("x", pattern)


# ----------------------------------------------------------------------- tagged_format_reward


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>a</think><answer>b</answer>", 1.0),
        ("pre <think>\na\n</think>\n mid <answer>b</answer> post", 1.0),
        ("<think></think><answer></answer>", 1.0),
        ("<answer>b</answer><think>a</think>", 0.0),  # wrong order
        ("<think>a</think>", 0.0),  # missing answer
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),  # twice
        ("<think>a</think><think>a</think><answer>b</answer>", 0.0),
        ("<think>a<answer>b</answer></think>", 0.0),  # nested
        ("<think>a<answer>b</think></answer>", 0.0),  # overlapping
        ("</think>a<think><answer>b</answer>", 0.0),  # closed before opened
        ("<think>a</think><answer>b", 0.0),  # unclosed
        ("", 0.0),
    ],
)
def test_tagged_format_reward(completion: str, expected: float) -> None:
    assert tagged_format_reward(completion) == expected


def test_tagged_format_reward_custom_tags_and_reward() -> None:
    assert tagged_format_reward("<answer>1</answer>", ("answer",), 0.25) == 0.25
    assert tagged_format_reward("<a>1</a><b>2</b><c>3</c>", tags=("a", "b", "c")) == 1.0
    assert tagged_format_reward("<a>1</a><c>3</c><b>2</b>", tags=("a", "b", "c")) == 0.0
    assert tagged_format_reward("<a>1</a><b>2</b>", tags=["b"], reward=2.0) == 2.0


@pytest.mark.parametrize(
    ("tags", "match"),
    [
        ("answer", "`tags`.*bind"),  # a string: probably called as reward_fn(c, answer, q)
        ((), "`tags`"),
        (("think", "think"), "`tags`.*repeat"),
        (("think", "an swer"), r"`tags\[1\]`"),
        (("",), r"`tags\[0\]`"),
    ],
)
def test_tagged_format_reward_bad_tags(tags: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tagged_format_reward("<think>a</think>", tags)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- overlong_reward


def _dapo(length: int, max_length: int, cache_length: int, penalty: float) -> float:
    """DAPO eq. 13, written out independently."""
    if length <= max_length - cache_length:
        return 0.0
    if length <= max_length:
        return ((max_length - cache_length) - length) / cache_length * penalty
    return -penalty


@pytest.mark.parametrize("penalty", [1.0, 0.5, 2.0])
def test_overlong_reward_boundaries(penalty: float) -> None:
    max_length, cache = 20, 4  # soft band (16, 20]
    cases = {
        0: 0.0,
        15: 0.0,
        16: 0.0,  # exactly max - cache
        17: -0.25 * penalty,
        18: -0.5 * penalty,  # the middle of the band
        19: -0.75 * penalty,
        20: -penalty,  # exactly max
        21: -penalty,  # max + 1
        1000: -penalty,
    }
    for length, expected in cases.items():
        got = overlong_reward(length, max_length, cache, penalty)
        assert got == pytest.approx(expected, abs=1e-12), length
        assert got == pytest.approx(_dapo(length, max_length, cache, penalty), abs=1e-12)


def test_overlong_reward_whole_length_is_the_band() -> None:
    assert overlong_reward(0, 4, 4) == 0.0
    assert overlong_reward(1, 4, 4) == -0.25
    assert overlong_reward(4, 4, 4) == -1.0
    assert overlong_reward(5, 4, 4) == -1.0
    assert overlong_reward(1, 1, 1) == -1.0
    assert overlong_reward(7, 10, 2, penalty=0.0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"length": 1, "max_length": 0, "cache_length": 1}, "max_length"),
        ({"length": 1, "max_length": -5, "cache_length": 1}, "max_length"),
        ({"length": 1, "max_length": 10, "cache_length": 0}, "cache_length"),
        ({"length": 1, "max_length": 10, "cache_length": -1}, "cache_length"),
        ({"length": 1, "max_length": 10, "cache_length": 11}, "cache_length"),
        ({"length": -1, "max_length": 10, "cache_length": 2}, "length"),
        ({"length": 1, "max_length": 10, "cache_length": 2, "penalty": -0.1}, "penalty"),
        ({"length": 1, "max_length": 10, "cache_length": 2, "penalty": float("nan")}, "penalty"),
    ],
)
def test_overlong_reward_bad_arguments(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}`"):
        overlong_reward(**kwargs)  # type: ignore[arg-type]


@st.composite
def _overlong_setups(draw: st.DrawFn) -> tuple[int, int, float]:
    max_length = draw(st.integers(1, 4096))
    cache = draw(st.integers(1, max_length))
    penalty = draw(st.floats(0.0, 10.0, allow_nan=False))
    return max_length, cache, penalty


@given(_overlong_setups(), st.integers(0, 5000), st.integers(0, 5000))
def test_overlong_reward_bounded_and_non_increasing(
    setup: tuple[int, int, float], a: int, b: int
) -> None:
    max_length, cache, penalty = setup
    short, long = sorted((a, b))
    r_short = overlong_reward(short, max_length, cache, penalty)
    r_long = overlong_reward(long, max_length, cache, penalty)
    for r in (r_short, r_long):
        assert -penalty <= r <= 0.0
    assert r_long <= r_short
    assert r_short == pytest.approx(_dapo(short, max_length, cache, penalty), abs=1e-12)


# ---------------------------------------------------------------------------- weighted_reward


def answer_tag(completion: str, answer: str, question: str) -> float:
    return tagged_format_reward(completion, ("answer",))


def test_weighted_reward_sums_and_names() -> None:
    combined = weighted_reward([exact_match_reward, answer_tag], [1.0, 0.5])
    assert combined.__name__ == "weighted(exact_match_reward*1.0+answer_tag*0.5)"
    assert combined("<answer>7</answer>", "7", "3+4=") == 1.5
    assert combined("<answer>8</answer>", "7", "3+4=") == 0.5
    assert combined("8", "7", "3+4=") == 0.0


def test_weighted_reward_default_weights_and_partial_name() -> None:
    def always(c: str, a: str, q: str) -> float:
        return 1.0

    bound = functools.partial(format_reward, pattern=r"\d+")
    combined = weighted_reward([always, always, lambda c, a, q: bound(c)])
    assert combined("x", "y", "z") == 2.0
    assert combined.__name__ == "weighted(always*1.0+always*1.0+<lambda>*1.0)"
    named = weighted_reward([functools.partial(exact_match_reward)], [-2])
    assert named.__name__ == "weighted(exact_match_reward*-2.0)"
    assert named("12", "12", "") == -2.0


@pytest.mark.parametrize(
    ("fns", "weights", "name"),
    [
        ([], None, "`fns`"),
        ([exact_match_reward], [1.0, 2.0], "`weights`"),
        ([exact_match_reward, exact_match_reward], [1.0], "`weights`"),
        ([exact_match_reward], [float("inf")], "`weights`"),
    ],
)
def test_weighted_reward_bad_arguments(
    fns: list[object], weights: list[float] | None, name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        weighted_reward(fns, weights)  # type: ignore[arg-type]
