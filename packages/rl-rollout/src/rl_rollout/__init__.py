"""rl-rollout."""

from importlib.metadata import version as _version

__version__: str = _version("rl-rollout")

__all__ = ["__version__"]
