"""The suite's sessions run ``pytest -n auto --dist loadgroup`` (noxfile.py): the tests of one
``xdist_group`` must run in one worker, in order. Those that share a launch or a copied
workspace (test_deepspeed.py, test_release.py) rely on it. pytest 9.2 stopped it silently
(pytest-xdist issue 1386: xdist names the group by rewriting the test's node id, which pytest 9.2
no longer reads), and nothing failed; this checks it on the locked pytest and pytest-xdist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRATCH = """
import json, os
from pathlib import Path

import pytest

OUT = Path(__file__).parent / "ran.jsonl"


def record(name):
    with OUT.open("a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")


@pytest.mark.xdist_group("first")
@pytest.mark.parametrize("i", range(4))
def test_first(i):
    record(f"first{i}")


@pytest.mark.xdist_group("second")
@pytest.mark.parametrize("i", range(4))
def test_second(i):
    record(f"second{i}")


@pytest.mark.parametrize("i", range(8))
def test_free(i):
    record(f"free{i}")
"""


def test_an_xdist_group_runs_in_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_scratch.py").write_text(SCRATCH)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "test_scratch.py", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "-q", "-o", "addopts="],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = [json.loads(line) for line in (tmp_path / "ran.jsonl").read_text().splitlines()]
    assert len(ran) == 16, ran
    workers = dict(ran)
    assert len(set(workers.values())) == 2, f"one worker ran everything: {ran}"
    for group in ("first", "second"):
        used = {workers[f"{group}{i}"] for i in range(4)}
        assert len(used) == 1, (
            f"the xdist_group {group!r} ran in workers {sorted(used)}, not one: with this "
            f"pytest and pytest-xdist, --dist loadgroup does not group (pytest-xdist issue 1386)"
        )
        order = [name for name, _ in ran if name.startswith(group)]
        assert order == [f"{group}{i}" for i in range(4)], order
