"""tools/release.py: one package's bump touches that package and the lock, nothing else."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import release

# the bump tests share one copied workspace, in order: one xdist worker runs the file
pytestmark = pytest.mark.xdist_group("release")

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", ".nox", "dist", "site", ".pytest_cache", ".mypy_cache", ".ruff_cache",
        ".hypothesis", "__pycache__"}  # fmt: skip
GIT = [
    "git",
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.invalid",
    "-c",
    "commit.gpgsign=false",
]


def _copy_workspace(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=lambda _d, names: [n for n in names if n in SKIP])
    subprocess.run([*GIT, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "snapshot"], cwd=dest, check=True)
    return dest


def _release(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(release.uv()).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("UV_PROJECT_ENVIRONMENT", None)  # set by nox; the copy must use its own
    return subprocess.run(
        [sys.executable, "tools/release.py", *args],
        cwd=ws, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def _changed(ws: Path) -> set[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ws, capture_output=True, text=True, check=True
    ).stdout
    return {line[3:] for line in out.splitlines()}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy_workspace(tmp_path_factory.mktemp("ws") / "repo")


def test_bump_touches_only_that_package_and_the_lock(workspace: Path) -> None:
    before = release.version_of("rl-losses")
    proc = _release(workspace, "bump", "rl-losses", "minor", "--note", "New objective.")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _changed(workspace) == {
        "packages/rl-losses/pyproject.toml",
        "packages/rl-losses/CHANGELOG.md",
        "uv.lock",
    }
    meta = tomllib.loads((workspace / "packages/rl-losses/pyproject.toml").read_text())
    major, minor, _ = (int(x) for x in before.split("."))
    new = f"{major}.{minor + 1}.0"
    assert meta["project"]["version"] == new
    changelog = (workspace / "packages/rl-losses/CHANGELOG.md").read_text()
    assert f"## [{new}] - " in changelog
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{new}]")
    assert "- New objective." in changelog
    lock = tomllib.loads((workspace / "uv.lock").read_text())
    versions = {p["name"]: p["version"] for p in lock["package"] if "version" in p}
    assert versions["rl-losses"] == new
    assert versions["rl-kernels"] == release.version_of("rl-kernels")
    subprocess.run([*GIT, "commit", "-qam", "bump"], cwd=workspace, check=True)
    tagged = _release(workspace, "check-tag", f"rl-losses-v{new}")
    assert tagged.returncode == 0, tagged.stderr
    wrong = _release(workspace, "check-tag", f"rl-losses-v{before}")
    assert wrong.returncode == 1
    assert "pyproject says" in wrong.stderr


def test_bump_outside_a_siblings_range_is_refused(workspace: Path) -> None:
    # rl-kernels accepts rl-losses <1: a major bump must stop before writing anything.
    proc = _release(workspace, "bump", "rl-losses", "major", "--note", "Break.")
    assert proc.returncode == 1
    assert "rl-kernels" in proc.stderr
    assert "Widen their ranges" in proc.stderr
    assert _changed(workspace) == set()


def test_bump_needs_changelog_entries(workspace: Path) -> None:
    changelog = workspace / "packages/rl-train/CHANGELOG.md"
    text = changelog.read_text()
    head, rest = text.split("## [Unreleased]", 1)
    changelog.write_text(head + "## [Unreleased]\n\n" + rest[rest.index("## [") :])
    subprocess.run(
        [*GIT, "commit", "-q", "--allow-empty", "-am", "empty"], cwd=workspace, check=True
    )
    proc = _release(workspace, "bump", "rl-train", "patch")
    assert proc.returncode == 1
    assert "Unreleased section of the changelog is empty" in proc.stderr
    assert _changed(workspace) == set()


def test_release_changelog_moves_entries() -> None:
    text = "# Changelog\n\n## [Unreleased]\n\n### Added\n- A.\n\n## [0.1.0]\n\n- Old.\n"
    out = release.release_changelog(text, "0.2.0", "2026-01-02", note=None)
    assert out == (
        "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-01-02\n\n### Added\n- A.\n\n"
        "## [0.1.0]\n\n- Old.\n"
    )
    noted = release.release_changelog(text, "0.2.0", "2026-01-02", note="B.")
    assert "### Added\n- A.\n\n- B.\n\n## [0.1.0]" in noted


def test_tag_names_and_parsing() -> None:
    assert release.tag_name("rl-losses", "0.2.0") == "rl-losses-v0.2.0"
    with pytest.raises(release.ReleaseError, match="not of the form"):
        release.check_tag("rl-losses==0.2.0")
    with pytest.raises(release.ReleaseError, match="unknown package"):
        release.check_tag("rl-nothing-v0.1.0")


def test_workspace_dependency_order() -> None:
    assert release.workspace_deps("rl-kernels") == ["rl-losses"]
    deps = release.workspace_deps("rl-train")
    assert deps[-1] == "rl-algos"
    assert deps.index("rl-losses") < deps.index("rl-kernels")
    assert set(release.dependents("rl-losses")) == {"rl-kernels", "rl-algos"}
