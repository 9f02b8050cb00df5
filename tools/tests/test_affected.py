"""tools/affected.py on scratch git repositories: real commits, real `git diff`, no mocks.

Each scratch repository holds this workspace's real pyproject files (so the dependency graph
is the real one), a copy of tools/affected.py, and a few source files; a test commits a change
and runs the script on the range, as CI does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import affected
import pytest
import release

ROOT = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c",
       "commit.gpgsign=false", "-c", "init.defaultBranch=main"]  # fmt: skip
ALL = sorted([*release.packages(), "rl-testing"])


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        [*GIT, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch copy of the workspace's skeleton, committed once (copied per test)."""
    repo = tmp_path_factory.mktemp("template") / "repo"
    files = ["pyproject.toml", "noxfile.py", "README.md", "docs/index.md", "mkdocs.yml",
             "tools/affected.py", "tools/rl-testing/pyproject.toml"]  # fmt: skip
    for member in release.packages():
        files += [f"packages/{member}/pyproject.toml", f"packages/{member}/README.md"]
    for file in files:
        (repo / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / file, repo / file)
    (repo / "uv.lock").write_text("version = 1\n")  # its content does not matter here
    for member in release.packages():
        module = member.replace("-", "_")
        src = repo / "packages" / member / "src" / module / "__init__.py"
        src.parent.mkdir(parents=True)
        src.write_text('"""A member."""\n')
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


