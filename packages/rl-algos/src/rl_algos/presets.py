"""The one table of algorithm names: each preset is an agent class plus default settings.

``ALGORITHMS`` is the only list of algorithm names in the stack: ``rl-train demo --algo``,
``rl-train run``'s ``algo:`` and the trlX-style trainer registry all read it. A preset is data
(:class:`Preset`): Dr. GRPO, DAPO, RLOO and REINFORCE++ are :class:`~rl_algos.GRPO` with other
defaults, not code paths. :func:`make_agent` builds one; an explicit keyword always wins over a
preset default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rl_algos.grpo import CISPO, GRPO, GSPO
from rl_algos.ilql import ILQL
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
class FromArg:
    """A preset default that copies another keyword's value (e.g. Dr. GRPO's length norm)."""

    name: str
    """The keyword whose value is copied (None when it was not passed)."""


@dataclass(frozen=True)
class Preset:
    """One algorithm: which agent class, with which defaults."""

    name: str
    """The name users write (``--algo``, ``algo:``)."""
    agent: type
    """The rl-algos agent class (``GRPO``, ``LLMPPO``, ...)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Constructor defaults over the class's own; a :class:`FromArg` copies another keyword."""
    summary: str = ""
    """One line with the paper (arXiv id)."""
    grouped: bool = True
    """Samples ``group_size`` completions per prompt (the GRPO family); False: one per prompt."""
    online: bool = True
    """Learns from its own generations; False: from logged (offline) data (ILQL)."""

    def resolve(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` over this preset's defaults (``FromArg`` defaults filled from ``kwargs``)."""
        out = dict(kwargs)
        for key, value in self.defaults.items():
            if key not in out:
                out[key] = kwargs.get(value.name) if isinstance(value, FromArg) else value
        return out


_TABLE = (
    Preset("grpo", GRPO, {}, "GRPO: group-relative advantages, clipped surrogate (2402.03300)"),
    Preset("gspo", GSPO, {}, "GSPO: sequence-level ratio (2507.18071)"),
    Preset("cispo", CISPO, {}, "CISPO: clipped IS weight x log-prob (2506.13585)"),
    Preset(
        "dr_grpo",
        GRPO,
        {
            "adv_norm": "mean_only",
            "loss_aggregation": "seq_mean_token_sum_norm",
            "max_length_norm": FromArg("max_output_tokens"),
            "beta": 0.0,
        },
        "Dr. GRPO: no std scaling, constant length normaliser, no KL (2503.20783, Sec. 3.1)",
    ),
    Preset(
        "dapo",
        GRPO,
        {
            "clip_coef": 0.2,
            "clip_coef_high": 0.28,
            "loss_aggregation": "token_mean",
            "filter_zero_adv": True,
            "beta": 0.0,
        },
        "DAPO: clip-higher, token-level normaliser, dynamic sampling, no KL (2503.14476)",
    ),
    Preset(
        "rloo",
        GRPO,
        {"advantage_estimator": "rloo", "loss_aggregation": "token_mean"},
        "RLOO: leave-one-out baseline, token-mean loss (2402.14740)",
    ),
    Preset(
        "reinforce_pp",
        GRPO,
        {"advantage_estimator": "reinforce_pp_baseline", "loss_aggregation": "token_mean"},
        "REINFORCE++-baseline: group-mean baseline, KL in the reward, whitening (2501.03262)",
    ),
    Preset(
        "reinforce",
        LLMREINFORCE,
        {},
        "REINFORCE with Return Batch Normalization, turn level (2510.01051)",
        grouped=False,
    ),
    Preset("ppo", LLMPPO, {}, "PPO with a critic and turn-level GAE (1707.06347)", grouped=False),
    Preset(
        "ilql",
        ILQL,
        {},
        "ILQL: offline Q/V heads, value-guided decoding (2206.11871)",
        grouped=False,
        online=False,
    ),
)

#: Every preset by name, in the order users see them.
PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in _TABLE})
#: The algorithm names (``--algo`` choices, ``algo:`` values): the stack's only such list.
ALGORITHMS: tuple[str, ...] = tuple(PRESETS)


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
