"""The presets: each row of :mod:`rl_algos.names` as an agent class plus default settings.

``ALGORITHMS`` (defined in the torch-free :mod:`rl_algos.names`, re-exported here) is the only
list of algorithm names in the stack: ``rl-train demo --algo``, ``rl-train run``'s ``algo:``
and the trlX-style trainer registry all read it. A preset is data
(:class:`Preset`): Dr. GRPO, DAPO, RLOO and REINFORCE++ are :class:`~rl_algos.GRPO` with other
defaults, not code paths. :func:`make_agent` builds one; an explicit keyword always wins over a
preset default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rl_algos.grpo import CISPO, GRPO, GSPO
from rl_algos.ilql import ILQL
from rl_algos.names import ALGORITHM_SPECS, ALGORITHMS, AlgorithmSpec, FromArg
from rl_algos.ppo import LLMPPO
from rl_algos.reinforce import LLMREINFORCE

__all__ = [
    "ALGORITHMS",
    "PRESETS",
    "FromArg",
    "Preset",
    "dapo",
    "dr_grpo",
    "get_preset",
    "make_agent",
    "reinforce_pp",
    "rloo_agent",
]


@dataclass(frozen=True)
class Preset:
    """One algorithm: its torch-free row (:class:`rl_algos.names.AlgorithmSpec`) and agent class."""

    spec: AlgorithmSpec
    """The row of :data:`rl_algos.names.ALGORITHM_SPECS` (name, defaults, summary, flags)."""
    agent: type
    """The rl-algos agent class (``GRPO``, ``LLMPPO``, ...)."""

    @property
    def name(self) -> str:
        """The name users write (``--algo``, ``algo:``)."""
        return self.spec.name

    @property
    def defaults(self) -> Mapping[str, Any]:
        """Constructor defaults over the class's own; a ``FromArg`` copies another keyword."""
        return self.spec.defaults

    @property
    def summary(self) -> str:
        """One line with the paper (arXiv id)."""
        return self.spec.summary

    @property
    def grouped(self) -> bool:
        """Samples ``group_size`` completions per prompt (the GRPO family)."""
        return self.spec.grouped

    @property
    def online(self) -> bool:
        """Learns from its own generations; False: from logged (offline) data (ILQL)."""
        return self.spec.online

    def resolve(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` over this preset's defaults (``FromArg`` defaults filled from ``kwargs``)."""
        return self.spec.resolve(kwargs)


_AGENTS: Mapping[str, type] = {
    "GRPO": GRPO,
    "GSPO": GSPO,
    "CISPO": CISPO,
    "LLMREINFORCE": LLMREINFORCE,
    "LLMPPO": LLMPPO,
    "ILQL": ILQL,
}

_TABLE = tuple(Preset(spec, _AGENTS[spec.agent]) for spec in ALGORITHM_SPECS.values())

#: Every preset by name, in the order users see them.
PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in _TABLE})


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ValueError: An unknown name; the message lists the known ones.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}"
        ) from None


def make_agent(name: str, **kwargs: Any) -> Any:
    """The agent of preset ``name``: its class with ``kwargs`` over the preset's defaults."""
    preset = get_preset(name)
    return preset.agent(**preset.resolve(kwargs))


def dr_grpo(**kwargs: Any) -> GRPO:
    """Dr. GRPO (arXiv 2503.20783, Sec. 3.1): the ``dr_grpo`` preset of :data:`PRESETS`."""
    return make_agent("dr_grpo", **kwargs)  # type: ignore[no-any-return]


def dapo(**kwargs: Any) -> GRPO:
    """DAPO (arXiv 2503.14476): the ``dapo`` preset of :data:`PRESETS`.

    Dynamic sampling (dropping all-equal groups, eq. 11) is ``filter_zero_adv=True``; the
    overlong shaping (eq. 13) is a reward helper (``rl_envs.rewards.overlong_reward``).
    """
    return make_agent("dapo", **kwargs)  # type: ignore[no-any-return]


def rloo_agent(**kwargs: Any) -> GRPO:
    """RLOO (arXiv 2402.14740): the ``rloo`` preset of :data:`PRESETS`."""
    return make_agent("rloo", **kwargs)  # type: ignore[no-any-return]


def reinforce_pp(**kwargs: Any) -> GRPO:
    """REINFORCE++-baseline (arXiv 2501.03262): the ``reinforce_pp`` preset of :data:`PRESETS`."""
    return make_agent("reinforce_pp", **kwargs)  # type: ignore[no-any-return]
