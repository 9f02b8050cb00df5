"""Reads of peft's and transformers' internals: one place, with defaults, never an error.

The lean forwards (:mod:`rl_adapters.lean_lora`, :mod:`~rl_adapters.lean_rotary`,
:mod:`~rl_adapters.lean_norm`, :mod:`~rl_adapters.lean_mlp`) and the role switches
(:mod:`rl_adapters.roles`) read attributes that are not part of peft's or transformers'
public API: a peft LoRA layer's ``lora_A``, ``lora_B``, ``scaling``, ``lora_dropout``,
``lora_variant``, ``lora_bias``, ``base_layer``, ``merged_adapters``, ``active_adapters``,
``disable_adapters`` (and ``use_dora``, ``fan_in_fan_out``, ``get_delta_weight``); a
transformers modeling module's ``apply_rotary_pos_emb``; an RMSNorm's ``weight`` and
``variance_epsilon`` / ``eps``; a gated MLP's ``gate_proj``, ``up_proj``, ``down_proj``,
``act_fn``. Every such read goes through :func:`read` (or :func:`missing` to check a set at
once): a missing or renamed attribute gives the default (:data:`MISSING` when none is given),
so the caller runs peft's or transformers' own forward instead of raising ``AttributeError``.

:func:`missing` is silent (the caller records the reason, :mod:`rl_adapters.lean_report`);
:func:`read` without a default, and :func:`warn_once`, log a warning the first time an
internal is missing on a class (this module's logger): what the policy's report warned about
already is not repeated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Final

__all__ = [
    "LORA_INTERNALS",
    "MISSING",
    "describe_missing",
    "first_warning",
    "library_versions",
    "missing",
    "read",
    "warn_once",
]

logger = logging.getLogger(__name__)


class _Missing:
    """The type of :data:`MISSING`."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


#: What :func:`read` returns for an attribute that cannot be read and has no default.
MISSING: Final = _Missing()

#: The peft LoRA layer attributes the lean LoRA forward needs (missing: peft's own forward).
LORA_INTERNALS: Final = (
    "base_layer",
    "lora_A",
    "lora_B",
    "scaling",
    "lora_dropout",
    "lora_variant",
    "lora_bias",
    "active_adapters",
    "disable_adapters",
    "merged_adapters",
)

_WARNED: set[str] = set()  # the reasons already warned about
_LOCK = threading.Lock()


def _get(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except Exception:  # a property of a renamed internal can raise anything
        return MISSING


def read(obj: Any, name: str, default: Any = MISSING, *, library: str = "peft") -> Any:
    """``obj.name``, or ``default`` where it cannot be read (missing, renamed, raising).

    Without a ``default`` the attribute is one the caller needs: the first time it is missing
    on a class, a warning names the class, the attribute and the library versions.
    """
    value = _get(obj, name)
    if value is not MISSING:
        return value
    if default is MISSING:
        warn_once(describe_missing(obj, [name], library), library)
    return default


def warn_once(reason: str, library: str) -> None:
    """Log ``reason`` (a missing internal) as a warning unless it was logged before."""
    if first_warning(reason):
        logger.warning("%s: running %s's own forward (%s)", reason, library, library_versions())


def first_warning(reason: str) -> bool:
    """True the first time ``reason`` is passed (then it counts as warned about)."""
    with _LOCK:
        first = reason not in _WARNED
        _WARNED.add(reason)
    return first


def missing(obj: Any, names: Iterable[str]) -> list[str]:
    """The attributes of ``names`` that ``obj`` does not have (or that raise on reading)."""
    return [name for name in names if _get(obj, name) is MISSING]


def describe_missing(obj: Any, names: Iterable[str], library: str) -> str:
    """``"peft internal Linear.lora_variant is missing"``: the reason a fallback records."""
    cls = type(obj).__name__
    listed = ", ".join(f"{cls}.{name}" for name in names)
    return f"{library} internal {listed} is missing or renamed"


def library_versions() -> str:
    """``"peft 0.21.2, transformers 5.23.0"``: the versions to quote in a fallback's warning."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("peft", "transformers"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} not installed")
    return ", ".join(out)


def require_torch_integration() -> None:
    """Raise ``ImportError`` when transformers has switched off its PyTorch integration.

    A transformers release needs a minimum torch (5.23: torch 2.6) and, below it, disables its
    models with only a logged warning; a resolver may still pair the two. Our floor
    (``torch>=2.6``, docs/versions.md) holds for the releases we test; this check names the pair
    for any other.
    """
    import transformers
    from transformers.utils.import_utils import is_torch_available

    if not is_torch_available():
        import torch

        raise ImportError(
            f"transformers {transformers.__version__} has disabled its PyTorch integration for "
            f"torch {torch.__version__} (its log names the minimum torch it needs): upgrade "
            "torch, or install a transformers release that supports this torch "
            "(docs/versions.md lists the tested ranges)"
        )
