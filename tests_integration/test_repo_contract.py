"""The repository's promises to users, checked on the files: README commands, CI, package layout."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())
MAIN_JOB = "uv run rl-train demo"
TEST_COMMAND = "uv run nox"


def _bash_blocks(markdown: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL)]


def test_readme_quick_start_gives_exactly_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert _bash_blocks(quick) == [MAIN_JOB, TEST_COMMAND]


def test_ci_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci/run").read_text().splitlines()
    commands = [ln.strip() for ln in script if ln.strip() and not ln.strip().startswith("#")]
    assert commands[-1] == TEST_COMMAND
    assert any("pip install" in c and "uv" in c for c in commands), ".ci/run must install uv"


def test_workspace_lists_every_member() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "project" not in root, "the workspace root is virtual and never built"
    sources = root["tool"]["uv"]["sources"]
    for name in [*PACKAGES, "rl-testing"]:
        assert sources[name] == {"workspace": True}, name
    assert set(PACKAGES) == {
        "rl-advantages", "rl-losses", "rl-kernels", "rl-adapters",
        "rl-rollout", "rl-envs", "rl-algos", "rl-train",
    }  # fmt: skip


@pytest.mark.parametrize("package", PACKAGES)
def test_package_layout(package: str) -> None:
    d = ROOT / "packages" / package
    module = package.replace("-", "_")
    meta = tomllib.loads((d / "pyproject.toml").read_text())
    project = meta["project"]
    assert "version" in project and "version" not in project.get("dynamic", [])
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", project["version"])
    assert project["requires-python"] == ">=3.11"
    assert meta["build-system"]["build-backend"] in {"uv_build", "hatchling.build"}
    assert "test" in meta["dependency-groups"]
    for dep in project["dependencies"]:
        if dep.startswith("rl-"):
            assert re.search(r">=[\d.]+,<\d+", dep), f"{package}: sibling {dep!r} needs a range"
    readme = (d / "README.md").read_text()
    assert f"pip install {package}" in readme
    assert f"import {module}" in readme or f"from {module} import" in readme
    assert "## [Unreleased]" in (d / "CHANGELOG.md").read_text()
    assert (d / "src" / module / "py.typed").is_file()
    init = (d / "src" / module / "__init__.py").read_text()
    assert "__all__" in init and "__version__" in init
    assert any((d / "tests").glob("test_*.py"))


MAX_SOURCE_LINES = 600


def python_sources() -> list[Path]:
    """The project's own Python source: every package's ``src/``, ``tools/`` and the noxfile."""
    files = {f for src in sorted(ROOT.glob("packages/*/src")) for f in src.rglob("*.py")}
    files |= set((ROOT / "tools").rglob("*.py"))
    files.add(ROOT / "noxfile.py")
    return sorted(f for f in files if not {".nox", ".venv", "__pycache__"} & set(f.parts))


def test_no_source_file_is_over_600_lines() -> None:
    sources = python_sources()
    assert ROOT / "noxfile.py" in sources
    assert any("rl_losses" in f.parts for f in sources) and any("tools" in f.parts for f in sources)
    too_long = {}
    for file in sources:
        with file.open(encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_SOURCE_LINES:
            too_long[file.relative_to(ROOT).as_posix()] = n
    assert not too_long, (
        f"{len(too_long)} Python source file(s) have more than {MAX_SOURCE_LINES} lines; split "
        "each into modules by topic:\n  "
        + "\n  ".join(f"{path}: {n} lines" for path, n in sorted(too_long.items()))
    )


def test_installs_compile_bytecode() -> None:
    """An imported module has its bytecode, so no start recompiles torch/transformers.

    With ``PYTHONDONTWRITEBYTECODE`` set (Docker images, CI) Python never writes ``.pyc`` files
    itself; ``compile-bytecode`` makes uv write them at install (docs/benchmarks.md, start-up).
    The nox sessions leave it to Python's first import, under ``.nox/pycache`` where that
    variable is set (noxfile.py, ``sync``): either way the module imported here has its ``.pyc``.
    """
    import importlib.util

    import transformers.modeling_utils

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["compile-bytecode"]
    source = transformers.modeling_utils.__file__
    assert Path(importlib.util.cache_from_source(source)).is_file(), f"no bytecode for {source}"


#: A comparison that demands bit-for-bit equality (docs/testing.md, "Tolerances").
EXACT = re.compile(r"torch\.equal\(|atol=0([^.0-9]|$)|atol=0\.0([^0-9]|$)|rtol=0([^.0-9]|$)")
#: Elapsed wall time compared against a number: a speed limit in a test.
TIMED = re.compile(r"(elapsed|monotonic\(\) - \w+|perf_counter\(\) - \w+)\s*<")


def _test_files() -> list[Path]:
    roots = [*(ROOT / "packages").glob("*/tests"), ROOT / "tests_integration"]
    roots.append(ROOT / "tools" / "rl-testing" / "tests")
    this = Path(__file__).resolve()  # its patterns are not comparisons
    return sorted(f for r in roots for f in r.rglob("*.py") if f.resolve() != this)


def test_every_bit_exact_comparison_says_why() -> None:
    """Bit-exact only where the same kernels run the same inputs, with a ``# bit-exact:`` reason
    on the line or within the two lines above; everything else uses rl_testing.tolerance."""
    missing = []
    for path in _test_files():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if EXACT.search(line) and "bit-exact" not in " ".join(lines[max(0, i - 2) : i + 1]):
                missing.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not missing, "bit-exact comparisons without a `# bit-exact:` reason:\n" + "\n".join(
        missing
    )


def test_no_test_asserts_a_wall_clock_limit() -> None:
    """Speed is a benchmark figure, never a test's verdict; hang guards wait, they do not assert."""
    timed = [
        f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}"
        for path in _test_files()
        for i, line in enumerate(path.read_text().splitlines())
        if "assert" in line and TIMED.search(line)
    ]
    assert not timed, "wall-clock limits asserted in tests:\n" + "\n".join(timed)
