"""Per-package release tooling for the rl-* workspace (stdlib only; drives ``uv``).

Every package under ``packages/`` is versioned and released on its own:

    python tools/release.py bump rl-losses minor [--bump beta] [--note "..."] [--dry-run]
    python tools/release.py build rl-losses        # wheel + sdist into dist/rl-losses, --no-sources
    python tools/release.py smoke rl-losses        # install that wheel in a fresh venv, import it
    python tools/release.py tag rl-losses          # git tag rl-losses-v0.2.0 (annotated)
    python tools/release.py check-tag rl-losses-v0.2.0   # tag version == pyproject version

``bump`` edits only the package's ``pyproject.toml`` and ``CHANGELOG.md`` and re-locks
``uv.lock``; it refuses a version that a sibling's dependency range would not admit (widen the
range in the sibling first, which is then a change to that sibling too). See docs/releasing.md.

The functions here are also used by ``noxfile.py`` (``build-<package>`` and ``isolation``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_DIR = ROOT / "packages"
DIST = ROOT / "dist"
TAG_RE = re.compile(r"^(?P<package>rl-[a-z-]+)-v(?P<version>\d+\.\d+\.\d+\S*)$")
UNRELEASED = "## [Unreleased]"


class ReleaseError(RuntimeError):
    """A release step cannot go on; the message says why and what to do."""


def uv() -> str:
    """Return the ``uv`` executable (PATH first, then the ``uv`` Python package)."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ReleaseError("uv is not installed: `pip install uv`") from exc
    return str(find_uv_bin())


def run(args: Sequence[str | Path], *, cwd: Path = ROOT, capture: bool = False) -> str:
    """Run a command, echoing it; raise ``ReleaseError`` with its output if it fails."""
    print("+", " ".join(str(a) for a in args), flush=True)
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, text=True, capture_output=capture, check=False
    )
    if proc.returncode != 0:
        detail = (proc.stdout or "") + (proc.stderr or "") if capture else ""
        cmd = " ".join(str(a) for a in args)
        raise ReleaseError(f"command failed ({proc.returncode}): {cmd}\n{detail}")
    return proc.stdout if capture else ""


def packages() -> list[str]:
    """Names of the publishable workspace packages, in directory order."""
    return sorted(p.name for p in PACKAGES_DIR.iterdir() if (p / "pyproject.toml").is_file())


def project(package: str) -> dict[str, object]:
    """The ``[project]`` table of a package's ``pyproject.toml``."""
    path = package_dir(package) / "pyproject.toml"
    table: dict[str, object] = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    return table


def package_dir(package: str) -> Path:
    """Directory of a workspace package; raises with the known names if there is none."""
    path = PACKAGES_DIR / package
    if not (path / "pyproject.toml").is_file():
        raise ReleaseError(f"unknown package {package!r}; known: {', '.join(packages())}")
    return path


def module_name(package: str) -> str:
    """Import name of a package (``rl-losses`` -> ``rl_losses``)."""
    return package.replace("-", "_")


def version_of(package: str) -> str:
    """Static version in the package's ``pyproject.toml``."""
    return str(project(package)["version"])


def _req_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower()


def workspace_deps(package: str) -> list[str]:
    """Sibling packages ``package`` depends on, transitively, in dependency-first order."""
    known = set(packages())
    order: list[str] = []

    def visit(name: str) -> None:
        deps = project(name).get("dependencies", [])
        assert isinstance(deps, list)
        for req in deps:
            dep = _req_name(str(req))
            if dep in known and dep not in order:
                visit(dep)
                order.append(dep)

    visit(package)
    return order


def dependents(package: str) -> dict[str, str]:
    """Siblings that depend directly on ``package``, mapped to their requirement string."""
    found: dict[str, str] = {}
    for other in packages():
        deps = project(other).get("dependencies", [])
        assert isinstance(deps, list)
        for req in deps:
            if _req_name(str(req)) == package:
                found[other] = str(req)
    return found


def _admits(requirement: str, version: str) -> bool:
    """Whether a PEP 508 requirement's specifier admits ``version`` (uses ``packaging``)."""
    from packaging.requirements import Requirement

    return Requirement(requirement).specifier.contains(version, prereleases=True)


