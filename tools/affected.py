"""Which workspace packages, and which nox sessions, a change needs (stdlib only).

    python tools/affected.py origin/main...HEAD     # a git range (anything `git diff` takes)
    python tools/affected.py --files packages/rl-losses/src/rl_losses/ppo.py README.md
    python tools/affected.py HEAD~1..HEAD --format sessions   # the nox sessions, one a line
    python tools/affected.py HEAD~1..HEAD --format json       # everything, for CI
    python tools/affected.py HEAD~1..HEAD --format github     # key=value for $GITHUB_OUTPUT

The default output is one package name per line: the workspace members whose files changed,
plus every member that depends on one of them, transitively (a change to a member's own
``tests/`` or top-level Markdown, such as its README or CHANGELOG, selects that member alone).
The dependency graph is read from the members' own ``pyproject.toml`` files (``dependencies``,
optional dependencies and dependency groups, so a change to the test-support member
``rl-testing`` selects every package whose ``test`` group uses it). A change to a
workspace-level file (the root ``pyproject.toml``, ``uv.lock``, ``noxfile.py``, ``.ci/``) selects
everything, and so does any path no rule below knows: an unknown file runs the full suite
rather than too little.

Besides the ``test-<member>`` sessions, a change needs lint and typecheck always, isolation and
compat-light (the light packages at their floors) when a light (torch-only) package is
affected, integration and slow when rl-algos or rl-train is, and the docs sessions when docs or
a member change (``PATH_RULES`` below has the other paths).
``nox -s affected -- <range>`` runs exactly the sessions of ``--format sessions``, and the CI
workflow (``.github/workflows/ci.yml``) runs the same list, so a contributor can run locally
what CI will run for their change. See CONTRIBUTING.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Packages that install with torch and nothing heavier; ``nox -s isolation`` checks their wheels.
LIGHT = ["rl-advantages", "rl-losses", "rl-kernels"]
#: Packages whose change also runs ``integration`` and ``slow`` (tests_integration drives them).
HEAVY = ["rl-algos", "rl-train"]
#: Files whose change selects everything: they shape every environment or every session.
WORKSPACE_FILES = ["pyproject.toml", "uv.lock", "noxfile.py", ".python-version", ".ci/*"]
#: Paths outside the members: the sessions a change there needs (beyond lint and typecheck).
#: The first matching pattern wins; ``*`` also matches ``/``.
PATH_RULES: list[tuple[str, list[str]]] = [
    ("docs/*", ["docs", "docs-browser", "integration"]),  # integration runs every docs example
    ("mkdocs.yml", ["docs", "docs-browser"]),
    ("tools/docs/gpu_examples.py", ["tools"]),  # gpu.yml runs it; tools/tests test it
    ("tools/docs/*", ["docs", "docs-browser"]),
    ("tests_integration/*", ["integration", "slow"]),
    ("examples/*", ["integration"]),
    ("README.md", ["integration"]),  # tests_integration/test_repo_contract.py reads it
    ("tools/release.py", ["tools", "isolation", "integration", "slow"]),
    ("tools/affected.py", ["tools"]),
    ("tools/compat.py", ["tools", "compat-light"]),
    ("tools/tests/*", ["tools"]),
    (".github/workflows/release.yml", ["tools", "slow"]),  # slow: the release dry run
    (".github/*", ["tools"]),
    ("tools/gpu/*", ["gpu"]),
    ("tools/bench/bench_gpu.py", ["gpu"]),  # nox -s gpu runs its CPU smoke
    ("tools/bench/*", []),  # not in any default session: lint only
    ("CONTRIBUTING.md", []),
    (".gitignore", []),
]
#: Order in which ``nox -s affected`` runs the sessions: the quick ones first.
SESSION_ORDER = [
    "lint", "typecheck", "tools", "docs", "test-*", "isolation", "compat-light", "gpu",
    "docs-browser", "integration", "slow",
]  # fmt: skip


class AffectedError(RuntimeError):
    """The affected set cannot be computed; the message says which argument and what to do."""


@dataclass
class Member:
    """One workspace member: its name, directory and the sibling names it depends on."""

    name: str
    path: str  # relative to the root, POSIX, no trailing slash
    deps: set[str] = field(default_factory=set)


@dataclass
class Plan:
    """What a change needs: packages to test, nox sessions to run, and why."""

    packages: list[str]
    sessions: list[str]
    everything: bool
    reasons: list[str]
    #: positional arguments per session (``isolation`` gets the affected light packages)
    posargs: dict[str, list[str]] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        """A JSON-ready dict (the ``--format json`` output)."""
        light = [p for p in self.packages if p in LIGHT]
        return {
            "packages": self.packages,
            "light": light,
            "sessions": self.sessions,
            # the other sessions, each as nox -s takes it ("isolation -- rl-losses")
            "checks": [
                " -- ".join([s, " ".join(self.posargs[s])]) if s in self.posargs else s
                for s in self.sessions
                if not s.startswith("test-")
            ],
            "everything": self.everything,
            "heavy": "integration" in self.sessions,
            "posargs": self.posargs,
            "reasons": self.reasons,
        }


def _req_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0].lower()


def members(root: Path = ROOT) -> dict[str, Member]:
    """The workspace members of ``root`` (from ``[tool.uv.workspace] members``), by name."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise AffectedError(f"no pyproject.toml in {root}: run from the workspace root")
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    globs = config.get("tool", {}).get("uv", {}).get("workspace", {}).get("members", [])
    if not globs:
        raise AffectedError(f"{pyproject} has no [tool.uv.workspace] members")
    found: dict[str, Member] = {}
    tables: dict[str, dict[str, object]] = {}
    for pattern in globs:
        for directory in sorted(root.glob(pattern)):
            file = directory / "pyproject.toml"
            if not file.is_file():
                continue
            table = tomllib.loads(file.read_text(encoding="utf-8"))
            name = str(table["project"]["name"]).lower()
            found[name] = Member(name, directory.relative_to(root).as_posix())
            tables[name] = table
    for name, table in tables.items():
        project = table["project"]
        assert isinstance(project, dict)
        reqs: list[object] = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            reqs += extra
        groups = table.get("dependency-groups", {})
        assert isinstance(groups, dict)
        for group in groups.values():
            reqs += [r for r in group if isinstance(r, str)]  # skip {include-group = ...}
        found[name].deps = {n for r in reqs if (n := _req_name(str(r))) in found and n != name}
    return found


