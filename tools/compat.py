"""The ends of the declared dependency ranges: which versions ``nox -s compat`` installs and tests.

Every package declares floors (``torch>=2.6``...) and CI's lock tests one set near the top. The
``compat`` sessions test the other ends (docs/versions.md):

- ``floor-light``: rl-advantages, rl-losses and rl-kernels (with its ``liger`` extra), each
  direct dependency at the lowest version its range admits (uv's ``--resolution lowest-direct``),
  so torch at the light packages' floor. In the default ``.ci/run``.
- ``floor``: all eight packages, the trackers' and DeepSpeed's extras included, at the lowest
  direct versions: torch, transformers, peft, accelerate, datasets... at the heavy packages'
  floors; also runs the DeepSpeed ZeRO tests of ``tests_integration``.
- ``vllm``: all eight packages at the newest versions that vLLM's release in ``uv.lock`` allows:
  its exact torch, transformers and numpy pins (read from the lock), everything else newest.
  vLLM itself is not installed (its engine needs a GPU).

Ours are installed from wheels built from this checkout (``pip install`` as a user runs it), and
each package's own ``tests/`` run against them. The installed set is printed and written next to
the venv (``versions.txt``), so a failure names the versions it ran with.

Stdlib only (the noxfile imports it); ``python tools/compat.py table`` prints the declared ranges
as docs/versions.md shows them.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import release  # noqa: E402  (build, make_venv, install, ...)

#: Packages that install with torch and nothing heavier (tools/affected.py's LIGHT).
LIGHT = ["rl-advantages", "rl-losses", "rl-kernels"]


@dataclass(frozen=True)
class VersionSet:
    """One end of the ranges: what to install and which packages' tests run on it."""

    name: str
    #: Our packages installed (from wheels), with extras: ``"rl-kernels[liger]"``.
    install: tuple[str, ...]
    #: Packages whose ``tests/`` run.
    tests: tuple[str, ...]
    #: ``lowest-direct`` (the floors) or ``highest``.
    resolution: str
    #: Pin torch, transformers and numpy as vLLM's locked release does.
    vllm_pins: bool = False
    #: Further test files (paths from the repository root).
    extra_tests: tuple[str, ...] = ()


HEAVY = ["rl-adapters", "rl-rollout", "rl-envs", "rl-algos", "rl-train"]
SETS = {
    "floor-light": VersionSet(
        "floor-light",
        ("rl-advantages", "rl-losses", "rl-kernels[liger]"),
        tuple(LIGHT),
        "lowest-direct",
    ),
    "floor": VersionSet(
        "floor",
        (
            "rl-advantages",
            "rl-losses",
            "rl-kernels",
            "rl-adapters",
            "rl-rollout",
            "rl-envs[openenv,verifiers]",
            "rl-algos[deepspeed]",
            "rl-train[wandb,mlflow,trackio,clearml,tinker]",
        ),
        tuple(HEAVY),
        "lowest-direct",
        extra_tests=("tests_integration/test_deepspeed.py",),
    ),
    "vllm": VersionSet(
        "vllm",
        (
            "rl-advantages",
            "rl-losses",
            "rl-kernels",
            "rl-adapters",
            "rl-rollout",
            "rl-envs[openenv,verifiers]",
            "rl-algos",
            "rl-train[wandb,mlflow,trackio,clearml,tinker]",
        ),
        (*LIGHT, *HEAVY),
        "highest",
        vllm_pins=True,
    ),
}
#: What vLLM pins and we test against (the rest of its dependencies are its own business).
VLLM_PINNED = ("torch", "transformers", "numpy")


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0].lower()


def _test_group(package: str) -> list[str]:
    path = release.package_dir(package) / "pyproject.toml"
    groups = tomllib.loads(path.read_text(encoding="utf-8")).get("dependency-groups", {})
    return [r for r in groups.get("test", []) if isinstance(r, str)]


