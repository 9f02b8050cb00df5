"""Checks every workspace package runs on itself: metadata, version and typing marker."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from types import ModuleType

__all__ = ["assert_package_metadata"]


def assert_package_metadata(module: ModuleType, pyproject: Path) -> None:
    """Assert that an installed package agrees with its ``pyproject.toml``.

    Checks that ``module.__version__`` equals the static version in ``pyproject`` and the version
    in the installed distribution's metadata, that the installed distribution declares the same
    dependencies as ``pyproject`` (so a stale environment is caught), that every name in
    ``module.__all__`` exists, and that the ``py.typed`` marker ships next to the module.

    Args:
        module: The imported top-level module, for example ``rl_losses``.
        pyproject: Path of the package's ``pyproject.toml``.

    Raises:
        AssertionError: On the first disagreement, with both values in the message.
    """
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    name = project["name"]
    assert module.__name__ == name.replace("-", "_"), (module.__name__, name)
    assert module.__version__ == project["version"], (
        f"{name}: __version__ {module.__version__!r} != pyproject version {project['version']!r}"
    )
    installed = importlib.metadata.version(name)
    assert installed == project["version"], (
        f"{name}: installed metadata version {installed!r} != pyproject {project['version']!r}; "
        "re-sync the environment"
    )
    requires = sorted(
        r.replace(" ", "")
        for r in importlib.metadata.requires(name) or []
        if "extra==" not in r.replace(" ", "")
    )
    declared = sorted(d.replace(" ", "") for d in project.get("dependencies", []))
    assert requires == declared, f"{name}: installed requires {requires} != declared {declared}"
    exported = list(module.__all__)
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}: names in __all__ but not defined: {missing}"
    assert "__version__" in exported, f"{name}: __all__ should export __version__"
    module_file = module.__file__
    assert module_file is not None
    assert (Path(module_file).parent / "py.typed").is_file(), f"{name}: py.typed is not shipped"
