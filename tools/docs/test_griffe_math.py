"""reST math in docstrings becomes arithmatex math (tools/docs/griffe_math.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from griffe_math import rest_math_to_arithmatex

DOCSTRING = r"""Variance of the valid entries.

    .. math:: \bar x = \frac{\sum_i m_i x_i}{n},\quad
              \mathrm{Var} = \frac{\sum_i m_i (x_i - \bar x)^2}{n - 1}
    with :math:`n = \sum_i m_i` and :math:`m_i \in \{0, 1\}`.

    Args:
        x: Values, :math:`x_i`.
"""


def test_block_and_roles_become_arithmatex() -> None:
    out = rest_math_to_arithmatex(DOCSTRING)
    assert ".. math::" not in out
    assert ":math:" not in out
    assert (
        "\n\n    \\[\n"
        "    \\bar x = \\frac{\\sum_i m_i x_i}{n},\\quad\n"
        "    \\mathrm{Var} = \\frac{\\sum_i m_i (x_i - \\bar x)^2}{n - 1}\n"
        "    \\]\n\n"
        "    with \\(n = \\sum_i m_i\\) and \\(m_i \\in \\{0, 1\\}\\).\n"
    ) in out
    assert "x: Values, \\(x_i\\)." in out


def test_directive_alone_on_its_line() -> None:
    text = "Top.\n\n.. math::\n\n   a = b\n\nAfter."
    assert rest_math_to_arithmatex(text) == "Top.\n\n\\[\na = b\n\\]\n\nAfter."


def test_text_without_math_is_unchanged() -> None:
    text = "No math here.\n\n    code_like = 1\n"
    assert rest_math_to_arithmatex(text) == text
