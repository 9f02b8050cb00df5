"""tools/docs/gpu_examples.py, which gpu.yml runs: it finds the gpu-only pages and runs them whole.

rl_testing.docs is standard library only, so it is imported from its source tree here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "rl-testing" / "src"))
sys.path.insert(0, str(ROOT / "tools" / "docs"))

import gpu_examples  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "tools" / "rl-testing" / "src")}


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "tools/docs/gpu_examples.py", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_list_names_every_page_with_a_gpu_only_block() -> None:
    proc = script("--list")
    assert proc.returncode == 0, proc.stderr
    pages = {line.split(":", 1)[0] for line in proc.stdout.splitlines()}
    marked = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if "<!-- docs: gpu-only:" in p.read_text(encoding="utf-8")
    }
    # writing-docs.md shows the marker inside a ````text block: an example, not a marker
    assert pages == marked - {"docs/writing-docs.md"}
    assert "docs/tutorials/vllm.md" in pages


def test_skip_leaves_a_page_out_and_an_unmarked_page_is_refused() -> None:
    proc = script("--list", "--skip", "docs/tutorials/vllm.md")
    assert "vllm.md" not in proc.stdout
    bad = script("docs/index.md")
    assert bad.returncode == 2
    assert "no gpu-only block in" in bad.stderr and "index.md" in bad.stderr


def test_a_page_runs_whole_gpu_only_blocks_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPU_EXAMPLE_RAN_IN", raising=False)
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 20\n```\n\n<!-- docs: gpu-only: pretend CUDA -->\n"
        "```python\nimport os\nfrom pathlib import Path\n"
        'Path("out.txt").write_text(str(x + 1))\n'
        'os.environ["GPU_EXAMPLE_RAN_IN"] = str(Path.cwd())\n```\n',
        encoding="utf-8",
    )
    gpu_examples.run_page(page)
    ran_in = Path(os.environ["GPU_EXAMPLE_RAN_IN"])  # the marked block ran, after the first
    assert ran_in != Path.cwd() and not ran_in.exists()  # in a temporary directory, now gone


def test_a_failing_block_fails_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- docs: gpu-only: x -->\n```python\nraise ValueError('boom')\n```\n")
    with pytest.raises(ValueError, match="boom"):
        gpu_examples.run_page(page)


def test_rewrite_cuts_steps_and_moves_the_device() -> None:
    code = 'run(max_steps=300, evaluation_interval=25)\nA(device="cuda")\nB(device_map="cuda")\n'
    out = gpu_examples.rewrite(code, 2, "cpu")
    assert out == 'run(max_steps=2, evaluation_interval=2)\nA(device="cpu")\nB(device_map="cpu")\n'
    assert gpu_examples.rewrite(code, None, None) == code
