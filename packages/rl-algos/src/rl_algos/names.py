"""The algorithm table: one row per algorithm, as plain data; importing it loads no torch.

Every fact about an algorithm lives in its row (:class:`AlgorithmSpec`): the name users write,
the agent class, the preset's overrides of the agent config's defaults, whether it samples a
group per prompt, learns online, trains a critic, may run asynchronously, and which trlX-style
trainer class drives it. rl-algos (:mod:`rl_algos.presets`, :func:`rl_algos.make_agent`),
rl-train's builder, run config and command line, the trlX-style trainer registry and the TRL
facade all read this table, so adding an algorithm is one row (:func:`register_algorithm`).

The table is read before torch is imported: ``algo:`` and the ``agent:`` keys of a run config
are checked against it (:func:`agent_config_fields` reads the agent config's field names from
the source, without importing it).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, overload

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_SPECS",
    "AlgorithmSpec",
    "FromArg",
    "agent_config_fields",
    "batch_rows",
    "get_spec",
    "register_algorithm",
    "remove_algorithm",
    "resolve_name",
]


@dataclass(frozen=True)
class FromArg:
    """A preset default that copies another keyword's value (e.g. Dr. GRPO's length norm)."""

    name: str
    """The keyword whose value is copied (None when it was not passed)."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm: its name, agent class, preset overrides and every other fact about it."""

    name: str
    """The name users write (``make_agent(name)``, ``--algo``, ``algo:``)."""
    agent: str
    """The agent class: a public name of :mod:`rl_algos` (``"GRPO"``, ``"LLMPPO"``) or
    ``"package.module:Class"``."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """The preset's overrides of the agent config's defaults; a :class:`FromArg` copies another
    keyword. An explicit keyword always wins over them."""
    summary: str = ""
    """One line with the paper (arXiv id)."""
    grouped: bool = True
    """Samples ``group_size`` completions per prompt (the GRPO family); False: one per prompt
    (``G = 1``)."""
    online: bool = True
    """Learns from its own generations; False: from logged (offline) data (ILQL)."""
    critic: bool = False
    """Trains a value function beside the policy (PPO); equals the agent class's
    ``uses_critic`` (checked when the preset is built)."""
    async_refused: str | None = None
    """Why the asynchronous rollout loop refuses this algorithm, with the fix; None: allowed."""
    trainer: str = "AgentTrainer"
    """The trlX-style trainer class (``rl_train.get_trainer(name)``): a public name of
    :mod:`rl_train` or ``"package.module:Class"``."""

    def __post_init__(self) -> None:
        """Check the row (each error names the field and the fix)."""
        if not self.name.isidentifier():
            raise ValueError(
                f"AlgorithmSpec.name must be an identifier (letters, digits, _), got {self.name!r}"
            )
        if not self.agent:
            raise ValueError(f"AlgorithmSpec {self.name!r}: `agent` must name the agent class")
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))

    def resolve(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` over this row's defaults (``FromArg`` defaults filled from ``kwargs``)."""
        out = dict(kwargs)
        for key, value in self.defaults.items():
            if key not in out:
                out[key] = kwargs.get(value.name) if isinstance(value, FromArg) else value
        return out


_CRITIC_REFUSED = (
    "algo ppo cannot train asynchronously: its critic's values and GAE would be computed for "
    "samples of an older policy than the critic's; use grpo or reinforce (or another GRPO "
    "preset), or remove the async section"
)
_OFFLINE_REFUSED = (
    "algo ilql learns offline from logged data: there is nothing to generate asynchronously; "
    "remove the async section"
)

