"""rl-train."""

from importlib.metadata import version as _version

__version__: str = _version("rl-train")

__all__ = ["__version__"]
