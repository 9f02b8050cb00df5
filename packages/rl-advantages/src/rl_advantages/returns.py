"""Monte-Carlo returns, GAE and Return Batch Normalization over steps (turns or tokens).

The step axis is the last one: turns ([N, K], each turn one action) or tokens ([N, T]); the
functions are the same on both. The valid steps of a row, in order, form its trajectory:
invalid steps (observation tokens, padding, turns not played) are skipped, not terminal (by
default: see ``gap`` below), and the trajectory ends after the row's last valid step. Whether
that end is a true terminal or a truncation is the caller's ``bootstrap``: pass the value
estimate of the state after the last step for truncated rows and 0 for terminated ones.

A *gap* is a run of invalid steps between two valid steps of a row (padding before the first or
after the last valid step is never a gap). ``gap`` chooses what it means: ``"skip"`` (default:
the steps around it are consecutive), ``"reset"`` (the valid step before it ends an episode: the
row splits into independent terminal episodes, AgileRL's token paths) or ``"carry"`` (each gap
step is a time step with reward 0 and value 0, discounted across: OpenRLHF).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from rl_advantages._checks import (
    NonFinite,
    as_float,
    as_mask,
    check_finite_values,
    check_ndim,
    check_nonnegative,
    check_same_shape,
    check_tensor,
    check_unit_interval,
    float_dtype,
    shape_str,
)
from rl_advantages.stats import masked_mean, masked_var

__all__ = ["AdvantagesReturns", "discounted_returns", "gae", "rebn"]

Gap = Literal["skip", "reset", "carry"]
GAPS = ("skip", "reset", "carry")


class AdvantagesReturns(NamedTuple):
    """Advantages and the returns (value targets) that go with them."""

    advantages: torch.Tensor
    """Same shape as the rewards; 0 at invalid steps."""
    returns: torch.Tensor
    """Same shape as the rewards; 0 at invalid steps."""


def steps(
    rewards: torch.Tensor, mask: torch.Tensor, nonfinite: NonFinite, name: str = "rewards"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate per-step rewards; return them as float, zero-filled at invalid steps; the mask."""
    check_tensor(name, rewards)
    check_ndim(name, rewards, 2, "[N, K] (or [N, T])")
    m = as_mask("mask", mask, name, rewards)
    m = check_finite_values(name, rewards, m, nonfinite)
    r = as_float(rewards)
    return torch.where(m, r, torch.zeros((), dtype=r.dtype, device=r.device)), m


def gap_steps(m: torch.Tensor, gap: Gap) -> tuple[torch.Tensor, torch.Tensor]:
    """``(carry, clear)`` [N, K] masks of the backward recursions under ``gap``.

    The carried quantities (next return, next value, next advantage) update at ``carry`` steps:
    the valid ones, plus the gap steps for ``"carry"`` (reward 0, value 0 there); they are
    cleared to 0 at ``clear`` steps: the gap steps for ``"reset"``, none otherwise.
    """
    if gap not in GAPS:
        raise ValueError(f"`gap` must be 'skip', 'reset' or 'carry', got {gap!r}")
    none = torch.zeros_like(m)
    if gap == "skip":
        return m, none
    seen_before = m.cumsum(-1) > 0
    seen_after = m.flip(-1).cumsum(-1).flip(-1) > 0
    gaps = ~m & seen_before & seen_after
    return (m | gaps, none) if gap == "carry" else (m, gaps)


def _bootstrap(bootstrap: torch.Tensor | None, rewards: torch.Tensor) -> torch.Tensor:
    """Validated [N] bootstrap values as float (zeros in ``rewards``' dtype when None)."""
    n = rewards.shape[0]
    if bootstrap is None:
        return rewards.new_zeros(n)
    check_tensor("bootstrap", bootstrap)
    if bootstrap.shape != (n,):
        raise ValueError(
            f"`bootstrap` must have shape [N] = [{n}] like the rows of `rewards` "
            f"{shape_str(rewards)}, got {shape_str(bootstrap)}"
        )
    if not bool(torch.isfinite(bootstrap).all()):
        raise ValueError("`bootstrap` holds non-finite values; pass 0 for terminated rows")
    return as_float(bootstrap)


