"""rl-kernels."""

from importlib.metadata import version as _version

__version__: str = _version("rl-kernels")

__all__ = ["__version__"]
