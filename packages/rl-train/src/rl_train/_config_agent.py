"""The ``algo:`` and ``agent:`` settings, checked against the algorithm table before torch loads.

An unknown algorithm is refused with the nearest name, the asynchronous loop's refusals are the
table's ``async_refused`` column (:data:`ASYNC_REFUSED`), and each ``agent.<key>`` must be a
field of the algorithm's typed agent config (or its constructor's keyword) whose value fits the
field's annotation and least value. The annotations are read from the agent config's source
with :mod:`ast` (:mod:`rl_algos.names` locates it), never by importing it, so the check runs
without torch.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

# torch-free: the config is checked against the algorithm table before torch loads
from rl_algos.names import ALGORITHM_SPECS, ALGORITHMS, Column, agent_config_fields

from rl_train._config_types import _suggest
from rl_train.user_code import ConfigError

if TYPE_CHECKING:
    from rl_train.config import RunConfig


#: Algorithms the asynchronous loop refuses, and why (with the fix): the table's
#: ``async_refused`` column (:mod:`rl_algos.names`), a live view.
ASYNC_REFUSED: Mapping[str, str] = Column("async_refused")


def _unknown_algorithm(algo: str) -> None:
    raise ConfigError(f"unknown algorithm {algo!r}{_suggest(algo, list(ALGORITHMS))}")


def _check_algorithm(config: RunConfig) -> None:
    """What the algorithm's row decides: the ``agent:`` keys, whether it may run async."""
    _check_agent_keys(config)
    if config.async_ is not None and config.algo in ASYNC_REFUSED:
        raise ConfigError(f"async: {ASYNC_REFUSED[config.algo]}")


def _check_agent_keys(config: RunConfig) -> None:
    """``agent:`` keys are the agent's keywords (its typed config's fields, its constructor's),
    and each value fits its field's type (and range) in the agent's typed config.

    ``group_size`` is also accepted, and dropped, for an algorithm that samples one completion
    per prompt (the row's ``grouped`` is False), so one YAML serves every algorithm.
    """  # noqa: D205
    valid = agent_config_fields(config.algo)
    if valid is None:  # the source is unreadable: the agent's constructor checks them
        return
    ignored = () if ALGORITHM_SPECS[config.algo].grouped else ("group_size",)
    annotations = _agent_annotations(config.algo)
    for key, value in config.agent.items():
        if key in ignored:
            continue
        if key not in valid:
            agent = ALGORITHM_SPECS[config.algo].agent.rpartition(":")[2]
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean 'agent.{close[0]}'?" if close else "--print-config lists them"
            raise ConfigError(
                f"unknown key 'agent.{key}': {agent} got unexpected arguments [{key!r}]; {hint}"
            )
        if key in annotations:
            _check_agent_value(key, value, annotations[key])


#: The least value of numeric agent settings, checked when the YAML is read (the agent's own
#: checks name its internal arguments, after the model is built).
_AGENT_MINIMUM: dict[str, int] = {
    "group_size": 1,
    "batch_size": 1,
    "update_epochs": 1,
    "max_output_tokens": 1,
    "max_model_len": 1,
    "micro_batch_size_per_gpu": 1,
    "micro_batch_tokens": 1,
    "min_output_tokens": 0,
    "lr": 0,
    "beta": 0,
}


def _check_agent_value(key: str, value: Any, annotation: ast.expr) -> None:
    """``agent.<key>``'s value against its annotation in the agent's typed config."""
    fits = _fits(value, annotation)
    tri_state = _fits(None, annotation) and _fits(True, annotation) and not _fits(1, annotation)
    if value == "auto" and tri_state:  # the YAML spelling of None for a bool | None switch
        return
    minimum = _AGENT_MINIMUM.get(key)
    wanted = _wanted(annotation, minimum)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if fits is False or (minimum is not None and number and value < minimum):
        raise ConfigError(f"agent.{key} must be {wanted}, got {value!r}")


