"""The YAML side of a run configuration: the text of the file and the command line's overrides.

PyYAML's safe loader with YAML 1.2's floats (``1e-4`` is a number, not the string ``'1e-4'``)
reads the file, each ``key.sub=value`` override (its value parsed as YAML) is set over it, and
:class:`_Given` records which dotted keys the file and the command line each set, for the checks
that depend on where a setting came from; the result is a plain tree of mappings, which
:mod:`rl_train._config_types` builds into the typed sections of :mod:`rl_train.config`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rl_train.user_code import ConfigError


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-4`` and ``1e3`` are numbers.

    YAML 1.1 (PyYAML's default) needs a dot and a signed exponent (``1.0e-4``) and reads ``1e-4``
    as the string ``'1e-4'``.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def yaml_load(text: str, where: str) -> Any:
    """Parse YAML (YAML 1.2 floats: ``1e-4`` is a number).

    Args:
        text: The YAML text.
        where: What it is, for errors (a file name, ``override 'key=value'``).

    Returns:
        The parsed value.

    Raises:
        ConfigError: Invalid YAML, naming the line, the column and the problem.
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        detail = f"{problem} ({context})" if context else problem
        raise ConfigError(f"{where} is not valid YAML{at}: {detail}") from exc


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = value


def _dotted(node: Any, prefix: str = "") -> set[str]:
    """The dotted keys a parsed YAML mapping sets (``train``, ``train.steps``...)."""
    if not isinstance(node, dict):
        return set()
    out = set()
    for key, value in node.items():
        out.add(f"{prefix}{key}")
        out |= _dotted(value, f"{prefix}{key}.")
    return out


@dataclass(frozen=True)
class _Given:
    """Which dotted keys the YAML file and the command line set."""

    in_file: set[str]
    command_line: set[str]

    def where(self, key: str) -> str | None:
        """``command line`` (the key or a section above it), ``YAML`` or None (a default)."""
        parts = key.split(".")
        if any(".".join(parts[:n]) in self.command_line for n in range(1, len(parts) + 1)):
            return "command line"
        return "YAML" if key in self.in_file else None


def _read_tree(
    path: str | Path | None, overrides: list[str] | None
) -> tuple[dict[str, Any], _Given]:
    """The YAML file's tree (empty without a file) with the overrides set over it.

    Args:
        path: The YAML file, or None for the defaults.
        overrides: ``key.sub=value`` strings (values parsed as YAML).

    Returns:
        The tree, and which dotted keys the file and the command line set.

    Raises:
        ConfigError: a missing file, bad YAML (with its line and column), a file that does not
            hold a mapping, or an override that is not ``key=value``.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        loaded = yaml_load(p.read_text(), str(p)) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p} must hold a mapping at the top level")
        tree = loaded
    in_file = _dotted(tree)
    command_line: set[str] = set()
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.steps=50)")
        key, raw = item.split("=", 1)
        _set(tree, key.strip(), yaml_load(raw, f"override {item!r}"))
        command_line.add(key.strip())
    return tree, _Given(in_file, command_line)
