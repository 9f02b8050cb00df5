"""The dependency table of docs/architecture.md (and the README), enforced on the source.

Every import in a package's ``src/`` must be the standard library, the package itself, or a
distribution the package declares directly. So a lower package never imports a higher one, and
``pip install rl-losses`` cannot need anything it does not pull in. Inside a package, the
imports between its own modules (function-local ones included) form no cycle.
"""

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())

# The table in docs/architecture.md ("may depend on"), the rl-* part of it.
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


# --------------------------------------------------------------------------- import cycles


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, function: str | None = None) -> Iterator[tuple[ast.stmt, str | None]]:
    """Every import statement under ``node`` with its enclosing function, if any; the body of
    ``if TYPE_CHECKING:`` (never executed) is skipped, its ``else:`` branch is not."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, function
        return
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        function = node.name if function is None else f"{function}.{node.name}"
    children: list[ast.AST] = list(ast.iter_child_nodes(node))
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        children = list(node.orelse)
    for child in children:
        yield from _imports(child, function)


def _module_name(src: Path, file: Path) -> str:
    parts = list(file.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def internal_import_graph(src: Path) -> dict[str, dict[str, list[str]]]:
    """``{module: {imported module: [where, ...]}}`` for the imports between the modules under
    ``src`` (a ``src/`` tree: its top-level packages), read from the AST.

    Module-level and function-local imports count alike (a function-local import delays a
    cycle, it does not remove it); ``if TYPE_CHECKING:`` blocks and ``from __future__`` do not.
    ``import pkg.mod`` and ``from pkg.mod import name`` point at ``pkg.mod``;
    ``from pkg import name`` at the submodule ``pkg.name`` if there is one, else at ``pkg``
    (its ``__init__``, which must then run first); relative imports are resolved the same way.
    """
    files = {_module_name(src, f): f for f in sorted(src.rglob("*.py"))}
    modules = set(files)

    def known(dotted: str) -> str | None:
        """The module ``dotted`` names, or its closest enclosing module of ours."""
        parts = dotted.split(".")
        while parts:
            if ".".join(parts) in modules:
                return ".".join(parts)
            parts.pop()
        return None

    graph: dict[str, dict[str, list[str]]] = {}
    for module, file in files.items():
        is_package = file.name == "__init__.py"
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        edges = graph.setdefault(module, {})
        for node, function in _imports(tree):
            where = f"{file.relative_to(src)}:{node.lineno}"
            where += f" (in {function})" if function else ""
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    # the package the import is relative to: this one, or a parent
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                elif node.module == "__future__":
                    continue
                else:
                    base = node.module or ""
                base_module = known(base)
                if base_module is None:
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if base_module == base and sub in modules else base_module)
            for target in targets:
                if target is not None and target != module:
                    wheres = edges.setdefault(target, [])
                    if where not in wheres:  # `from m import a, b` is one import of m
                        wheres.append(where)
    return graph


def import_cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Cycles of ``graph``: for every module on one, a shortest cycle through it (each cycle
    once, starting at its smallest module). Empty when the graph is acyclic."""
    cycles: dict[tuple[str, ...], list[str]] = {}
    for start in sorted(graph):
        # breadth-first from start's successors back to start: a shortest cycle through it
        parent: dict[str, str] = {}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if node == start and parent:
                break
            for nxt in sorted(graph.get(node, {})):
                if nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
        if start not in parent:
            continue
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(parent[path[-1]])
        path = path[::-1][:-1]  # start -> ... (without repeating start)
        i = path.index(min(path))
        canonical = tuple(path[i:] + path[:i])
        cycles.setdefault(canonical, list(canonical))
    return sorted(cycles.values())


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, list[str]]]) -> str:
    """``a -> b [a.py:3] -> a [b.py:9 (in f)]``: each arrow with where the import is written."""
    hops = [cycle[0]]
    for here, there in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        hops.append(f"{there} [{', '.join(graph[here][there])}]")
    return " -> ".join(hops)


def _src_root(package: str) -> Path:
    return ROOT / "packages" / package / "src"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package: str) -> None:
    graph = internal_import_graph(_src_root(package))
    assert graph, f"no modules found under {_src_root(package)}"
    cycles = [describe_cycle(c, graph) for c in import_cycles(graph)]
    assert not cycles, (
        f"{package} has {len(cycles)} import cycle(s) between its own modules (function-local "
        "imports included); break each by moving the shared code to a module both can import:\n  "
        + "\n  ".join(cycles)
    )


def test_cycle_scanner_on_a_made_up_package(tmp_path: Path) -> None:
    """The scanner itself: what counts as an edge, and which cycles it reports."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        # a package __init__ importing its submodules is normal
        "__init__.py": "from pkg.a import fa\nfrom pkg.b import fb\nfrom pkg import c\n",
        # a -> b only inside a function: still an edge; b -> a closes the cycle
        "a.py": "from __future__ import annotations\n\ndef fa():\n    from pkg.b import fb\n",
        "b.py": "import pkg.a\n\ndef fb():\n    pass\n",
        # importing the __init__ while the __init__ imports c: a cycle
        "c.py": "from pkg import fa\n",
        # TYPE_CHECKING imports never run; the else branch does
        "d.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import E\n"
            "else:\n    from . import sub\n"
        ),
        "e.py": "from pkg import d\nimport os\n",
        # relative imports: `from .. import d` is pkg.d, a submodule, not pkg/__init__
        "sub/__init__.py": "",
        "sub/x.py": "from .. import d\nfrom ..sub import y\nfrom . import y as why\n",
        "sub/y.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = internal_import_graph(tmp_path)
    assert graph == {
        "pkg": {
            "pkg.a": ["pkg/__init__.py:1"],
            "pkg.b": ["pkg/__init__.py:2"],
            "pkg.c": ["pkg/__init__.py:3"],
        },
        "pkg.a": {"pkg.b": ["pkg/a.py:4 (in fa)"]},
        "pkg.b": {"pkg.a": ["pkg/b.py:1"]},
        "pkg.c": {"pkg": ["pkg/c.py:1"]},
        "pkg.d": {"pkg.sub": ["pkg/d.py:5"]},
        "pkg.e": {"pkg.d": ["pkg/e.py:1"]},
        "pkg.sub": {},
        "pkg.sub.x": {
            "pkg.d": ["pkg/sub/x.py:1"],
            "pkg.sub.y": ["pkg/sub/x.py:2", "pkg/sub/x.py:3"],
        },
        "pkg.sub.y": {},
    }
    assert import_cycles(graph) == [["pkg", "pkg.c"], ["pkg.a", "pkg.b"]]
    assert describe_cycle(["pkg.a", "pkg.b"], graph) == (
        "pkg.a -> pkg.b [pkg/a.py:4 (in fa)] -> pkg.a [pkg/b.py:1]"
    )
    # without the function-local import there is no a <-> b cycle
    (pkg / "a.py").write_text("def fa():\n    pass\n")
    assert import_cycles(internal_import_graph(tmp_path)) == [["pkg", "pkg.c"]]
