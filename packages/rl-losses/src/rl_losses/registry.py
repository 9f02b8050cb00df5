"""A registry of policy objectives so higher layers choose one by a config string."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

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

__all__ = ["available_policy_losses", "get_policy_loss", "register_policy_loss"]

F = TypeVar("F", bound=Callable[..., Any])

_LOSSES: dict[str, Callable[..., Any]] = {}

#: Peers' objective names whose formula is not published: refused by name (with the reason)
#: unless someone registers a function under the name.
UNPUBLISHED: dict[str, str] = {
    "stable_reinforce": (
        "Tinker's `stable_reinforce` (tinker-docs.thinkingmachines.ai/tinker/losses/"
        "stable-reinforce, alpha) is a REINFORCE variant that reads stability information its "
        "sampler records (record_stability_info=True, per-sequence sequence_id) and takes a "
        "`kl_coeff`; its formula is not published, so it is not implemented here. Use "
        "'importance_sampling', 'ppo', 'cispo', 'dro' or 'dppo_tv' for off-policy data, or "
        "register yours with @rl_losses.register_policy_loss('stable_reinforce')"
    ),
}


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Register a policy objective under ``name`` (decorator).

    The function should follow the common signature ``fn(logprobs, old_logprobs, advantages,
    mask, **options) -> PolicyLossOutput``.

    Raises:
        ValueError: If ``name`` is empty or registered already.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"`name` must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        if name in _LOSSES:
            raise ValueError(f"a policy loss named {name!r} is registered already")
        _LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss(name: str) -> Callable[..., Any]:
    """Return the policy objective registered under ``name``.

    Raises:
        KeyError: For an unknown name; the message lists the known ones. A peer's name whose
            formula is not published (:data:`UNPUBLISHED`, e.g. Tinker's ``stable_reinforce``)
            says why it is missing.
    """
    try:
        return _LOSSES[name]
    except KeyError:
        if name in UNPUBLISHED:
            raise KeyError(f"policy loss {name!r} is not available: {UNPUBLISHED[name]}") from None
        known = ", ".join(sorted(_LOSSES))
        raise KeyError(f"unknown policy loss {name!r}; known: {known}") from None


def available_policy_losses() -> list[str]:
    """Names of every registered policy objective, sorted."""
    return sorted(_LOSSES)


_BUILTIN: dict[str, Callable[..., Any]] = {
    "ppo": clipped_surrogate,
    "reinforce": reinforce_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gmpo": gmpo_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
    "luspo": luspo_loss,
    "vespo": vespo_loss,
    "dppo_tv": dppo_loss,
    "dro": dro_loss,
}
for _name, _fn in _BUILTIN.items():
    register_policy_loss(_name)(_fn)
# verl's two names for DPPO's trust regions; the signature stays inspectable (rl-algos reads it)
register_policy_loss("dppo_kl")(functools.partial(dppo_loss, divergence="kl"))
# Tinker's named objectives that are ours with fixed arguments (its `dro` is `dro`): the
# unclipped importance-sampled policy gradient, and cross-entropy (the advantages are the
# per-token weights). Tinker sums over tokens: aggregation="seq_mean_token_sum", normalizer=1.
register_policy_loss("importance_sampling")(
    functools.partial(clipped_surrogate, ratio_bounds=(0.0, math.inf))
)
register_policy_loss("cross_entropy")(functools.partial(reinforce_loss, form="logprob"))
