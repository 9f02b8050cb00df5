"""rl-adapters."""

from importlib.metadata import version as _version

__version__: str = _version("rl-adapters")

__all__ = ["__version__"]
