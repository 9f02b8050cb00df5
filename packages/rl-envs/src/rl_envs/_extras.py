"""Optional libraries of the ``rl-envs`` extras, imported only when a feature uses them.

A missing extra is a one-line :class:`ImportError` that names the extra to install, never a
traceback from deep inside an import.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(ImportError):
    """An optional library of an ``rl-envs`` extra is not installed."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` of the ``rl-envs[extra]`` extra, or say which extra to install.

    Args:
        module: The module to import (``openenv.core``, ``verifiers.v1``).
        extra: The extra that installs it (``openenv``, ``verifiers``).
        feature: What needs it, for the message (``rl_envs.openenv``).

    Returns:
        The module.

    Raises:
        MissingExtraError: ``module``'s distribution is not installed.
    """
    try:
        return import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or module.partition(".")[0] != exc.name.partition(".")[0]:
            raise
        raise MissingExtraError(
            f"{feature} needs the {extra!r} extra: pip install 'rl-envs[{extra}]'"
        ) from None
