"""rl-losses."""

from importlib.metadata import version as _version

__version__: str = _version("rl-losses")

__all__ = ["__version__"]