@pytest.fixture
def repo(template: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "repo"
    shutil.copytree(template, dest)
    return dest


def change(repo: Path, *paths: str) -> str:
    """Commit a change to each path (created if missing); return the range `HEAD~1..HEAD`."""
    for path in paths:
        file = repo / path
        file.parent.mkdir(parents=True, exist_ok=True)
        with file.open("a", encoding="utf-8") as f:
            f.write("\n# changed\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "change")
    return "HEAD~1..HEAD"


def run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The copied script, run in the scratch repository as CI runs it."""
    return subprocess.run(
        [sys.executable, "tools/affected.py", *args],
        cwd=repo, capture_output=True, text=True, check=False,
    )  # fmt: skip


def selected(repo: Path, *args: str) -> list[str]:
    proc = run(repo, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_a_change_in_rl_losses_selects_it_and_its_dependents(repo: Path) -> None:
    rng = change(repo, "packages/rl-losses/src/rl_losses/__init__.py")
    assert selected(repo, rng) == ["rl-algos", "rl-kernels", "rl-losses", "rl-train"]


def test_the_plan_of_an_rl_losses_change(repo: Path) -> None:
    rng = change(repo, "packages/rl-losses/src/rl_losses/__init__.py")
    got = json.loads(run(repo, rng, "--format", "json").stdout)
    assert got["everything"] is False
    assert got["light"] == ["rl-kernels", "rl-losses"]
    assert got["heavy"] is True  # rl-algos and rl-train depend on rl-losses
    assert got["sessions"] == [
        "lint", "typecheck", "docs", "test-rl-algos", "test-rl-kernels", "test-rl-losses",
        "test-rl-train", "isolation", "compat-light", "gpu", "integration", "slow",
    ]  # fmt: skip
    assert "isolation -- rl-kernels rl-losses" in got["checks"]
    assert "compat-light" in got["checks"]  # the light packages at their floors


def test_a_readme_only_change_selects_that_package_alone(repo: Path) -> None:
    rng = change(repo, "packages/rl-losses/README.md")
    assert selected(repo, rng) == ["rl-losses"]
    sessions = selected(repo, rng, "--format", "sessions")
    assert sessions == ["lint", "typecheck", "docs", "test-rl-losses", "isolation", "compat-light"]
    assert "integration" not in sessions


def test_a_change_to_a_packages_tests_selects_that_package_alone(repo: Path) -> None:
    rng = change(repo, "packages/rl-adapters/tests/test_new.py")
    assert selected(repo, rng) == ["rl-adapters"]


def test_a_leaf_package_selects_itself(repo: Path) -> None:
    rng = change(repo, "packages/rl-train/src/rl_train/__init__.py")
    assert selected(repo, rng) == ["rl-train"]


def test_a_change_to_uv_lock_selects_everything(repo: Path) -> None:
    rng = change(repo, "uv.lock")
    assert selected(repo, rng) == ALL
    got = json.loads(run(repo, rng, "--format", "json").stdout)
    assert got["everything"] is True
    assert {
        "tools", "isolation", "compat-light", "gpu", "integration", "slow", "docs", "docs-browser",
    } <= set(got["sessions"])  # fmt: skip
    assert "isolation" in got["checks"]  # all three light packages: no arguments


@pytest.mark.parametrize("path", ["pyproject.toml", "noxfile.py", ".ci/run", "new-top-level.cfg"])
def test_workspace_level_and_unknown_files_select_everything(repo: Path, path: str) -> None:
    assert selected(repo, change(repo, path)) == ALL


def test_a_test_support_change_selects_every_package_that_tests_with_it(repo: Path) -> None:
    # rl-testing is in every package's `test` dependency group
    rng = change(repo, "tools/rl-testing/pyproject.toml")
    assert selected(repo, rng) == ALL


def test_a_docs_change_selects_no_package_but_the_docs_sessions(repo: Path) -> None:
    rng = change(repo, "docs/index.md")
    assert selected(repo, rng) == []
    assert selected(repo, rng, "--format", "sessions") == [
        "lint", "typecheck", "docs", "docs-browser", "integration",
    ]  # fmt: skip


def test_a_workflow_change_runs_the_tools_session(repo: Path) -> None:
    rng = change(repo, ".github/workflows/ci.yml")
    assert selected(repo, rng, "--format", "sessions") == ["lint", "typecheck", "tools"]


def test_a_range_of_several_commits_and_a_merge_base_range(repo: Path) -> None:
    git(repo, "checkout", "-qb", "feature")
    change(repo, "packages/rl-envs/src/rl_envs/__init__.py")
    change(repo, "packages/rl-rollout/README.md")
    git(repo, "checkout", "-q", "main")
    change(repo, "packages/rl-advantages/src/rl_advantages/__init__.py")  # main moved on
    git(repo, "checkout", "-q", "feature")
    # three dots: what the branch changed since it left main, not main's own change
    assert selected(repo, "main...feature") == ["rl-algos", "rl-envs", "rl-rollout", "rl-train"]


def test_files_mode_and_github_output(repo: Path) -> None:
    out = selected(repo, "--files", "packages/rl-kernels/src/rl_kernels/x.py", "--format",
                   "github")  # fmt: skip
    values = dict(line.split("=", 1) for line in out)
    assert json.loads(values["packages"]) == ["rl-algos", "rl-kernels", "rl-train"]
    assert json.loads(values["light"]) == ["rl-kernels"]
    assert json.loads(values["heavy"]) is True
    absolute = str(repo / "packages/rl-kernels/README.md")
    assert selected(repo, "--files", absolute) == ["rl-kernels"]


def test_all_selects_everything(repo: Path) -> None:
    assert selected(repo, "--all") == ALL


def test_no_change_selects_nothing(repo: Path) -> None:
    assert selected(repo, "HEAD..HEAD") == []
    assert selected(repo, "HEAD..HEAD", "--format", "sessions") == []


def test_a_bad_range_names_the_argument_and_the_fix(repo: Path) -> None:
    proc = run(repo, "no-such-branch...HEAD")
    assert proc.returncode == 2
    assert "no-such-branch...HEAD" in proc.stderr
    assert "origin/main...HEAD" in proc.stderr


def test_range_and_files_together_are_refused(repo: Path) -> None:
    proc = run(repo, "HEAD~1..HEAD", "--files", "README.md")
    assert proc.returncode == 2
    assert "--files" in proc.stderr
    assert "--files" in run(repo).stderr  # and neither


def test_a_path_outside_the_workspace_is_refused(repo: Path, tmp_path: Path) -> None:
    proc = run(repo, "--files", str(tmp_path / "elsewhere.py"))
    assert proc.returncode == 2
    assert "not inside the workspace" in proc.stderr


def test_the_graph_is_the_workspaces_own() -> None:
    graph = affected.members(ROOT)
    assert sorted(graph) == ALL
    for package in release.packages():
        # the run-time edges are release.py's (which bump and smoke rely on) ...
        users = {m for m in release.packages() if package in graph[m].deps}
        assert users == set(release.dependents(package)), package
        # ... and every package tests with rl-testing, so a change there selects them all
        assert "rl-testing" in graph[package].deps


def test_every_session_a_rule_names_has_a_place_in_the_order() -> None:
    named = {s for _, sessions in affected.PATH_RULES for s in sessions}
    assert named <= set(affected.SESSION_ORDER), named - set(affected.SESSION_ORDER)


def test_the_light_packages_are_the_noxfile_isolation_ones() -> None:
    text = (ROOT / "noxfile.py").read_text()
    assert "TORCH_ONLY = affected.LIGHT" in text
    for name in affected.LIGHT:
        deps = release.workspace_deps(name)
        assert set(deps) <= set(affected.LIGHT), (name, deps)


def test_the_nox_session_arguments(repo: Path) -> None:
    # what `nox -s affected -- ARGS` passes on: a range, --files PATH ..., or --all
    rng = change(repo, "packages/rl-envs/README.md")
    assert affected.paths_from_args([rng], repo) == ["packages/rl-envs/README.md"]
    assert affected.paths_from_args(["--files", "a", str(repo / "b")], repo) == ["a", "b"]
    assert affected.plan(affected.paths_from_args(["--all"], repo), repo).everything
    for bad in ([], ["a", "b"], ["--files"], ["--explain"]):
        with pytest.raises(affected.AffectedError, match=r"git range|--files"):
            affected.paths_from_args(bad, repo)