_ROWS: dict[str, AlgorithmSpec] = {
    s.name: s
    for s in (
        AlgorithmSpec(
            "grpo", "GRPO", {}, "GRPO: group-relative advantages, clipped surrogate (2402.03300)"
        ),
        AlgorithmSpec("gspo", "GSPO", {}, "GSPO: sequence-level ratio (2507.18071)"),
        AlgorithmSpec("cispo", "CISPO", {}, "CISPO: clipped IS weight x log-prob (2506.13585)"),
        AlgorithmSpec(
            "dr_grpo",
            "GRPO",
            {
                "adv_norm": "mean_only",
                "loss_aggregation": "seq_mean_token_sum_norm",
                "max_length_norm": FromArg("max_output_tokens"),
                "beta": 0.0,
            },
            "Dr. GRPO: no std scaling, constant length normaliser, no KL (2503.20783, Sec. 3.1)",
        ),
        AlgorithmSpec(
            "dapo",
            "GRPO",
            {
                "clip_coef": 0.2,
                "clip_coef_high": 0.28,
                "loss_aggregation": "token_mean",
                "filter_zero_adv": True,
                "beta": 0.0,
            },
            "DAPO: clip-higher, token-level normaliser, dynamic sampling, no KL (2503.14476)",
        ),
        AlgorithmSpec(
            "rloo",
            "GRPO",
            {"advantage_estimator": "rloo", "loss_aggregation": "token_mean"},
            "RLOO: leave-one-out baseline, token-mean loss (2402.14740)",
        ),
        AlgorithmSpec(
            "reinforce_pp",
            "GRPO",
            {"advantage_estimator": "reinforce_pp_baseline", "loss_aggregation": "token_mean"},
            "REINFORCE++-baseline: group-mean baseline, KL in the reward, whitening (2501.03262)",
        ),
        AlgorithmSpec(
            "reinforce",
            "LLMREINFORCE",
            {},
            "REINFORCE with Return Batch Normalization, turn level (2510.01051)",
            grouped=False,
        ),
        AlgorithmSpec(
            "ppo",
            "LLMPPO",
            {},
            "PPO with a critic and turn-level GAE (1707.06347)",
            grouped=False,
            critic=True,
            async_refused=_CRITIC_REFUSED,
        ),
        AlgorithmSpec(
            "ilql",
            "ILQL",
            {},
            "ILQL: offline Q/V heads, value-guided decoding (2206.11871)",
            grouped=False,
            online=False,
            async_refused=_OFFLINE_REFUSED,
            trainer="ILQLTrainer",
        ),
    )
}

#: Every algorithm's row by name, in the order users see them (a live, read-only view).
ALGORITHM_SPECS: Mapping[str, AlgorithmSpec] = MappingProxyType(_ROWS)


class _Names(Sequence[str]):
    """The names of the table's rows, in order (a live view; equals the tuple of the names)."""

    def __len__(self) -> int:
        return len(_ROWS)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return tuple(_ROWS)[index]

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_ROWS))

    def __contains__(self, name: object) -> bool:
        return name in _ROWS

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple | list | _Names):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(_ROWS))


#: The algorithm names (``--algo`` choices, ``algo:`` values): the stack's only such list.
ALGORITHMS: Sequence[str] = _Names()


