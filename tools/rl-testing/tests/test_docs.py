"""The Markdown example runner: block parsing, the gpu-only marker and its checks."""

from pathlib import Path

import pytest
from rl_testing.docs import marker_problems, python_blocks, run_python_blocks

PAGE = """# A page

```python
x = 1
```

Some text.

<!-- docs: gpu-only: needs a CUDA GPU -->
```python
raise RuntimeError("must not run")
```

```bash
echo not python
```

1. In a list:

    ```python
    y = x + 1
    ```

```text
<!-- docs: this is an example inside a code block, not a marker -->
```
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_blocks_in_order_with_lines_languages_and_skips(tmp_path: Path) -> None:
    blocks = python_blocks(write(tmp_path, PAGE))
    assert [b.code for b in blocks] == [
        "x = 1\n",
        'raise RuntimeError("must not run")\n',
        "y = x + 1\n",
    ]
    assert [b.line for b in blocks] == [4, 11, 21]
    assert [b.skip_reason for b in blocks] == [None, "needs a CUDA GPU", None]


def test_runs_unmarked_blocks_in_one_namespace(tmp_path: Path) -> None:
    path = write(tmp_path, PAGE)
    assert marker_problems(path) == []
    assert run_python_blocks(path)["y"] == 2


def test_tracebacks_point_at_the_markdown_line(tmp_path: Path) -> None:
    path = write(tmp_path, "text\n\n```python\na = 1\nb = undefined_name\n```\n")
    with pytest.raises(NameError) as info:
        run_python_blocks(path)
    frame = info.traceback[-1]
    assert Path(str(frame.path)) == path
    assert frame.lineno + 1 == 5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("<!-- docs: gpu-only -->\n```python\npass\n```\n", "has no reason"),
        ("<!-- docs: gpu-only:   -->\n```python\npass\n```\n", "has no reason"),
        ("<!-- docs: skip: slow -->\n```python\npass\n```\n", "unknown docs marker"),
        ("<!-- docs: gpu-only: GPU -->\n```bash\nls\n```\n", "not followed by a ```python"),
        ("<!-- docs: gpu-only: GPU -->\n\ntext\n\n```python\npass\n```\n", "not followed"),
        ("see <!-- docs: gpu-only: GPU -->\n```python\npass\n```\n", "alone on its line"),
    ],
)
def test_malformed_markers_are_reported(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    problems = marker_problems(path)
    assert any(problem in p for p in problems), problems
    with pytest.raises(AssertionError, match=r"page\.md:1"):
        run_python_blocks(path)


def test_a_page_without_examples(tmp_path: Path) -> None:
    path = write(tmp_path, "# Only prose\n")
    with pytest.raises(AssertionError, match="no python example"):
        run_python_blocks(path)
    assert run_python_blocks(path, require_blocks=False)["__name__"] == "__readme__"
