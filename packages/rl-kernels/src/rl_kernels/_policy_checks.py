"""Argument validation of ``fused_policy_loss``: the objective, its options and the inputs.

Private to :mod:`rl_kernels.policy`. The objective must be one of :data:`FUSED_OBJECTIVES`
(token level); the KL, entropy, correction and chunking options are checked whether or not
they are used; the per-token inputs must match ``targets`` in shape and the log-probs be
floating point (``ref_logprobs`` finite at valid tokens). The generic checks shared by all the
kernels are in :mod:`rl_kernels._checks`; every error names the argument.
"""

from __future__ import annotations

from typing import Any

import torch
from rl_losses.registry import UNPUBLISHED

from rl_kernels._checks import check_chunk_rows, check_finite, check_float, shape_str

#: Token-level objectives of rl-losses that the fused path supports (they act per token).
FUSED_OBJECTIVES: tuple[str, ...] = (
    "ppo", "cispo", "reinforce", "sapo", "dppo_tv", "dppo_kl", "dro", "importance_sampling",
    "cross_entropy",
)  # fmt: skip


def _check_tokens(name: str, x: torch.Tensor | None, ref: torch.Tensor) -> None:
    if x is not None and x.shape != ref.shape:
        raise ValueError(
            f"`{name}` has shape {shape_str(x)} but `targets` has shape {shape_str(ref)}; "
            "they must match"
        )


def _check_options(
    objective: str,
    objective_kwargs: dict[str, Any],
    kl_coef: float,
    entropy_coef: float,
    ref_logprobs: torch.Tensor | None,
    chunk_rows: int | None,
    correction: tuple[str, str, float, float | None],
) -> None:
    """The options of :func:`fused_policy_loss`; pops an explicit ``level="token"``."""
    if objective not in FUSED_OBJECTIVES:
        why = UNPUBLISHED.get(objective)
        raise ValueError(
            f"`objective` {objective!r} is not fused: {why}"
            if why
            else f"`objective` must be one of {FUSED_OBJECTIVES} (token-level objectives); got "
            f"{objective!r}. For turn/trajectory-level ones use fused_logprobs + rl_losses."
        )
    level = objective_kwargs.pop("level", "token")
    if level != "token":
        raise ValueError(
            f"`level` {level!r} is not fused: fused_policy_loss is token level (each token is "
            "its own importance-sampling unit). For turn or trajectory level, compute the "
            "log-probs with rl_kernels.fused_logprobs and pass them to the rl_losses objective "
            "with its `level`"
        )
    if not kl_coef >= 0 or not entropy_coef >= 0:
        raise ValueError(
            f"`kl_coef` and `entropy_coef` must be >= 0, got {kl_coef}, {entropy_coef}"
        )
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError(
            f"`ref_logprobs` is required when `kl_coef` > 0 (got kl_coef={kl_coef}): pass the "
            "reference policy's [N, T] log-probs, or kl_coef=0 for no KL term"
        )
    # the correction options are checked whether or not a correction is computed
    level_c, mode_c, cap, lower = correction
    for name, value, choices in (
        ("correction_level", level_c, ("token", "sequence")),
        ("correction_mode", mode_c, ("truncate", "mask")),
    ):
        if value not in choices:
            raise ValueError(f"`{name}` must be one of {choices}, got {value!r}")
    if not cap > 0:
        raise ValueError(f"`correction_cap` must be > 0, got {cap}")
    if lower is not None and not lower < cap:
        raise ValueError(f"`correction_lower` must be < `correction_cap` = {cap}, got {lower}")
    check_chunk_rows(chunk_rows)


def _check_log_probs(
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    sampling_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
) -> None:
    """Floating-point inputs, and ``ref_logprobs`` finite at valid tokens (as ``kl_penalty``).

    The chunks run the policy objective, which checks the others, but compute the KL with
    ``kl_estimate``, which has no mask to check against.
    """
    check_float("advantages", advantages)
    for name, x in (
        ("old_logprobs", old_logprobs),
        ("ref_logprobs", ref_logprobs),
        ("sampling_logprobs", sampling_logprobs),
    ):
        if x is not None:
            check_float(name, x)
    if ref_logprobs is not None:
        check_finite("ref_logprobs", ref_logprobs, mask)
