"""The presets: each row of the algorithm table (:mod:`rl_algos.names`) with its agent class.

:data:`rl_algos.names.ALGORITHM_SPECS` is the one table of algorithms; a preset is a row of it
(:class:`Preset`): Dr. GRPO, DAPO, RLOO and REINFORCE++ are :class:`~rl_algos.GRPO` with other
defaults, not code paths. :func:`make_agent` builds one; an explicit keyword always wins over a
preset default. A row added with :func:`rl_algos.names.register_algorithm` is a preset at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rl_algos.config import config_fields
from rl_algos.grpo import GRPO
from rl_algos.names import (
    ALGORITHM_SPECS,
    ALGORITHMS,
    AlgorithmSpec,
    FromArg,
    get_spec,
    register_algorithm,
    resolve_name,
)

__all__ = [
    "ALGORITHMS",
    "PRESETS",
    "FromArg",
    "Preset",
    "dapo",
    "dr_grpo",
    "get_preset",
    "make_agent",
    "register_algorithm",
    "reinforce_pp",
    "rloo_agent",
]


@dataclass(frozen=True)
class Preset:
    """One algorithm: its row of the table (:class:`rl_algos.names.AlgorithmSpec`) and class."""

    spec: AlgorithmSpec
    """The row of :data:`rl_algos.names.ALGORITHM_SPECS` (name, defaults, summary, flags)."""
    agent: type[Any]
    """The rl-algos agent class (``GRPO``, ``LLMPPO``, ...)."""

    def __post_init__(self) -> None:
        """The row's ``critic`` must say what the class does (``uses_critic``)."""
        uses_critic = bool(getattr(self.agent, "uses_critic", False))
        if self.spec.critic != uses_critic:
            raise ValueError(
                f"algorithm {self.spec.name!r}: critic={self.spec.critic} but "
                f"{self.agent.__name__}.uses_critic is {uses_critic}; set critic={uses_critic}"
            )

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


class _Presets(Mapping[str, Preset]):
    """Every row of the table as a :class:`Preset`, by name, in order (a live, read-only view)."""

    def __getitem__(self, name: str) -> Preset:
        spec = ALGORITHM_SPECS[name]
        return Preset(spec, resolve_name(spec.agent, "rl_algos"))

    def __iter__(self) -> Iterator[str]:
        return iter(ALGORITHM_SPECS)

    def __len__(self) -> int:
        return len(ALGORITHM_SPECS)


#: Every preset by name, in the order users see them.
PRESETS: Mapping[str, Preset] = _Presets()


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ValueError: An unknown name; the message lists the known ones.
    """
    spec = get_spec(name)
    return Preset(spec, resolve_name(spec.agent, "rl_algos"))


def make_agent(name: str, **kwargs: Any) -> Any:
    """The agent of preset ``name``: its class with ``kwargs`` over the preset's defaults.

    A preset default that ``kwargs`` turn into a no-op (Dr. GRPO's ``max_length_norm`` with
    another ``loss_aggregation``, DAPO's ``clip_coef_high`` with an objective without an upper
    clip bound) is left out rather than refused: the agent refuses only what the caller set.
    """
    preset = get_preset(name)
    resolved = preset.resolve(kwargs)
    for key in _inert_defaults(preset, kwargs, resolved):
        del resolved[key]
    return preset.agent(**resolved)


def _inert_defaults(
    preset: Preset, kwargs: Mapping[str, Any], resolved: Mapping[str, Any]
) -> list[str]:
    """The preset defaults (not in ``kwargs``) the agent would refuse as having no effect."""
    from_preset = set(preset.defaults) - set(kwargs)
    config_class = getattr(preset.agent, "config_class", None)
    if not from_preset or config_class is None:
        return []
    fields = config_fields(config_class)
    try:
        config = config_class(**{k: v for k, v in resolved.items() if k in fields})
    except (TypeError, ValueError):  # the agent refuses these, naming the argument
        return []
    return [key for key in config.ignored_options() if key in from_preset]


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