def _extras(requirement: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", requirement)
    return [e.strip() for e in match.group(1).split(",")] if match else []


def test_requirements(packages: Sequence[str]) -> list[str]:
    """Third-party requirements of the packages' ``test`` groups (ours and rl-testing left out).

    rl-testing is installed from its own wheel, with the extras of :func:`testing_extras`;
    the packages' own extras named there (``rl-kernels[liger]``) are in :data:`SETS`.
    """
    out: list[str] = []
    for package in packages:
        for req in _test_group(package):
            if not _name(req).startswith("rl-") and req not in out:
                out.append(req)
    return out


def testing_extras(packages: Sequence[str]) -> list[str]:
    """The rl-testing extras the packages' test groups ask for (``["models"]`` or ``[]``)."""
    extras: list[str] = []
    for package in packages:
        for req in _test_group(package):
            if _name(req) == "rl-testing":
                extras += [e for e in _extras(req) if e not in extras]
    return extras


def direct_requirements(vset: VersionSet) -> list[str]:
    """The third-party requirements of the set's packages (and the extras it installs).

    Given to the resolver next to our wheels, so that ``--resolution lowest-direct`` treats them
    as direct: a dependency of a wheel named by its name alone would otherwise resolve newest.
    """
    out: list[str] = []
    for target in vset.install:
        for name, spec in declared(_name(target), _extras(target)).items():
            req = f"{name}{spec}"
            if req not in out:
                out.append(req)
    return out


def vllm_pins(lock: Path = ROOT / "uv.lock") -> dict[str, str]:
    """``{name: version}`` of what the locked vLLM release pins (:data:`VLLM_PINNED`).

    The lock resolves the ``vllm`` extra of rl-rollout in its own fork, so vLLM's dependency
    entries carry the versions it was resolved with. Where the lock holds several (numpy, by
    Python version), the one for the oldest supported Python is taken.
    """
    data = tomllib.loads(lock.read_text())
    vllm = [p for p in data["package"] if p["name"] == "vllm"]
    if len(vllm) != 1:
        raise SystemExit(f"uv.lock holds {len(vllm)} vllm releases; expected one")
    pins: dict[str, str] = {}
    for dep in vllm[0].get("dependencies", []):
        name = dep["name"]
        if name not in VLLM_PINNED or "version" not in dep:
            continue
        marker = dep.get("marker", "")
        if name in pins and "python_full_version <" not in marker:
            continue  # keep the entry of the oldest Python
        pins[name] = dep["version"]
    missing = [n for n in VLLM_PINNED if n not in pins]
    if missing:
        # a single version in the whole lock is not repeated in the dependency entry
        for name in missing:
            versions = {p["version"] for p in data["package"] if p["name"] == name}
            if len(versions) != 1:
                raise SystemExit(f"cannot tell vllm's {name} from uv.lock: {sorted(versions)}")
            pins[name] = versions.pop()
    return pins


def declared(package: str, extras: Sequence[str] | None = None) -> dict[str, str]:
    """``{name: specifier}`` of a package's third-party runtime dependencies and extras.

    ``extras``: which extras to include (None: all of them).
    """
    proj = release.project(package)
    reqs = list(proj.get("dependencies", []))  # type: ignore[call-overload]
    for extra, extra_reqs in dict(proj.get("optional-dependencies", {})).items():  # type: ignore[call-overload]
        if extras is None or extra in extras:
            reqs += extra_reqs
    out: dict[str, str] = {}
    for req in reqs:
        name = _name(req)
        if name.startswith("rl-"):
            continue
        spec = re.sub(r"^[A-Za-z0-9_.\-]+(\[[^\]]*\])?", "", req.split(";")[0]).strip()
        out[name] = spec
    return out


def _release(version: str) -> tuple[int, ...]:
    """``"2.6"`` -> ``(2, 6)``: the numeric release, trailing zeros dropped (no pre/post)."""
    public = version.split("+", maxsplit=1)[0].split("rc", maxsplit=1)[0]
    parts = [int(p) for p in re.findall(r"\d+", public)]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def unreachable_floors(vset: VersionSet, installed: dict[str, str]) -> list[str]:
    """Declared floors that the floor set did not install exactly: each a sentence saying why.

    In a ``lowest-direct`` set every direct dependency sits at the lowest version its range and
    the other packages admit. A declared ``>=X`` installed above ``X`` is a floor no resolver
    reaches (another requirement lifts it): declare the installed version instead.
    """
    problems = []
    for target in vset.install:
        package = _name(target)
        if package not in vset.tests:  # a dependency of the tested ones; its own set checks it
            continue
        for name, spec in declared(package, _extras(target)).items():
            match = re.search(r">=\s*([0-9][^,\s]*)", spec)
            key = re.sub(r"[-_.]+", "-", name).lower()
            if not match or key not in installed:
                continue
            if _release(installed[key]) != _release(match.group(1)):
                problems.append(
                    f"{package} declares {name}{spec} but the floor set resolves "
                    f"{name}=={installed[key]}: declare {name}>={installed[key]} (docs/versions.md)"
                )
    return problems


def table() -> str:
    """The declared ranges as a Markdown table: one row per dependency, one column per package."""
    pkgs = release.packages()
    per = {p: declared(p) for p in pkgs}
    names = sorted({n for d in per.values() for n in d}, key=lambda n: (n != "torch", n))
    head = "| dependency | " + " | ".join(pkgs) + " |"
    rule = "|---|" + "---|" * len(pkgs)
    rows = [
        f"| {n} | " + " | ".join(f"`{per[p][n]}`" if n in per[p] else "" for p in pkgs) + " |"
        for n in names
    ]
    return "\n".join([head, rule, *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """``python tools/compat.py table | vllm-pins``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table", help="the declared ranges as docs/versions.md shows them")
    sub.add_parser("vllm-pins", help="what the locked vLLM pins")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table())
    else:
        for name, version in vllm_pins().items():
            print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
