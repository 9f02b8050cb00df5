"""rl-envs."""

from importlib.metadata import version as _version

__version__: str = _version("rl-envs")

__all__ = ["__version__"]
