"""rl-algos."""

from importlib.metadata import version as _version

__version__: str = _version("rl-algos")

__all__ = ["__version__"]
