"""Run the Python examples of a Markdown file, so documentation cannot rot.

Every fenced block whose info string starts with ``python`` is an example. Blocks run in
order, in one namespace per file, so later blocks use what earlier ones defined. Indented
blocks (inside a list item or an admonition) are dedented first.

A block that cannot run on a CPU-only machine (a real model on a GPU, vLLM) is marked by an
HTML comment on the line before its fence (blank lines in between are allowed), with a reason:

```text
<!-- docs: gpu-only: Qwen2.5-0.5B from the hub on a CUDA GPU -->
```

The comment is invisible on the rendered site. It is the only way to leave a ``python`` block
out; :func:`marker_problems` reports a marker without a reason, an unknown marker and a marker
that is not followed by a ``python`` block, and the docs tests fail on any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARKER",
    "Block",
    "marker_problems",
    "python_blocks",
    "run_python_blocks",
]

#: The one marker that keeps a ``python`` block from running: ``<!-- docs: gpu-only: REASON -->``.
MARKER = "gpu-only"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")
_COMMENT = re.compile(r"^[ \t]*<!--[ \t]*docs[ \t]*:(?P<body>.*?)-->[ \t]*$")
_ANY_DOCS_COMMENT = re.compile(r"<!--[ \t]*docs[ \t]*:")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    language: str
    """First word of the info string (``python``, ``bash``, ...); empty if none."""
    code: str
    """The block's text, dedented by the fence's indentation."""
    line: int
    """1-based line number of the block's first code line in the file."""
    skip_reason: str | None = None
    """The reason of a ``gpu-only`` marker in front of the block, or None (the block runs)."""


def _marker(line: str) -> tuple[str, str] | None:
    """``(kind, reason)`` of a ``<!-- docs: kind: reason -->`` line, or None."""
    match = _COMMENT.match(line)
    if match is None:
        return None
    kind, _, reason = match.group("body").strip().partition(":")
    return kind.strip(), reason.strip()


def _blocks(text: str) -> list[tuple[Block, int | None, range]]:
    """Every fenced block, the 0-based line of its marker (or None) and its lines' span."""
    lines = text.split("\n")
    out: list[tuple[Block, int | None, range]] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        language = (opening.group("info").split() or [""])[0].lstrip("{.").rstrip("}")
        marker_line = None
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and _marker(lines[j]) is not None:
            marker_line = j
        body: list[str] = []
        k = i + 1
        while k < len(lines):
            closing = _FENCE.match(lines[k])
            if (
                closing is not None
                and closing.group("fence")[0] == fence[0]
                and len(closing.group("fence")) >= len(fence)
                and not closing.group("info")
            ):
                break
            line = lines[k]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            k += 1
        reason = None
        if marker_line is not None:
            kind, why = _marker(lines[marker_line]) or ("", "")
            reason = why if kind == MARKER and why else None
        code = "\n".join(body) + "\n"
        out.append((Block(language, code, i + 2, reason), marker_line, range(i, k + 1)))
        i = k + 1
    return out


def python_blocks(path: Path) -> list[Block]:
    """The fenced ``python`` blocks of ``path``, in order, each with its skip reason."""
    return [b for b, _, _ in _blocks(path.read_text(encoding="utf-8")) if b.language == "python"]


def marker_problems(path: Path) -> list[str]:
    """What is wrong with the ``<!-- docs: ... -->`` markers of ``path`` (empty: nothing).

    A marker must read ``<!-- docs: gpu-only: REASON -->`` with a non-empty reason, sit on
    its own line, and be followed (blank lines allowed) by a ``python`` block. Text inside
    code blocks is not a marker.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    blocks = _blocks(text)
    attached = {m: b for b, m, _ in blocks if m is not None}
    inside = {n for _, _, span in blocks for n in span}
    problems: list[str] = []
    for n, line in enumerate(lines):
        if n in inside or not _ANY_DOCS_COMMENT.search(line):
            continue
        where = f"{path}:{n + 1}"
        parsed = _marker(line)
        if parsed is None:
            problems.append(f"{where}: a docs marker must be alone on its line: {line.strip()}")
            continue
        kind, reason = parsed
        if kind != MARKER:
            problems.append(f"{where}: unknown docs marker {kind!r} (only {MARKER!r} exists)")
        elif not reason:
            problems.append(
                f"{where}: the {MARKER} marker has no reason; write "
                f"<!-- docs: {MARKER}: why it cannot run on CPU -->"
            )
        block = attached.get(n)
        if block is None or block.language != "python":
            problems.append(f"{where}: the marker is not followed by a ```python block")
    return problems


def run_python_blocks(
    path: Path,
    namespace: dict[str, object] | None = None,
    *,
    require_blocks: bool = True,
) -> dict[str, object]:
    """Execute every runnable ``python`` block of ``path`` in one shared namespace.

    Blocks marked ``<!-- docs: gpu-only: ... -->`` are skipped. Tracebacks point at the
    Markdown file and its line numbers.

    Args:
        path: A Markdown file.
        namespace: The globals to run in (default: a fresh one).
        require_blocks: Fail if the file has no runnable ``python`` block.

    Returns:
        The namespace after the last block, for assertions on its variables.

    Raises:
        AssertionError: If ``require_blocks`` and the file has no runnable ``python`` block,
            or if a marker is malformed.
    """
    problems = marker_problems(path)
    assert not problems, "\n".join(problems)
    blocks = [b for b in python_blocks(path) if b.skip_reason is None]
    assert blocks or not require_blocks, f"{path} has no python example"
    ns: dict[str, object] = {"__name__": "__readme__"} if namespace is None else namespace
    for block in blocks:
        source = "\n" * (block.line - 1) + block.code  # line numbers of the Markdown file
        exec(compile(source, str(path), "exec"), ns)
    return ns