def release_changelog(text: str, version: str, date: str, note: str | None) -> str:
    """Move the Unreleased section of a changelog under a new version heading.

    Args:
        text: The changelog, with a ``## [Unreleased]`` heading.
        version: The new version.
        date: Release date, ISO format.
        note: A bullet to add under ``### Changed`` when the Unreleased section is empty.

    Returns:
        The new changelog text: an empty Unreleased section, then the released one.
    """
    if UNRELEASED not in text:
        raise ReleaseError(f"changelog has no '{UNRELEASED}' heading")
    head, rest = text.split(UNRELEASED, 1)
    match = re.search(r"^## \[", rest, flags=re.MULTILINE)
    body, tail = (rest[: match.start()], rest[match.start() :]) if match else (rest, "")
    body = body.strip("\n")
    if note:
        body = (body + "\n\n" if body else "### Changed\n") + f"- {note}"
    if not body.strip():
        raise ReleaseError(
            "the Unreleased section of the changelog is empty: add entries, or pass --note"
        )
    released = f"## [{version}] - {date}\n\n{body}\n\n"
    return f"{head}{UNRELEASED}\n\n{released}{tail}".rstrip("\n") + "\n"


def bump(
    package: str, parts: Sequence[str], *, note: str | None = None, dry_run: bool = False
) -> str:
    """Bump one package's version, move its changelog entries, re-lock. Returns the version."""
    pkg_dir = package_dir(package)
    args = [uv(), "version", "--package", package, "--no-sync"]
    for part in parts:
        args += ["--bump", part]
    new = run([*args, "--dry-run", "--short"], capture=True).strip().split()[-1]
    blocked = {d: r for d, r in dependents(package).items() if not _admits(r, new)}
    if blocked:
        lines = "\n".join(f"  {d}: {r}" for d, r in sorted(blocked.items()))
        raise ReleaseError(
            f"{package} {new} is outside the range these siblings accept:\n{lines}\n"
            "Widen their ranges first (and release them), or choose a smaller bump."
        )
    changelog = pkg_dir / "CHANGELOG.md"
    today = _dt.date.today().isoformat()
    new_text = release_changelog(changelog.read_text(encoding="utf-8"), new, today, note)
    if dry_run:
        print(f"{package}: {version_of(package)} -> {new} (dry run, nothing written)")
        return new
    run(args)  # edits pyproject.toml and re-locks uv.lock
    changelog.write_text(new_text, encoding="utf-8")
    print(f"{package}: bumped to {new}; next: commit, then `python tools/release.py tag {package}`")
    return new


