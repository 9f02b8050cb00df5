"""rl-advantages."""

from importlib.metadata import version as _version

__version__: str = _version("rl-advantages")

__all__ = ["__version__"]