def discounted_returns(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    bootstrap: torch.Tensor | None = None,
    *,
    gap: Gap = "skip",
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Monte-Carlo discounted returns over the valid steps of each row.

    .. math:: G_j = r_j + \gamma\, G_{j'}, \qquad G_{\text{end}} = b_n

    where :math:`j'` is the next valid step of the row and :math:`b_n` the bootstrap value
    after the row's last valid step (0 when ``bootstrap`` is None: terminal). This is the
    REINFORCE return (Williams 1992; Sutton & Barto eq. 3.8) used turn-level by AgileRL's
    LLMREINFORCE and token-level by REINFORCE++ (arXiv 2501.03262, eq. 4 of Sec. 3).

    Across a gap (invalid steps between two valid ones) ``gap`` chooses :math:`G_{j'}`:
    ``"skip"`` the return at the next valid step (observation tokens are not actions, so they
    cost no discount; verl's ``reinforce_plus_plus`` and GAE); ``"reset"`` 0 (the valid step
    before the gap ends a terminal episode: AgileRL's token path); ``"carry"``
    :math:`\gamma^{g} G_{j'}` over the :math:`g` gap steps (each a step with reward 0:
    OpenRLHF). All three agree on rows without a gap, and for ``gamma = 1`` ``"skip"`` and
    ``"carry"`` agree everywhere.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * OpenRLHF 0.11.2: equal with ``gap="carry"`` (``get_cumulative_returns`` discounts every step,
      masked rewards 0; checked through ``reinforce_plus_plus``).
    * AgileRL 2.58.0: equal with ``gap="reset"`` (token path: ``next_mask`` zeroes the carried
      return at a gap; checked through ``rebn``); the turn-level returns are ours.
    * No counterpart: verl, TRL, Liger.

    Args:
        rewards: [N, K] reward per step (turns, or tokens [N, T]).
        mask: [N, K] bool, True at valid steps.
        gamma: Discount in [0, 1].
        bootstrap: [N] value after each row's last valid step, or None (all terminal).
        gap: ``"skip"``, ``"reset"`` or ``"carry"``: what a gap between valid steps means.
        nonfinite: ``"raise"`` on a NaN/inf reward at a valid step, or ``"mask"`` to drop it.

    Returns:
        [N, K] returns, 0 at invalid steps (and on rows with no valid step).
    """
    r, m = steps(rewards, mask, nonfinite)
    return discount(r, m, gamma, bootstrap, gap)


def discount(
    r: torch.Tensor,
    m: torch.Tensor,
    gamma: float,
    bootstrap: torch.Tensor | None = None,
    gap: Gap = "skip",
) -> torch.Tensor:
    """The recursion of :func:`discounted_returns` on validated, zero-filled rewards."""
    check_unit_interval("gamma", gamma)
    carry, clear = gap_steps(m, gap)
    nxt = _bootstrap(bootstrap, r)
    dtype = float_dtype(r, nxt)
    r, nxt = r.to(dtype), nxt.to(dtype)
    out = torch.zeros_like(r)
    for j in range(r.shape[1] - 1, -1, -1):
        g = r[:, j] + gamma * nxt
        out[:, j] = torch.where(m[:, j], g, 0.0)
        nxt = torch.where(carry[:, j], g, torch.where(clear[:, j], 0.0, nxt))
    return out


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lmbda: float,
    bootstrap: torch.Tensor | None = None,
    *,
    gap: Gap = "skip",
    nonfinite: NonFinite = "raise",
) -> AdvantagesReturns:
    r"""Generalized Advantage Estimation (Schulman et al., arXiv 1506.02438, eqs. 11-16).

    .. math:: \delta_j = r_j + \gamma V_{j'} - V_j, \qquad
              \hat A_j = \delta_j + \gamma\lambda \hat A_{j'}, \qquad R_j = \hat A_j + V_j

    over the valid steps of each row, :math:`j'` being the next valid step; after the last
    valid step :math:`V = b_n` (``bootstrap``, default 0: terminal) and :math:`\hat A = 0`.
    Turn-level (each turn one action, ``[N, K]``, as AgileRL's LLMPPO) or token-level
    (``[N, T]``, as TRL/verl PPO, where observation tokens are skipped, not terminal).
    ``lmbda = 1`` gives discounted returns minus values; ``gamma = 0`` the one-step TD error.

    Across a gap (invalid steps between two valid ones) ``gap`` chooses :math:`V_{j'}` and
    :math:`\hat A_{j'}`: ``"skip"`` those of the next valid step; ``"reset"`` 0 and 0 (the
    valid step before the gap is terminal: each segment is its own episode); ``"carry"`` the
    recursion runs through the gap steps with :math:`r = V = 0` there. All three agree on rows
    without a gap.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``whiten(gae(...).advantages, mask)``: verl whitens inside; gaps
      skipped as ours (``gap="skip"``, the default).
    * OpenRLHF 0.11.2: equal with ``gap="carry"`` (a masked gap is a step with reward 0, value 0),
      ``whiten(..., unbiased=False, eps=0)`` of the advantages.
    * AgileRL 2.58.0: equal with ``gap="reset"`` (token path ``_compute_gae_returns_token``: a gap
      ends the episode, its ``next_mask`` zeroes the next value and ``last_gae``), ``whiten(...)``
      of the advantages unless ``whiten_advantages=False``; its turn-level GAE is ours.
    * No counterpart: TRL (TRL's PPO is experimental; not compared), Liger.

    Args:
        rewards: [N, K] reward per step.
        values: [N, K] critic value per step (NaN allowed at invalid steps).
        mask: [N, K] bool, True at valid steps.
        gamma: Discount in [0, 1].
        lmbda: GAE lambda in [0, 1].
        bootstrap: [N] value after each row's last valid step, or None (terminal).
        gap: ``"skip"``, ``"reset"`` or ``"carry"``: what a gap between valid steps means.
        nonfinite: ``"raise"`` on a NaN/inf reward at a valid step, or ``"mask"`` to drop it.

    Returns:
        ``AdvantagesReturns(advantages [N, K], returns [N, K])``, 0 at invalid steps.
    """
    r, m = steps(rewards, mask, nonfinite)
    check_tensor("values", values)
    check_same_shape("values", values, "rewards", rewards)
    check_unit_interval("gamma", gamma)
    check_unit_interval("lmbda", lmbda)
    carry, clear = gap_steps(m, gap)
    next_value = _bootstrap(bootstrap, r)
    dtype = float_dtype(r, values, next_value)
    r, next_value = r.to(dtype), next_value.to(dtype)
    v = torch.where(m, values.to(dtype), 0.0)
    if not bool(torch.isfinite(v).all()):
        raise ValueError("`values` holds non-finite values at valid steps")
    next_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(r)
    for j in range(r.shape[1] - 1, -1, -1):
        delta = r[:, j] + gamma * next_value - v[:, j]
        a = delta + gamma * lmbda * next_adv
        adv[:, j] = torch.where(m[:, j], a, 0.0)
        step, cut = carry[:, j], clear[:, j]
        next_adv = torch.where(step, a, torch.where(cut, 0.0, next_adv))
        next_value = torch.where(step, v[:, j], torch.where(cut, 0.0, next_value))
    return AdvantagesReturns(adv, torch.where(m, adv + v, 0.0))


def rebn(
    returns: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, unbiased: bool = True
) -> torch.Tensor:
    r"""Return Batch Normalization: z-score returns over every valid cell of the batch.

    .. math:: \hat A_{n,k} = \frac{G_{n,k} - \mu}{\sigma + \epsilon}, \quad
              \mu, \sigma \text{ over all valid } (n, k)

    The statistics are taken over the whole batch, not per group (GEM, arXiv 2510.01051,
    Sec. 3, "ReBN"; AgileRL's LLMREINFORCE). Fewer than two valid cells give all zeros: there
    is no baseline to compare against. A constant batch gives zeros too, never NaN.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * AgileRL 2.58.0: equal: REINFORCE's Return Batch Normalization; its token path
      ``_compute_rebn_advantages_token`` is ``rebn(discounted_returns(..., gap="reset"), mask)``.
    * No counterpart: verl, OpenRLHF, TRL, Liger.

    Args:
        returns: [N, K] returns per (sequence, turn) (or [N, T] per token).
        mask: [N, K] bool, True at valid cells.
        eps: Added to the standard deviation.
        unbiased: Standard deviation with ``n - 1`` (True, AgileRL) or ``n``.

    Returns:
        [N, K] normalised returns, 0 at invalid cells.
    """
    check_tensor("returns", returns)
    check_ndim("returns", returns, 2, "[N, K]")
    m = as_mask("mask", mask, "returns", returns)
    check_nonnegative("eps", eps)
    g = torch.where(m, as_float(returns), 0.0)
    if not bool(torch.isfinite(g).all()):
        raise ValueError("`returns` holds non-finite values at valid cells")
    mean = masked_mean(g, m)
    std = masked_var(g, m, unbiased=unbiased).sqrt()
    z = (g - mean) / (std + eps)
    return torch.where(m & (m.sum() >= 2) & (std > 0), z, 0.0)