def build(package: str, out_dir: Path | None = None) -> tuple[Path, Path]:
    """Build a package's wheel and sdist with ``--no-sources``; return (wheel, sdist)."""
    package_dir(package)
    out = out_dir or DIST / package
    if out.exists():
        shutil.rmtree(out)
    run([uv(), "build", "--package", package, "--no-sources", "--out-dir", str(out)])
    version = version_of(package)
    stem = f"{module_name(package)}-{version}"
    wheels = list(out.glob(f"{stem}-*.whl"))
    sdists = list(out.glob(f"{stem}.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise ReleaseError(f"expected one wheel and one sdist for {stem} in {out}, got {wheels}")
    return wheels[0], sdists[0]


def make_venv(path: Path) -> Path:
    """Create a fresh, empty virtual environment; return its Python."""
    run([uv(), "venv", "--quiet", "--clear", "--python", sys.executable, str(path)])
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def install(python: Path, targets: Iterable[str | Path], find_links: Path | None = None) -> None:
    """``uv pip install`` into the environment of ``python`` (no workspace sources).

    Without the install-time bytecode compile that pyproject.toml asks for: these environments
    run a few ``python -I`` commands, which write the ``.pyc`` of what they import themselves.
    """
    args = [uv(), "pip", "install", "--quiet", "--no-compile-bytecode", "--python", str(python)]
    if find_links is not None:
        # our wheels are rebuilt under an unchanged version: never take one from uv's cache
        ours = sorted({w.name.split("-")[0].replace("_", "-") for w in find_links.glob("*.whl")})
        args += ["--find-links", str(find_links)]
        args += [a for name in ours for a in ("--refresh-package", name)]
    run([*args, *[str(t) for t in targets]])


def installed(python: Path) -> dict[str, str]:
    """Distributions installed in the environment of ``python``: normalised name -> version."""
    out = run([uv(), "pip", "list", "--python", str(python), "--format", "json"], capture=True)
    return {re.sub(r"[-_.]+", "-", d["name"]).lower(): d["version"] for d in json.loads(out)}


def smoke(
    package: str,
    *,
    dist: Path | None = None,
    forbidden: Iterable[str] = (),
    work: Path | None = None,
) -> dict[str, str]:
    """Install a package's built wheel (and its siblings' wheels) into a fresh venv and use it.

    The sibling wheels it depends on are built into a temporary wheelhouse, since nothing is
    published; third-party dependencies come from the index. In the fresh venv, the package is
    imported with ``python -I``, its ``__version__`` is compared with pyproject, and the
    package's ``tests/smoke_isolated.py`` (a small real computation) is run if it exists.
    Also installs the sdist into a second venv to prove it builds.

    Args:
        package: Package name.
        dist: Directory holding the built wheel and sdist (default ``dist/<package>``).
        forbidden: Distributions that must not end up installed (raises if any is).
        work: Scratch directory (a temporary one by default).

    Returns:
        What ended up installed in the wheel's venv (name -> version).
    """
    dist = dist or DIST / package
    version = version_of(package)
    stem = f"{module_name(package)}-{version}"
    wheels = list(dist.glob(f"{stem}-*.whl"))
    sdists = list(dist.glob(f"{stem}.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise ReleaseError(f"no built {stem} wheel/sdist in {dist}: run `build {package}` first")
    with tempfile.TemporaryDirectory(prefix=f"smoke-{package}-") as tmp:
        scratch = (work or Path(tmp)).resolve()
        house = scratch / "wheelhouse"
        house.mkdir(parents=True, exist_ok=True)
        for dep in workspace_deps(package):
            wheel, _ = build(dep, scratch / "deps" / dep)
            shutil.copy(wheel, house)
        check = (
            f"import {module_name(package)} as m; "
            f"assert m.__version__ == {version!r}, m.__version__; print(m.__name__, m.__version__)"
        )
        smoke_script = package_dir(package) / "tests" / "smoke_isolated.py"
        result: dict[str, str] = {}
        for kind, artifact in (("wheel", wheels[0]), ("sdist", sdists[0])):
            python = make_venv(scratch / f"venv-{kind}")
            install(python, [artifact], find_links=house)
            run([python, "-I", "-c", check], cwd=scratch)
            if kind == "wheel":
                if smoke_script.is_file():
                    run([python, "-I", str(smoke_script)], cwd=scratch)
                result = installed(python)
        bad = sorted(set(forbidden) & set(result))
        if bad:
            raise ReleaseError(f"{package}: installing its wheel pulled in forbidden {bad}")
        return result


def tag_name(package: str, version: str | None = None) -> str:
    """The release tag of a package version, e.g. ``rl-losses-v0.2.0``."""
    return f"{package}-v{version or version_of(package)}"


def check_tag(tag: str) -> str:
    """Check that a release tag names a package whose pyproject has that version.

    Args:
        tag: The tag, e.g. ``rl-losses-v0.2.0`` (a leading ``refs/tags/`` is allowed).

    Returns:
        The package the tag releases (``rl-losses``); ``.github/workflows/release.yml`` builds
        that package and nothing else.
    """
    tag = tag.removeprefix("refs/tags/")
    match = TAG_RE.match(tag)
    if not match:
        raise ReleaseError(
            f"check-tag {tag!r}: not of the form <package>-v<version>, e.g. "
            f"{tag_name('rl-losses')}; packages: {', '.join(packages())}"
        )
    package, version = match["package"], match["version"]
    if package not in packages():
        raise ReleaseError(
            f"check-tag {tag!r}: unknown package {package!r} (no packages/{package}); "
            f"known: {', '.join(packages())}"
        )
    if version_of(package) != version:
        raise ReleaseError(
            f"check-tag {tag}: the tag says {version} but {package} pyproject says "
            f"{version_of(package)}. Tag the "
            f"committed version ({tag_name(package)}), or bump it first "
            f"(release.py bump {package} ...) and tag the commit that holds the bump."
        )
    return package


def tag(package: str) -> str:
    """Create the annotated git tag for the package's current version."""
    name = tag_name(package)
    existing = run(["git", "tag", "--list", name], capture=True).strip()
    if existing:
        raise ReleaseError(f"tag {name} exists already: bump the version first")
    run(["git", "tag", "-a", name, "-m", f"{package} {version_of(package)}"])
    return name


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bump", help="bump one package's version and move its changelog entries")
    p.add_argument("package")
    p.add_argument("part", help="major, minor, patch, stable, alpha, beta, rc, post or dev")
    p.add_argument("--bump", action="append", default=[], help="a further bump part")
    p.add_argument("--note", help="changelog bullet, when the Unreleased section is empty")
    p.add_argument("--dry-run", action="store_true")
    for name in ("build", "smoke", "tag"):
        sub.add_parser(name).add_argument("package")
    sub.add_parser("check-tag").add_argument("tag")
    args = parser.parse_args(argv)
    try:
        if args.command == "bump":
            bump(args.package, [args.part, *args.bump], note=args.note, dry_run=args.dry_run)
        elif args.command == "build":
            print(*build(args.package), sep="\n")
        elif args.command == "smoke":
            smoke(args.package)
        elif args.command == "tag":
            print(tag(args.package))
        else:
            print(check_tag(args.tag))
    except ReleaseError as exc:
        print(f"release.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
