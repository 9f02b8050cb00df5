"""The one table of algorithm names, as plain data: importing it loads no torch.

``ALGORITHMS`` is the only list of algorithm names in the stack: ``rl-train demo --algo``,
``rl-train run``'s ``algo:`` and the trlX-style trainer registry all read it. Each row
(:class:`AlgorithmSpec`) names its agent class by name (``"GRPO"``) together with the preset's
defaults, so a command line can validate ``algo:`` and read ``grouped`` / ``online`` before
torch or any model library is imported. :mod:`rl_algos.presets` turns every row into a
:class:`~rl_algos.presets.Preset` with the agent class itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["ALGORITHMS", "ALGORITHM_SPECS", "AlgorithmSpec", "FromArg"]


@dataclass(frozen=True)
class FromArg:
    """A preset default that copies another keyword's value (e.g. Dr. GRPO's length norm)."""

    name: str
    """The keyword whose value is copied (None when it was not passed)."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm as data: the agent class's name in :mod:`rl_algos`, with its defaults."""

    name: str
    """The name users write (``--algo``, ``algo:``)."""
    agent: str
    """The name of the rl-algos agent class (``"GRPO"``, ``"LLMPPO"``, ...)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Constructor defaults over the class's own; a :class:`FromArg` copies another keyword."""
    summary: str = ""
    """One line with the paper (arXiv id)."""
    grouped: bool = True
    """Samples ``group_size`` completions per prompt (the GRPO family); False: one per prompt."""
    online: bool = True
    """Learns from its own generations; False: from logged (offline) data (ILQL)."""

    def resolve(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` over this row's defaults (``FromArg`` defaults filled from ``kwargs``)."""
        out = dict(kwargs)
        for key, value in self.defaults.items():
            if key not in out:
                out[key] = kwargs.get(value.name) if isinstance(value, FromArg) else value
        return out


_TABLE = (
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
        "ppo", "LLMPPO", {}, "PPO with a critic and turn-level GAE (1707.06347)", grouped=False
    ),
    AlgorithmSpec(
        "ilql",
        "ILQL",
        {},
        "ILQL: offline Q/V heads, value-guided decoding (2206.11871)",
        grouped=False,
        online=False,
    ),
)

#: Every algorithm's row by name, in the order users see them.
ALGORITHM_SPECS: Mapping[str, AlgorithmSpec] = MappingProxyType({s.name: s for s in _TABLE})
#: The algorithm names (``--algo`` choices, ``algo:`` values): the stack's only such list.
ALGORITHMS: tuple[str, ...] = tuple(ALGORITHM_SPECS)
