"""Run the Python examples of a Markdown file, so documentation cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["run_python_blocks"]


def run_python_blocks(path: Path) -> dict[str, object]:
    """Execute every fenced ``python`` block of ``path`` in one shared namespace.

    Args:
        path: A Markdown file.

    Returns:
        The namespace after the last block, for assertions on its variables.

    Raises:
        AssertionError: If the file has no ``python`` block.
    """
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, f"{path} has no python example"
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for block in blocks:
        exec(compile(block, str(path), "exec"), namespace)
    return namespace