def dependents(changed: Iterable[str], graph: dict[str, Member]) -> list[str]:
    """``changed`` plus every member that depends on one of them, transitively; sorted."""
    selected = set(changed)
    grew = True
    while grew:
        more = {m.name for m in graph.values() if m.deps & selected} - selected
        selected |= more
        grew = bool(more)
    return sorted(selected)


def _match(path: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(path, pattern)


def _outside(path: str) -> tuple[list[str] | None, str]:
    """Sessions a change to a path outside the members needs (None: everything), and why."""
    if any(_match(path, pattern) for pattern in WORKSPACE_FILES):
        return None, f"{path}: workspace-level file, everything runs"
    rule = next((r for r in PATH_RULES if _match(path, r[0])), None)
    if rule is None:
        return None, f"{path}: no rule for this path, everything runs"
    return rule[1], f"{path}: {', '.join(rule[1]) or 'lint only'}"


def plan(paths: Iterable[str], root: Path = ROOT) -> Plan:
    """The packages and sessions that a change to ``paths`` (relative to ``root``) needs."""
    graph = members(root)
    by_dir = sorted(graph.values(), key=lambda m: -len(m.path))
    changed: set[str] = set()  # their dependents are selected too
    alone: set[str] = set()  # a member's own tests or Markdown: that member alone
    sessions: set[str] = set()
    reasons: list[str] = []
    everything = False
    paths = sorted({p.strip().removeprefix("./") for p in paths if p.strip()})
    if not paths:
        return Plan([], [], everything=False, reasons=["no file changed"])
    for path in paths:
        member = next((m for m in by_dir if path.startswith(m.path + "/")), None)
        if member is None:
            needs, why = _outside(path)
            everything |= needs is None
            sessions.update(needs or [])
            reasons.append(why)
            continue
        inner = path.removeprefix(member.path + "/")
        sessions.add("docs")  # the API pages render the members' docstrings
        if inner.startswith("tests/") or ("/" not in inner and inner.endswith(".md")):
            alone.add(member.name)
            reasons.append(f"{path}: {member.name} alone (its own tests or Markdown)")
        else:
            changed.add(member.name)
            reasons.append(f"{path}: {member.name} and the members that depend on it")
    selected = sorted(graph) if everything else sorted(set(dependents(changed, graph)) | alone)
    sessions |= {"lint", "typecheck"} | {f"test-{name}" for name in selected}
    if everything:
        sessions |= {"tools", "isolation", "compat-light", "integration", "slow", "docs", "gpu"}
        sessions.add("docs-browser")
    if set(selected) & set(HEAVY):
        sessions |= {"integration", "slow"}
    if changed:  # a package's source: its CUDA cases and the GPU benchmark (CPU smoke here)
        sessions.add("gpu")
    light = [p for p in selected if p in LIGHT]
    if light:
        sessions |= {"isolation", "compat-light"}  # the light packages at their floors too
    # isolation of the affected light packages only (all three: no arguments)
    posargs = {"isolation": light} if light and light != sorted(LIGHT) else {}
    return Plan(selected, _ordered(sessions), everything, reasons, posargs)


def _ordered(sessions: set[str]) -> list[str]:
    def key(name: str) -> tuple[int, str]:
        rank = next(
            (i for i, pattern in enumerate(SESSION_ORDER) if _match(name, pattern)),
            len(SESSION_ORDER),
        )
        return rank, name

    return sorted(sessions, key=key)


def changed_files(revisions: str, root: Path = ROOT) -> list[str]:
    """Paths changed in a git range (``A..B``, ``A...B``), relative to the repository root."""
    if revisions.startswith("-"):
        raise AffectedError(f"range {revisions!r} looks like an option: give A..B or A...B")
    proc = subprocess.run(
        ["git", "diff", "--name-only", "--no-renames", revisions, "--"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise AffectedError(
            f"git could not diff the range {revisions!r}: {proc.stderr.strip()}\n"
            "Give a range of existing commits, e.g. origin/main...HEAD or HEAD~1..HEAD "
            "(fetch the base branch first in a shallow clone), or list files with --files."
        )
    return proc.stdout.splitlines()


def _relative(path: str, root: Path) -> str:
    """A path given on the command line, relative to the root (absolute ones are converted)."""
    if not Path(path).is_absolute():
        return path
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        raise AffectedError(f"--files {path}: not inside the workspace {root}") from None


def paths_from_args(args: Sequence[str], root: Path = ROOT) -> list[str]:
    """The paths ``nox -s affected -- ARGS`` names: a range, ``--files ...`` or ``--all``."""
    if list(args) == ["--all"]:
        return ["uv.lock"]  # a workspace-level file: everything
    if args and args[0] == "--files":
        if len(args) == 1:
            raise AffectedError("--files needs at least one path after it")
        return [_relative(a, root) for a in args[1:]]
    if len(args) == 1 and not args[0].startswith("-"):
        return changed_files(args[0], root)
    raise AffectedError(
        f"arguments {' '.join(args) or '(none)'}: give one git range (origin/main...HEAD), "
        "--files PATH [PATH ...], or --all"
    )


def render(result: Plan, fmt: str) -> str:
    """The plan in one of the output formats of the command line."""
    if fmt == "packages":
        return "".join(f"{p}\n" for p in result.packages)
    if fmt == "sessions":
        return "".join(f"{s}\n" for s in result.sessions)
    data = result.as_json()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    # github: one key=value line each, values as compact JSON (fromJSON() in the workflow)
    keys = ["packages", "light", "checks", "everything", "heavy", "posargs"]
    return "".join(f"{k}={json.dumps(data[k], separators=(',', ':'))}\n" for k in keys)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="affected.py",
        description="Print the workspace packages (or nox sessions) a change needs.",
    )
    parser.add_argument("range", nargs="?", help="git range, e.g. origin/main...HEAD")
    parser.add_argument("--files", nargs="+", metavar="PATH", help="changed paths instead")
    parser.add_argument("--all", action="store_true", help="everything (CI on main)")
    parser.add_argument(
        "--format",
        choices=["packages", "sessions", "json", "github"],
        default="packages",
        help="packages (default), sessions, json or github ($GITHUB_OUTPUT lines)",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--explain", action="store_true", help="print why, on stderr")
    args = parser.parse_args(argv)
    try:
        given = [x for x in (args.range, args.files, args.all or None) if x is not None]
        if len(given) != 1:
            raise AffectedError(
                "give one of: a git range (affected.py origin/main...HEAD), --files PATH ..., "
                "or --all"
            )
        root = args.root.resolve()
        if args.all:
            paths = ["uv.lock"]  # a workspace-level file: everything
        elif args.files is not None:
            paths = [_relative(f, root) for f in args.files]
        else:
            paths = changed_files(args.range, root)
        result = plan(paths, root)
    except AffectedError as exc:
        print(f"affected.py: error: {exc}", file=sys.stderr)
        return 2
    if args.explain:
        print(*result.reasons, sep="\n", file=sys.stderr)
    sys.stdout.write(render(result, args.format))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
