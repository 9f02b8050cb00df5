"""rl-losses: every policy-gradient objective used for LLMs, as pure functions of tensors.

Inputs: ``logprobs``, ``old_logprobs``, ``ref_logprobs`` [N, T], ``advantages`` [N] or [N, T],
``mask`` [N, T] (True where a token counts), optional ``turn_ids`` [N, T]. Each objective
returns a typed result holding the loss and detached diagnostics. The ILQL terms
(``ilql_loss`` and its parts) cover offline value-based RL (arXiv 2206.11871). See the README
for the peer-conventions table (CISPO clamp, GSPO gradient, KL direction, aggregation).
"""

from importlib.metadata import version as _version

from rl_losses.aggregate import AGGREGATIONS, Aggregation, aggregate
from rl_losses.correction import off_policy_mask, rollout_correction, rollout_weights
from rl_losses.entropy import entropy_bonus, high_entropy_mask
from rl_losses.ilql import (
    ILQLLossOutput,
    TargetReduction,
    awac_loss,
    cql_loss,
    expectile_loss,
    ilql_loss,
    ilql_td_loss,
    next_state_values,
)
from rl_losses.kl import KLKind, kl_estimate, kl_penalty
from rl_losses.outputs import (
    EntropyOutput,
    KLOutput,
    PolicyLossOutput,
    RolloutCorrection,
    ValueLossOutput,
)
from rl_losses.policy import (
    cispo_loss,
    clip_cov_loss,
    clipped_surrogate,
    gmpo_loss,
    gspo_loss,
    kl_cov_loss,
    reinforce_loss,
    sapo_loss,
)
from rl_losses.policy_sequence import luspo_loss, vespo_loss
from rl_losses.policy_trust import dppo_loss, dro_loss
from rl_losses.registry import available_policy_losses, get_policy_loss, register_policy_loss
from rl_losses.units import Level, Pooling, to_units
from rl_losses.value import value_loss

__version__: str = _version("rl-losses")

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "EntropyOutput",
    "ILQLLossOutput",
    "KLKind",
    "KLOutput",
    "Level",
    "PolicyLossOutput",
    "Pooling",
    "RolloutCorrection",
    "TargetReduction",
    "ValueLossOutput",
    "__version__",
    "aggregate",
    "available_policy_losses",
    "awac_loss",
    "cispo_loss",
    "clip_cov_loss",
    "clipped_surrogate",
    "cql_loss",
    "dppo_loss",
    "dro_loss",
    "entropy_bonus",
    "expectile_loss",
    "get_policy_loss",
    "gmpo_loss",
    "gspo_loss",
    "high_entropy_mask",
    "ilql_loss",
    "ilql_td_loss",
    "kl_cov_loss",
    "kl_estimate",
    "kl_penalty",
    "luspo_loss",
    "next_state_values",
    "off_policy_mask",
    "register_policy_loss",
    "reinforce_loss",
    "rollout_correction",
    "rollout_weights",
    "sapo_loss",
    "to_units",
    "value_loss",
    "vespo_loss",
]
