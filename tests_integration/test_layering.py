"""The dependency table of DEVELOPERS.md, enforced on the source.

Every import in a package's ``src/`` must be the standard library, the package itself, or a
distribution the package declares directly. So a lower package never imports a higher one, and
``pip install rl-losses`` cannot need anything it does not pull in.
"""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())

# The table in DEVELOPERS.md ("may depend on"), the rl-* part of it.
ALLOWED_SIBLINGS = {
    "rl-advantages": set(),
    "rl-losses": set(),
    "rl-kernels": {"rl-losses"},
    "rl-adapters": {"rl-kernels", "rl-losses"},
    "rl-rollout": set(),
    "rl-envs": set(),
    "rl-algos": {
        "rl-advantages", "rl-losses", "rl-kernels", "rl-adapters", "rl-rollout", "rl-envs",
    },
    # rl-algos brings the whole stack; the loops and the demo drive rl-envs' environments directly
    "rl-train": {"rl-algos", "rl-envs"},
}  # fmt: skip
TORCH_ONLY = {"rl-advantages", "rl-losses", "rl-kernels"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_norm(re.split(r"[\s<>=!~;\[(]", d, maxsplit=1)[0]) for d in requirements}


def declared(package: str, *, extras: bool = False) -> set[str]:
    """Distributions ``package`` depends on; with ``extras``, its optional ones too."""
    meta = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    names = _names(meta["project"]["dependencies"])
    if extras:
        for reqs in meta["project"].get("optional-dependencies", {}).values():
            names |= _names(reqs)
    return names


def imported_top_levels(src: Path, root: Path = ROOT) -> dict[str, list[str]]:
    """Top-level names imported anywhere under ``src`` (absolute imports), with where."""
    found: dict[str, list[str]] = {}
    for file in sorted(src.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                where = f"{file.relative_to(root)}:{node.lineno}"
                found.setdefault(name.split(".")[0], []).append(where)
    return found


def test_every_package_is_checked() -> None:
    assert set(PACKAGES) == set(ALLOWED_SIBLINGS)


@pytest.mark.parametrize("package", PACKAGES)
def test_declared_siblings_follow_the_table(package: str) -> None:
    siblings = {d for d in declared(package) if d.startswith("rl-")}
    assert siblings <= ALLOWED_SIBLINGS[package], (
        f"{package} declares {sorted(siblings - ALLOWED_SIBLINGS[package])}, not allowed by the table"
    )
    if package in TORCH_ONLY:
        third_party = {d for d in declared(package) if not d.startswith("rl-")}
        assert third_party == {"torch"}, f"{package} must depend on torch only, has {third_party}"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_are_declared(package: str) -> None:
    own = package.replace("-", "_")
    providers = importlib.metadata.packages_distributions()
    allowed = declared(package, extras=True)  # optional imports are lazy and guarded
    problems = []
    for top, where in imported_top_levels(ROOT / "packages" / package / "src").items():
        if top == own or top in sys.stdlib_module_names or top == "__future__":
            continue
        dists = {_norm(d) for d in providers.get(top, [])} or {_norm(top)}
        if not dists & allowed:
            problems.append(f"{top} (from {sorted(dists)}) at {', '.join(where)}")
    assert not problems, f"{package} imports undeclared distributions: " + "; ".join(problems)


def test_scanner_sees_imports(tmp_path: Path) -> None:
    """The scanner itself: absolute imports are found, relative ones ignored."""
    (tmp_path / "m.py").write_text(
        "import torch.nn as nn\nfrom transformers import AutoModel\nfrom . import sibling\n"
        "def f():\n    import peft\n"
    )
    assert set(imported_top_levels(tmp_path, tmp_path)) == {"torch", "transformers", "peft"}
