r"""Griffe extension: reST math in docstrings becomes math the site renders.

The packages' docstrings write math the reST way (``.. math::`` blocks, ``:math:`x``` roles);
the Google-style docstrings are rendered as Markdown, where those would show as plain text. This
extension rewrites them, when griffe loads a docstring, into ``pymdownx.arithmatex``'s
delimiters: ``\[ ... \]`` for a block (on its own lines) and ``\( ... \)`` inline. It is
named in ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":math:`([^`]+)`")
_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def rest_math_to_arithmatex(text: str) -> str:
    r"""Rewrite ``.. math::`` blocks and ``:math:`...``` roles of a docstring.

    A block is the directive line's own text plus every following line indented deeper than
    the directive (blank lines inside included); it becomes ``\[``, the formula, ``\]`` at
    the directive's indentation, set off by blank lines.
    """
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        if match is None:
            out.append(_ROLE.sub(lambda m: f"\\({m.group(1)}\\)", lines[i]))
            i += 1
            continue
        indent = match.group("indent")
        body = [match.group("first").strip()] if match.group("first").strip() else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(indent)):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        if out and out[-1].strip():
            out.append("")
        out.extend([f"{indent}\\[", *(f"{indent}{b}" for b in body if b), f"{indent}\\]"])
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


class RestMath(griffe.Extension):
    """Rewrite reST math of every loaded docstring (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place."""
        if obj.docstring is not None:
            obj.docstring.value = rest_math_to_arithmatex(obj.docstring.value)
