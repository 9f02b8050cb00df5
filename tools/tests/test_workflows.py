"""The GitHub workflows: valid against the workflow schema, and saying what the docs promise.

The schema is the one check-jsonschema ships (``--builtin-schema vendor.github-workflows``), so
the check works offline. The release dry run (``slow``) runs release.yml's build job's ``run``
steps, in order, in a scratch copy of the workspace, for a tag of rl-losses' current version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import affected
import pytest
import release
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))


def load(name: str) -> dict:
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())


def schema_check(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema",
         "vendor.github-workflows", *map(str, files)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_workflows_exist() -> None:
    assert [f.name for f in FILES] == ["ci.yml", "compat.yml", "gpu.yml", "release.yml"]


def test_compat_runs_every_version_set_weekly_and_on_a_range_change() -> None:
    import compat

    wf = load("compat.yml")
    on = wf["on"]
    assert on["schedule"] and "workflow_dispatch" in on
    for event in ("push", "pull_request"):
        assert {"**/pyproject.toml", "uv.lock"} <= set(on[event]["paths"])
    job = wf["jobs"]["compat"]
    assert job["strategy"]["matrix"]["versions"] == list(compat.SETS)
    assert "nox -s \"compat(versions='$VERSIONS')\"" in _runs(job)


@pytest.mark.parametrize("workflow", FILES, ids=lambda f: f.name)
def test_workflow_matches_the_github_schema(workflow: Path) -> None:
    proc = schema_check(workflow)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_schema_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    # `on` is required; a job needs runs-on; steps is a list
    bad.write_text("name: bad\njobs:\n  build:\n    steps: run this\n")
    proc = schema_check(bad)
    assert proc.returncode == 1
    assert "bad.yml" in proc.stdout + proc.stderr


def _runs(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job["steps"])


def test_ci_tests_exactly_the_affected_packages() -> None:
    ci = load("ci.yml")
    assert "pull_request" in ci["on"]
    assert ci["on"]["push"]["branches"] == ["main"]
    jobs = ci["jobs"]
    plan = _runs(jobs["plan"])
    assert "origin/$BASE_REF...HEAD" in plan and "--all" in plan
    assert "tools/affected.py" in plan and "--format github" in plan
    assert jobs["test"]["strategy"]["matrix"]["package"] == (
        "${{ fromJSON(needs.plan.outputs.packages) }}"
    )
    assert 'nox -s "test-$PACKAGE"' in _runs(jobs["test"])
    assert jobs["checks"]["strategy"]["matrix"]["check"] == (
        "${{ fromJSON(needs.plan.outputs.checks) }}"
    )
    for name in ("test", "checks"):
        setup = next(s for s in jobs[name]["steps"] if "setup-uv" in s.get("uses", ""))
        assert setup["with"]["cache-dependency-glob"] == "uv.lock"  # uv cache keyed on the lock
        assert "ubuntu" in jobs[name]["runs-on"]  # CPU runners
    assert set(jobs["ci-ok"]["needs"]) == {"plan", "test", "checks"}


def test_every_session_ci_may_run_is_a_nox_session() -> None:
    noxfile = (ROOT / "noxfile.py").read_text()
    defined = set(re.findall(r"^def (\w+)\(session", noxfile, flags=re.MULTILINE))
    defined |= set(re.findall(r'name="([\w-]+)"', noxfile))
    for session in affected.SESSION_ORDER:
        if session != "test-*":
            assert session.replace("-", "_") in defined or session in defined, session
    assert 'name=f"test-{package}"' in noxfile


def test_release_builds_only_the_tagged_package_and_publishes_with_oidc() -> None:
    wf = load("release.yml")
    assert wf["on"] == {"push": {"tags": ["rl-*-v*"]}}
    assert wf["permissions"] == {}
    build, publish = wf["jobs"]["build"], wf["jobs"]["publish"]
    runs = _runs(build)
    assert 'release.py check-tag "$GITHUB_REF_NAME"' in runs
    assert 'release.py build "$PACKAGE"' in runs and 'release.py smoke "$PACKAGE"' in runs
    assert "--all-packages" not in runs and "nox" not in runs
    assert build["permissions"] == {"contents": "read"}
    assert publish["needs"] == "build"
    assert publish["permissions"] == {"id-token": "write"}
    assert "run" not in str(publish["steps"])  # publish only uploads what build made
    assert any("pypi-publish" in s.get("uses", "") for s in publish["steps"])


def test_gpu_runs_on_a_self_hosted_gpu_runner_by_hand_or_by_label() -> None:
    wf = load("gpu.yml")
    assert "workflow_dispatch" in wf["on"]
    assert wf["on"]["pull_request"]["types"] == ["labeled", "synchronize"]
    job = wf["jobs"]["gpu"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert "'gpu'" in job["if"]
    runs = _runs(job)
    for needle in ("test_vllm.py", "--extra vllm", "nox -s integration slow", "nox -t test",
                   "gpu_examples.py", "nox -s bench"):  # fmt: skip
        assert needle in runs, needle


@pytest.mark.slow
def test_release_dry_run_builds_and_smoke_tests_only_rl_losses(tmp_path: Path) -> None:
    """release.yml's build job, step by step, for rl-losses (its `uses` steps are GitHub's)."""
    skip = {".git", ".venv", ".nox", "dist", "site", ".pytest_cache", ".mypy_cache",
            ".ruff_cache", ".hypothesis", "__pycache__", "runs"}  # fmt: skip
    ws = tmp_path / "repo"
    shutil.copytree(ROOT, ws, ignore=lambda _d, names: [n for n in names if n in skip])
    tag = release.tag_name("rl-losses")
    outputs: dict[str, dict[str, str]] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    env["PATH"] = f"{Path(release.uv()).parent}{os.pathsep}{env['PATH']}"
    env["GITHUB_REF_NAME"] = tag
    assert load("release.yml")["env"]["UV_PYTHON"]  # CI's Python; here, this interpreter's
    env["UV_PYTHON"] = sys.executable
    ran = []
    for number, step in enumerate(load("release.yml")["jobs"]["build"]["steps"]):
        if "uses" in step:
            assert step["uses"].split("@")[0] in {
                "actions/checkout", "astral-sh/setup-uv", "actions/upload-artifact"
            }  # fmt: skip
            continue
        step_env = dict(env)
        for key, value in step.get("env", {}).items():
            match = re.fullmatch(r"\$\{\{ steps\.(\w+)\.outputs\.(\w+) \}\}", value)
            assert match, f"the dry run cannot evaluate {value!r}"
            step_env[key] = outputs[match[1]][match[2]]
        out_file = tmp_path / f"output-{number}"
        out_file.touch()
        step_env["GITHUB_OUTPUT"] = str(out_file)
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ws, env=step_env,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, f"{step['name']}:\n{proc.stdout}\n{proc.stderr}"
        ran.append(step["name"])
        if "id" in step:
            lines = out_file.read_text().splitlines()
            outputs[step["id"]] = dict(line.split("=", 1) for line in lines)
    assert outputs["tag"] == {"package": "rl-losses"}
    assert len(ran) == 4, ran
    assert [p.name for p in (ws / "dist").iterdir()] == ["rl-losses"]
    version = release.version_of("rl-losses")
    # (uv build also writes a .gitignore there; neither upload-artifact nor the publish take it)
    built = sorted(p.name for p in (ws / "dist" / "rl-losses").iterdir() if p.name[0] != ".")
    assert built == [
        f"rl_losses-{version}-py3-none-any.whl", f"rl_losses-{version}.tar.gz"
    ]  # fmt: skip
