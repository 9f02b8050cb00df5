"""tools/release.py check-tag: the gate release.yml passes before anything is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import release

ROOT = Path(__file__).resolve().parents[2]


def check_tag(tag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "tools/release.py", "check-tag", tag],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("package", release.packages())
def test_the_tag_of_the_current_version_names_the_package(package: str) -> None:
    proc = check_tag(release.tag_name(package))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{package}\n"


def test_a_full_ref_is_accepted() -> None:
    assert check_tag(f"refs/tags/{release.tag_name('rl-losses')}").stdout == "rl-losses\n"


def test_another_version_is_refused_with_the_fix() -> None:
    proc = check_tag("rl-losses-v99.0.0")
    assert proc.returncode == 1
    assert f"pyproject says {release.version_of('rl-losses')}" in proc.stderr
    assert "release.py bump rl-losses" in proc.stderr


def test_an_unknown_package_is_refused_with_the_known_ones() -> None:
    proc = check_tag("rl-nothing-v0.1.0")
    assert proc.returncode == 1
    assert "unknown package 'rl-nothing'" in proc.stderr and "rl-losses" in proc.stderr


@pytest.mark.parametrize("tag", ["v0.1.0", "rl-losses-0.1.0", "rl-losses", "rl-testing-v0.1.0"])
def test_a_malformed_or_unpublished_tag_is_refused(tag: str) -> None:
    proc = check_tag(tag)
    assert proc.returncode == 1
    assert f"check-tag '{tag}'" in proc.stderr
