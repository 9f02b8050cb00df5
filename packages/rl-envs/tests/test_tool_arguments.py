"""A tool call's arguments checked against the tool's JSON schema before the tool runs."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from rl_envs._tool_calls import argument_errors
from transformers.utils.chat_template_utils import get_json_schema


def tool(a: int, b: float, c: str, d: bool, e: list[int], g: dict,  # type: ignore[type-arg]
         h: int | None = None, i: Literal["x", "y"] = "x", j: int | str = 1, k: Any = None) -> None:  # fmt: skip
    """A tool with one parameter of each kind.

    Args:
        a: an integer
        b: a number
        c: a string
        d: a boolean
        e: integers
        g: an object
        h: an integer or null
        i: x or y
        j: an integer or a string
        k: anything
    """


PARAMETERS = get_json_schema(tool)["function"]["parameters"]
GOOD = {"a": 1, "b": 2, "c": "s", "d": False, "e": [1, 2], "g": {"k": 1}, "h": None, "i": "y",
        "j": "z", "k": object()}  # fmt: skip


def test_arguments_that_fit_pass() -> None:
    assert argument_errors(GOOD, PARAMETERS) == []
    assert argument_errors({**GOOD, "b": 2.5, "h": 3, "j": 4}, PARAMETERS) == []


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("a", 1.0, "`a` must be an integer, got 1.0 (float)"),
        ("a", True, "`a` must be an integer, got True (bool)"),
        ("b", "2", "`b` must be a number, got '2' (str)"),
        ("c", 3, "`c` must be a string, got 3 (int)"),
        ("d", 1, "`d` must be a boolean, got 1 (int)"),
        ("e", [1, "2"], "`e` must hold integers, got '2'"),
        ("e", {"a": 1}, "`e` must be an array, got {'a': 1} (dict)"),
        ("g", [], "`g` must be an object, got [] (list)"),
        ("h", "3", "`h` must be an integer, got '3' (str)"),
        ("i", "z", "`i` must be one of ['x', 'y'], got 'z'"),
        ("j", 1.5, "`j` must be an integer or a string, got 1.5 (float)"),
    ],
)
def test_each_wrong_argument_is_named(name: str, value: Any, error: str) -> None:
    assert argument_errors({**GOOD, name: value}, PARAMETERS) == [error]


def test_a_tool_without_a_schema_is_not_checked() -> None:
    assert argument_errors({"a": object()}, {}) == []
