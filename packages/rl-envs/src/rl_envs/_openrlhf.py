"""OpenRLHF's ``reward_func(queries, prompts, labels)`` called on one step's samples.

OpenRLHF (``--remote_rm_url reward_func.py``) calls ``reward_func(queries, prompts, labels)``
positionally with, per sample, ``queries`` (the prompt and the completion as one text, decoded
from their ids with the special tokens kept), ``prompts`` (the rendered prompt text) and
``labels`` (the ``--label_key`` column). It returns the ``[N]`` rewards (a tensor, list or
array) or a dict whose ``"rewards"`` are used; its ``"scores"`` (OpenRLHF's dynamic filtering)
and ``"extra_logs"`` are not read here, which a warning says.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_envs.reward_functions import RewardSamples


def openrlhf_arguments(name: str, samples: RewardSamples) -> tuple[list[str], list[str], list[Any]]:
    """``(queries, prompts, labels)`` of the samples; labels are the answers (``--label_key``).

    Raises:
        ValueError: The samples carry no ``queries``/``prompt_texts`` (they were built without
            the token ids), naming the function.
    """
    if samples.queries is None or samples.prompt_texts is None:
        raise ValueError(
            f"reward function {name} is an OpenRLHF reward_func(queries, prompts, labels): it "
            "needs the samples' token-decoded `queries` and `prompt_texts`, which these "
            "RewardSamples do not carry; build them with both (ReasoningGym does)"
        )
    return list(samples.queries), list(samples.prompt_texts), list(samples.answers)


def openrlhf_rewards(name: str, out: Any) -> Any:
    """The rewards of a return value: the value itself, or a dict's ``"rewards"``."""
    if not isinstance(out, dict):
        return out
    if "rewards" not in out:
        raise ValueError(
            f"reward function {name} returned a dict without 'rewards' (keys {sorted(out)}); "
            "OpenRLHF reads the rewards from its 'rewards'"
        )
    unread = sorted(set(out) - {"rewards"})
    if unread:
        warnings.warn(
            f"reward function {name} returned {unread} next to 'rewards': only 'rewards' is "
            "used ('scores' drive OpenRLHF's dynamic filtering, 'extra_logs' its logs; log "
            "them from the function, or return the rewards alone)",
            stacklevel=2,
        )
    return out["rewards"]