def get_spec(name: str) -> AlgorithmSpec:
    """The row called ``name``.

    Raises:
        ValueError: An unknown name; the message lists the known ones.
    """
    try:
        return _ROWS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(_ROWS)}") from None


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` as a row of the table and return it.

    ``make_agent``, ``algo:``, ``--algo``, the trainer registry and the TRL facade then know it.

    Raises:
        ValueError: A row of that name exists already (pick another name).
    """
    if not isinstance(spec, AlgorithmSpec):
        raise ValueError(f"register_algorithm needs an AlgorithmSpec, got {type(spec).__name__}")
    if spec.name in _ROWS and _ROWS[spec.name] != spec:
        raise ValueError(f"an algorithm named {spec.name!r} exists already; pick another name")
    _ROWS[spec.name] = spec
    return spec


def remove_algorithm(name: str) -> AlgorithmSpec:
    """Remove the row called ``name`` (e.g. one a test registered) and return it.

    Raises:
        ValueError: An unknown name.
    """
    spec = get_spec(name)
    del _ROWS[name]
    return spec


def batch_rows(prompts: int, group_size: int) -> int:
    """``N = B * G``: rows of one step of ``B = prompts`` prompts sampled ``G`` times each.

    The default ``batch_size`` of a run (``G = 1`` for an algorithm that is not ``grouped``).

    Raises:
        ValueError: ``prompts`` or ``group_size`` below 1.
    """
    if prompts < 1 or group_size < 1:
        raise ValueError(
            f"`prompts` and `group_size` must be >= 1, got prompts={prompts}, "
            f"group_size={group_size}"
        )
    return prompts * group_size


def resolve_name(name: str, package: str) -> Any:
    """The object ``name`` refers to: a public name of ``package``, or ``"module:attr"``.

    Raises:
        ValueError: A name that does not resolve (the message names it).
    """
    module, _, attr = name.rpartition(":") if ":" in name else (package, ":", name)
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{name!r} does not resolve to an object of {module}: {exc}") from exc


# -- the agent config's field names, read from the source (no import, no torch) ------------------


def _location(name: str, package: str) -> tuple[str, str]:
    """``(module, class)`` of a table name, without importing the module that defines it."""
    if ":" in name:
        module, _, attr = name.rpartition(":")
        return module, attr
    lazy: Mapping[str, tuple[str, str]] = getattr(importlib.import_module(package), "_LAZY", {})
    return lazy.get(name, (package, name))


@functools.lru_cache(maxsize=64)
def _module_ast(module: str) -> tuple[ast.Module, str] | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8")), module


def _class_def(module: str, name: str, depth: int = 0) -> tuple[ast.ClassDef, str] | None:
    """The ``class name`` statement of ``module`` (following ``from x import name``)."""
    parsed = _module_ast(module)
    if parsed is None or depth > 8:
        return None
    for node in parsed[0].body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, module
    for node in parsed[0].body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _class_def(node.module, alias.name, depth + 1)
    return None


def _bases(node: ast.ClassDef) -> list[str]:
    return [b.id for b in node.bases if isinstance(b, ast.Name)]


def _config_class(module: str, agent: str) -> tuple[str, str] | None:
    """``(module, class)`` of the agent class's ``config_class`` (following its bases)."""
    found = _class_def(module, agent)
    if found is None:
        return None
    node, where = found
    for stmt in node.body:
        target: ast.expr | None = stmt.target if isinstance(stmt, ast.AnnAssign) else None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and target.id == "config_class":
            return (where, value.id) if isinstance(value, ast.Name) else None
    for base in _bases(node):
        parent = _config_class(where, base)
        if parent is not None:
            return parent
    return None


def _fields(module: str, name: str) -> list[str] | None:
    """The dataclass field names of ``module.name`` and its bases (``ClassVar`` excluded)."""
    found = _class_def(module, name)
    if found is None:
        return None
    node, where = found
    names: list[str] = []
    for base in _bases(node):
        inherited = _fields(where, base)
        if inherited is None:
            return None
        names += inherited
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if "ClassVar" not in ast.unparse(stmt.annotation):
            names.append(stmt.target.id)
    return list(dict.fromkeys(names))


def agent_config_fields(name: str) -> tuple[str, ...] | None:
    """The keywords algorithm ``name``'s agent takes, read without torch.

    The fields of its typed config (the agent class's ``config_class`` and its bases), then the
    other named parameters of its constructor (``device``, ``index``...), read from the source
    without importing it; None where the source cannot be read (the agent's constructor then
    checks its keywords).

    Raises:
        ValueError: An unknown algorithm.
    """
    return _agent_fields(get_spec(name).agent)


def _init_parameters(module: str, name: str) -> list[str]:
    """The named parameters of the ``__init__`` of ``module.name`` and its bases."""
    found = _class_def(module, name)
    if found is None:
        return []
    node, where = found
    names = [n for base in _bases(node) for n in _init_parameters(where, base)]
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            a = stmt.args
            names += [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)][1:]
    return names


@functools.lru_cache(maxsize=64)
def _agent_fields(agent: str) -> tuple[str, ...] | None:
    try:
        location = _location(agent, "rl_algos")
        config = _config_class(*location)
        names = None if config is None else _fields(*config)
        if names:
            names += [n for n in _init_parameters(*location) if n not in names]
    except (ImportError, SyntaxError, OSError, ValueError):
        return None
    return None if not names else tuple(names)


#: A column of the table as a live, read-only mapping (name -> value where ``keep(value)``).
class Column(Mapping[str, Any]):
    """One field of every row, by algorithm name, leaving out rows where it is None or False."""

    def __init__(self, attribute: str, keep: Callable[[Any], bool] = bool) -> None:
        self._attribute, self._keep = attribute, keep

    def _items(self) -> dict[str, Any]:
        values = {n: getattr(s, self._attribute) for n, s in _ROWS.items()}
        return {n: v for n, v in values.items() if self._keep(v)}

    def __getitem__(self, name: str) -> Any:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())
