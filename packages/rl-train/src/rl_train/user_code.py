"""The user's modules of a run config's ``imports:``, imported in order (no torch here).

What they register (``@rl_losses.register_policy_loss``, ``@rl_advantages.register_estimator``,
``rl_algos.register_algorithm``, reward functions) can then be named in the config.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "import_user_code"]


class ConfigError(ValueError):
    """A configuration problem, reported as one line by the command line."""


def import_user_code(imports: list[str]) -> list[Any]:
    """Import the configured user modules (``imports:``), in order.

    A ``.py`` path is loaded as a module named after its stem (so ``data.reward`` can say
    ``stem:function``); a module name is imported with the working directory on ``sys.path``.

    Args:
        imports: Module names or ``.py`` file paths.

    Returns:
        The modules.

    Raises:
        ConfigError: A missing file or a module that fails to import (one line).
    """
    modules = []
    for item in imports:
        try:
            if item.endswith(".py") or os.sep in item or "/" in item:
                path = Path(item).resolve()
                if not path.is_file():
                    raise ConfigError(f"imports: file {item!r} does not exist")
                if path.stem in sys.modules and getattr(
                    sys.modules[path.stem], "__file__", None
                ) == str(path):
                    modules.append(sys.modules[path.stem])
                    continue
                spec = importlib.util.spec_from_file_location(path.stem, path)
                if spec is None or spec.loader is None:
                    raise ConfigError(f"imports: cannot load {item!r} as a Python module")
                module = importlib.util.module_from_spec(spec)
                sys.modules[path.stem] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[path.stem]
                    raise
            else:
                if os.getcwd() not in sys.path and "" not in sys.path:
                    sys.path.insert(0, os.getcwd())
                module = importlib.import_module(item)
        except ConfigError:
            raise
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ConfigError(
                f"imports: cannot import {item!r}: {type(exc).__name__}: {first}"
            ) from exc
        modules.append(module)
    return modules