def _agent_annotations(algo: str) -> dict[str, ast.expr]:
    """The annotation of each field of ``algo``'s typed agent config, read from the source
    without importing it (torch-free); empty where the source cannot be read.
    """  # noqa: D205
    from rl_algos import names

    try:
        module, agent = names._location(ALGORITHM_SPECS[algo].agent, "rl_algos")
        found = names._config_class(module, agent)
        return {} if found is None else _class_annotations(*found)
    except (ImportError, SyntaxError, OSError, ValueError, AttributeError, KeyError):
        return {}


def _class_annotations(module: str, name: str, depth: int = 0) -> dict[str, ast.expr]:
    """The annotated fields of class ``module.name`` and its bases (``ClassVar`` excluded)."""
    from rl_algos import names

    found = names._class_def(module, name)
    if found is None or depth > 8:
        return {}
    node, where = found
    out: dict[str, ast.expr] = {}
    for base in names._bases(node):
        out.update(_class_annotations(where, base, depth + 1))
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if "ClassVar" not in ast.unparse(stmt.annotation):
            out[stmt.target.id] = stmt.annotation
    return out


#: Checks of the type names of an annotation (bool is not a number) and their words.
_CHECKS: dict[str, tuple[Any, str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "tuple": (lambda v: isinstance(v, list | tuple), "a list"),
    "list": (lambda v: isinstance(v, list | tuple), "a list"),
    "Sequence": (lambda v: isinstance(v, list | tuple), "a list"),
    "dict": (lambda v: isinstance(v, dict), "a mapping"),
    "Mapping": (lambda v: isinstance(v, dict), "a mapping"),
}


def _options(node: ast.expr) -> list[ast.expr]:
    """The alternatives of an annotation: ``X | Y``, ``Optional[X]``, ``Union[X, Y]``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _options(node.left) + _options(node.right)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            return _options(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return [node]
    head = _head(node)
    if isinstance(node, ast.Subscript) and head in ("Optional", "Union"):
        inner = node.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if head == "Optional":
            items.append(ast.Constant(None))
        return [option for item in items for option in _options(item)]
    return [node]


def _head(node: ast.expr) -> str | None:
    """``int`` of ``int``, ``list`` of ``list[str]``; None for anything else."""
    base = node.value if isinstance(node, ast.Subscript) else node
    return base.id if isinstance(base, ast.Name) else None


def _literals(node: ast.expr) -> list[Any] | None:
    """The values of ``Literal[...]``, or None when ``node`` is not one."""
    if not (isinstance(node, ast.Subscript) and _head(node) == "Literal"):
        return None
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return [item.value for item in items if isinstance(item, ast.Constant)]


def _fits(value: Any, node: ast.expr) -> bool | None:
    """Whether ``value`` fits an annotation: True, False, or None (a type not read here)."""
    results: list[bool | None] = []
    for option in _options(node):
        literals = _literals(option)
        check = _CHECKS.get(_head(option) or "")
        if isinstance(option, ast.Constant) and option.value is None:
            results.append(value is None)
        elif literals is not None:
            results.append(value in literals)
        elif _head(option) == "Any":
            results.append(True)
        else:
            results.append(None if check is None else bool(check[0](value)))
    return True if any(results) else (None if None in results else False)


def _wanted(node: ast.expr, minimum: int | None = None) -> str:
    """An annotation in words (``int | None`` -> ``an integer or null``)."""
    words = []
    for option in _options(node):
        literals = _literals(option)
        check = _CHECKS.get(_head(option) or "")
        if isinstance(option, ast.Constant) and option.value is None:
            continue
        if literals is not None:
            words.append("one of " + ", ".join(repr(v) for v in literals))
        elif check is None:
            words.append(ast.unparse(option))
        elif minimum is not None and _head(option) in ("int", "float"):
            words.append(f"{check[1]} >= {minimum}")
        else:
            words.append(check[1])
    if _fits(None, node):
        words.append("null")
    return " or ".join(dict.fromkeys(words))
