"""Group-relative advantages: GRPO, Dr. GRPO, Lite-PPO, RLOO, GPG, OPO, pass@k, MaxRL, ReMax.

Rows come as B contiguous groups of G samples of the same prompt: rows ``[b*G, (b+1)*G)`` are
group b, so ``rewards`` [N] reshapes to [B, G]. An optional ``mask`` [N] marks the samples that
count (False for a sample whose reward is missing); masked samples take no part in any group
statistic and get advantage 0. A group with fewer than two valid members has no baseline and
gives 0 to its members. verl differs, deliberately not followed: a lone sample's baseline is 0
there. Its ``grpo`` and ``grpo_vectorized`` take mean 0 and std 1 (``grpo_vectorized`` through
``group_mean_std``'s singleton fallback), so A = r / (1 + eps); its loop ``rloo`` and ``opo``
leave A = r and ``gpg`` A = alpha * r / f_norm. Only verl's ``rloo_vectorized`` gives 0 as we do.
"""

from __future__ import annotations

from typing import Literal

import torch

from rl_advantages._checks import (
    NonFinite,
    as_float,
    as_mask,
    check_finite_values,
    check_group_size,
    check_ndim,
    check_nonnegative,
    check_same_shape,
    check_tensor,
    float_dtype,
)
from rl_advantages.returns import AdvantagesReturns, discount, steps
from rl_advantages.stats import masked_mean, masked_sum, masked_var

__all__ = [
    "dynamic_sampling_mask",
    "gpg",
    "group_relative",
    "group_relative_per_turn",
    "max_rl",
    "opo",
    "pass_at_k",
    "remax",
    "rloo",
]

GroupScale = Literal["group", "batch", "none"]


def _grouped(
    rewards: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None,
    nonfinite: NonFinite,
    name: str = "rewards",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate [N] rewards; return float zero-filled rewards and the mask, both [B, G]."""
    check_tensor(name, rewards)
    check_ndim(name, rewards, 1, "[N]")
    b = check_group_size(name, rewards.shape[0], group_size)
    m = as_mask("mask", mask, name, rewards)
    m = check_finite_values(name, rewards, m, nonfinite)
    x = as_float(rewards)
    r = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return r.view(b, group_size), m.view(b, group_size)


def _degenerate(r: torch.Tensor, m: torch.Tensor, dim: int) -> torch.Tensor:
    """True where the valid entries along ``dim`` are fewer than two or all equal."""
    hi = torch.where(m, r, float("-inf")).amax(dim=dim, keepdim=True)
    lo = torch.where(m, r, float("inf")).amin(dim=dim, keepdim=True)
    return (m.sum(dim=dim, keepdim=True) < 2) | (hi == lo)


def _group_normalise(
    r: torch.Tensor,
    m: torch.Tensor,
    dim: int,
    scale: GroupScale,
    unbiased: bool,
    eps: float,
) -> torch.Tensor:
    """Centre ``r`` on its group mean along ``dim`` and scale it; 0 for degenerate groups."""
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"`scale` must be 'group', 'batch' or 'none', got {scale!r}")
    check_nonnegative("eps", eps)
    centred = r - masked_mean(r, m, dim=dim, keepdim=True)
    if scale == "group":
        std = masked_var(r, m, dim=dim, keepdim=True, unbiased=unbiased).sqrt()
        centred = centred / (std + eps)
    elif scale == "batch":
        std = masked_var(r, m, unbiased=unbiased).sqrt()
        centred = centred / (std + eps)
    keep = m & ~_degenerate(r, m, dim)
    return torch.where(keep, centred, torch.zeros((), dtype=r.dtype, device=r.device))


def group_relative(
    rewards: torch.Tensor,
    group_size: int,
    scale: GroupScale = "group",
    unbiased: bool = True,
    eps: float = 1e-6,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Group-relative advantage of each sample against the other samples of its prompt.

    .. math:: \hat A_i = \frac{r_i - \operatorname{mean}(r_{\text{group}(i)})}{s + \epsilon}

    with :math:`s` chosen by ``scale``:

    * ``"group"``: the group's standard deviation. GRPO (DeepSeekMath, arXiv 2402.03300,
      Sec. 4.1.2, outcome supervision).
    * ``"batch"``: the standard deviation of all valid rewards of the batch, keeping the
      group mean. Lite-PPO (arXiv 2508.08221, Sec. 4.1), more robust when a group's rewards
      are nearly equal.
    * ``"none"``: no scaling, :math:`\hat A_i = r_i - \text{mean}`. Dr. GRPO
      (arXiv 2503.20783, Sec. 3.2), which removes the question-difficulty bias of the std.

    A group whose valid rewards are all equal (or with fewer than two valid members) gives
    exactly 0, never NaN. Conventions: ``unbiased=True`` (n - 1) matches TRL, verl, OpenRLHF
    and AgileRL (all use ``torch.std``); ``eps`` is added to the std, outside the square root,
    as all of them do (TRL 1e-4, verl 1e-6, OpenRLHF 1e-9, AgileRL 1e-8).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``eps=1e-6`` (default); ``scale="none"`` for
      ``norm_adv_by_std_in_grpo=False``. Group of one: verl's ``grpo`` and ``grpo_vectorized`` take
      mean 0, std 1 (A = r / (1 + eps)), ours 0 (differs by design: no baseline).
    * OpenRLHF 0.11.2: equal with ``group_norm``: ``eps=1e-9``; ``dr_grpo``: ``scale="none"``.
    * TRL 1.16.0: equal with ``eps=1e-4``; ``scale_rewards``: ``scale="batch"`` / ``"none"``.
    * AgileRL 2.58.0: equal with ``eps=1e-8``; ``adv_norm="mean_only"`` is ``scale="none"``.
    * No counterpart: Liger (advantages come from the trainer).

    Args:
        rewards: [N] scalar reward per sequence, N = B*G, groups contiguous.
        group_size: G >= 2.
        scale: ``"group"``, ``"batch"`` or ``"none"``.
        unbiased: Standard deviation with n - 1 (True) or n.
        eps: Added to the standard deviation.
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] advantages, 0 for masked samples.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    return _group_normalise(r, m, 1, scale, unbiased, eps).reshape(-1)


def group_relative_per_turn(
    rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    group_size: int,
    scale: Literal["group", "none"] = "group",
    unbiased: bool = True,
    eps: float = 1e-6,
    fallback: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Per-turn group-relative advantages for multi-turn rollouts.

    For each turn k, the statistics are over the members of the group that played turn k:

    .. math:: \hat A_{i,k} = \frac{r_{i,k} - \operatorname{mean}_{j \in g(i),\, k \text{ played}}
              r_{j,k}}{\operatorname{std}_{j \in g(i),\, k \text{ played}} r_{j,k} + \epsilon}

    GRPO's group baseline (arXiv 2402.03300) applied turn by turn, as AgileRL's
    ``advantage_granularity="turn"``. A (group, turn) with fewer than two players has no
    baseline: its played cells get ``fallback[n]`` (for example the trajectory-level
    ``group_relative`` advantage, AgileRL's ``turn_advantage_trajectory_fallback``) or 0.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * AgileRL 2.58.0: equal with ``fallback=`` the trajectory advantage (AgileRL's lone-player
      rule), ``eps=1e-8``.
    * No counterpart: verl, OpenRLHF, TRL, Liger.

    Args:
        rewards: [N, K] reward per (sequence, turn).
        turn_mask: [N, K] bool, True where sequence n played turn k.
        group_size: G >= 2; rows come in contiguous groups.
        scale: ``"group"`` (divide by the std) or ``"none"`` (centre only).
        unbiased: Standard deviation with n - 1 (True) or n.
        eps: Added to the standard deviation.
        fallback: [N] advantage for played cells without a baseline, or None (0).
        nonfinite: ``"raise"`` on a NaN/inf reward in a played cell, or ``"mask"``.

    Returns:
        [N, K] advantages, 0 where the turn was not played.
    """
    check_tensor("rewards", rewards)
    check_ndim("rewards", rewards, 2, "[N, K]")
    m = as_mask("turn_mask", turn_mask, "rewards", rewards)
    m = check_finite_values("rewards", rewards, m, nonfinite)
    if scale not in ("group", "none"):
        raise ValueError(f"`scale` must be 'group' or 'none' per turn, got {scale!r}")
    n, k = rewards.shape
    b = check_group_size("rewards", n, group_size)
    if fallback is not None:
        check_tensor("fallback", fallback)
        if fallback.shape != (n,):
            raise ValueError(f"`fallback` must have shape [N] = [{n}], got {list(fallback.shape)}")
        if not bool(torch.isfinite(fallback).all()):
            raise ValueError(
                "`fallback` holds non-finite values; pass finite advantages (e.g. "
                "`group_relative` of the trajectory rewards) or None for 0"
            )
    dtype = float_dtype(rewards, fallback)
    zero = torch.zeros((), dtype=dtype, device=rewards.device)
    r = torch.where(m, rewards.to(dtype), zero).view(b, group_size, k)
    mg = m.view(b, group_size, k)
    adv = _group_normalise(r, mg, 1, scale, unbiased, eps)
    if fallback is not None:
        lonely = mg & (mg.sum(dim=1, keepdim=True) < 2)
        fb = fallback.to(dtype).view(b, group_size, 1).expand_as(adv)
        adv = torch.where(lonely, fb, adv)
    return adv.reshape(n, k)


def rloo(
    rewards: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""REINFORCE Leave-One-Out advantage (Ahmadian et al., arXiv 2402.14740, eq. 5).

    .. math:: \hat A_i = r_i - \frac{1}{n_g - 1}\sum_{j \in g(i),\, j \ne i} r_j
              = \frac{n_g}{n_g - 1}\,(r_i - \bar r_g)

    over the valid members of the group (:math:`n_g` of them). The advantages of a group sum
    to zero. Groups with fewer than two valid members give 0, as TRL's RLOOTrainer and verl's
    ``rloo_vectorized`` do. verl's ``compute_rloo_outcome_advantage`` (``rloo``) leaves
    :math:`A = r` for a group of one (deliberately not followed: a lone sample has no
    baseline, and its raw reward is not an advantage).

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``rloo`` and ``rloo_vectorized``. Group of one: verl's loop ``rloo`` leaves
      A = r, ours 0 (differs by design: no baseline); ``rloo_vectorized`` gives 0 as ours.
    * OpenRLHF 0.11.2: equal: ``rloo`` estimator (gamma forced to 1).
    * TRL 1.16.0: equal: RLOOTrainer's leave-one-out baseline.
    * No counterpart: Liger, AgileRL.

    Args:
        rewards: [N] scalar reward per sequence, groups contiguous.
        group_size: G >= 2.
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] advantages, 0 for masked samples.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    count = m.sum(dim=1, keepdim=True).to(r.dtype)
    total = masked_sum(r, m, dim=1, keepdim=True)
    adv = r - (total - r) / (count - 1).clamp(min=1)
    return torch.where(m & (count >= 2), adv, 0.0).reshape(-1)


def gpg(
    rewards: torch.Tensor,
    group_size: int,
    alpha: Literal["valid_groups", "nonzero_rewards"] | float = "valid_groups",
    f_norm: float = 1.0,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Group Policy Gradient advantage (Chu et al., arXiv 2504.02546, eqs. 7-8).

    .. math:: \hat A_i = \alpha\,\frac{r_i - \operatorname{mean}(r_{\text{group}(i)})}{F_{norm}}

    ``alpha`` rescales for the samples that carry no gradient:

    * ``"valid_groups"`` (the paper's :math:`B / (B - M)`): valid samples divided by the valid
      samples in groups whose rewards are not all equal.
    * ``"nonzero_rewards"`` (verl's ``gpg``): valid samples divided by the number of valid
      samples with a non-zero reward.
    * a float: used as is.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``alpha="nonzero_rewards"``.
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

    Args:
        rewards: [N] scalar reward per sequence, groups contiguous.
        group_size: G >= 2.
        alpha: Rescaling rule or constant.
        f_norm: Normaliser :math:`F_{norm}` (> 0; 1 in the paper's main runs and in verl).
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] advantages, 0 for masked samples and degenerate groups.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    if not f_norm > 0:
        raise ValueError(f"`f_norm` must be > 0, got {f_norm}")
    centred = _group_normalise(r, m, 1, "none", True, 0.0)
    n_valid = m.sum().to(r.dtype)
    if alpha == "valid_groups":
        informative = (m & ~_degenerate(r, m, 1)).sum().to(r.dtype)
        a = torch.where(informative > 0, n_valid / informative.clamp(min=1), 0.0)
    elif alpha == "nonzero_rewards":
        a = n_valid / (m & (r != 0)).sum().to(r.dtype).clamp(min=1)
    elif isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        a = torch.tensor(float(alpha), dtype=r.dtype, device=r.device)
    else:
        raise ValueError(
            f"`alpha` must be 'valid_groups', 'nonzero_rewards' or a number, got {alpha!r}"
        )
    return (a * centred / f_norm).reshape(-1)


def max_rl(
    rewards: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Maximum Likelihood RL's advantage (Tajwar et al., arXiv 2602.02710).

    .. math:: \hat A_i = \frac{r_i - \bar r_{g(i)}}{\bar r_{g(i)}}, \qquad
              \bar r_{g} = \operatorname{mean}(r_{\text{group}})

    Per sample, :math:`N` times the weight of the control-variate estimator
    :math:`\sum_i (r_i / K - 1 / N) S_i` (eq. 11 of the paper's source, ``paper.tex`` in the
    authors' Zanette-Labs/MaxRL repository; :math:`K` successes of :math:`N` rollouts, the
    group mean :math:`K / N`) and of its Algorithm 1, both dropped where :math:`K = 0`.

    The group-centred reward divided by the group mean instead of the standard deviation. For
    rewards in :math:`\{0, 1\}` the group mean estimates the pass rate :math:`p(x)`, so a
    prompt weighs :math:`1/p(x)`: the policy gradient is unbiased for a truncation of the
    maximum-likelihood objective :math:`\log p(x)` whose order grows with the group size G
    (REINFORCE at G = 1, maximum likelihood as G grows). The rewards are meant to be
    non-negative (canonically binary); a group whose mean is not positive gets 0, as do groups
    with fewer than two valid members and masked samples.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * prime-rl: equal: ``MaxRLAlgorithm`` (``max_rl``), read, not run.
    * No counterpart: verl, OpenRLHF, TRL, Liger, AgileRL.

    Args:
        rewards: [N] scalar reward per sequence, groups contiguous.
        group_size: G >= 2.
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] advantages.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    count = m.sum(dim=1, keepdim=True)
    mean = r.sum(dim=1, keepdim=True) / count.clamp(min=1).to(r.dtype)
    keep = m & (count >= 2) & (mean > 0)
    adv = (r - mean) / torch.where(mean > 0, mean, torch.ones_like(mean))
    return torch.where(keep, adv, torch.zeros((), dtype=r.dtype, device=r.device)).reshape(-1)


def opo(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""On-Policy RL with Optimal reward baseline (Hao et al., arXiv 2505.23585, eq. 6).

    .. math:: \hat A_i = r_i - \frac{\sum_{j \in g(i)} |o_j|\, r_j}{\sum_{j \in g(i)} |o_j|}

    The length-weighted group mean is the variance-minimising baseline under the paper's
    assumption that gradient norms grow with the sequence length.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal with ``mask=lengths > 0`` (verl keeps an empty row at weight 0).
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

    Args:
        rewards: [N] scalar reward per sequence, groups contiguous.
        lengths: [N] completion length |o_i| (> 0 for valid samples).
        group_size: G >= 2.
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] advantages, 0 for masked samples and for groups with fewer than two valid members.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    check_tensor("lengths", lengths)
    check_same_shape("lengths", lengths, "rewards", rewards)
    w = torch.where(m, lengths.view_as(r).to(r.dtype), 0.0)
    if bool((m & ~(w > 0)).any()):
        raise ValueError("`lengths` must be > 0 for every valid sample")
    baseline = (w * r).sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True).clamp(min=1e-30)
    keep = m & (m.sum(dim=1, keepdim=True) >= 2)
    return torch.where(keep, r - baseline, 0.0).reshape(-1)


def pass_at_k(
    rewards: torch.Tensor,
    group_size: int,
    scale: Literal["group", "none"] = "group",
    eps: float = 1e-6,
    unbiased: bool = True,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""Pass@k advantage: only each group's best sample learns (arXiv 2503.19595).

    .. math:: \hat A_{i^*} = \frac{r_{(1)} - r_{(2)}}{\sigma_g + \epsilon}, \qquad
              \hat A_i = 0 \;(i \ne i^*)

    where :math:`i^*` is the group's best valid sample (the first on ties, so a tie gives 0),
    :math:`r_{(1)}, r_{(2)}` the largest and second-largest valid rewards, and the division
    happens only with ``scale="group"``.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``grpo_passk``.
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

    Args:
        rewards: [N] scalar reward per sequence, groups contiguous.
        group_size: G >= 2.
        scale: ``"group"`` (divide by the group std, verl's default) or ``"none"``.
        eps: Added to the standard deviation.
        unbiased: Standard deviation with n - 1 (True) or n.
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] advantages: non-zero only at each group's best sample.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    if scale not in ("group", "none"):
        raise ValueError(f"`scale` must be 'group' or 'none', got {scale!r}")
    check_nonnegative("eps", eps)
    ranked = torch.where(m, r, float("-inf"))
    top = ranked.topk(2, dim=1).values
    gap = top[:, :1] - top[:, 1:]
    if scale == "group":
        std = masked_var(r, m, dim=1, keepdim=True, unbiased=unbiased).sqrt()
        gap = torch.where(std > 0, gap / (std + eps), 0.0)
    best = torch.zeros_like(m).scatter(1, ranked.argmax(dim=1, keepdim=True), True)
    keep = best & m & (m.sum(dim=1, keepdim=True) >= 2)
    return torch.where(keep, gap.expand_as(r), 0.0).reshape(-1)


def remax(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    baselines: torch.Tensor,
    *,
    nonfinite: NonFinite = "raise",
) -> AdvantagesReturns:
    r"""ReMax advantage (Li et al., arXiv 2310.10505, Algorithm 1).

    .. math:: G_t = \sum_{k \ge t} r_k, \qquad \hat A_t = G_t - b

    with :math:`b` the reward of the greedy completion of the same prompt (``baselines``).
    With the reward on the last token only, :math:`\hat A_t = R - b` on every token.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: ``remax`` (valid tokens; verl leaves returns at masked tokens).
    * No counterpart: OpenRLHF, TRL, Liger, AgileRL.

    Args:
        token_rewards: [N, T] reward per token.
        mask: [N, T] bool, True at valid (generated) tokens.
        baselines: [N] greedy-rollout reward per sequence.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to drop it.

    Returns:
        ``AdvantagesReturns(advantages [N, T], returns [N, T])``, 0 at invalid tokens.
    """
    r, m = steps(token_rewards, mask, nonfinite, name="token_rewards")
    check_tensor("baselines", baselines)
    if baselines.shape != (token_rewards.shape[0],):
        raise ValueError(
            f"`baselines` must have shape [N] = [{token_rewards.shape[0]}], got "
            f"{list(baselines.shape)}"
        )
    if not bool(torch.isfinite(baselines).all()):
        raise ValueError("`baselines` holds non-finite values")
    dtype = float_dtype(r, baselines)
    returns = discount(r.to(dtype), m, 1.0)
    adv = torch.where(m, returns - baselines[:, None].to(dtype), 0.0)
    return AdvantagesReturns(adv, returns)


def dynamic_sampling_mask(
    rewards: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None = None,
    *,
    nonfinite: NonFinite = "raise",
) -> torch.Tensor:
    r"""DAPO dynamic sampling: keep only groups whose rewards are not all equal.

    DAPO (arXiv 2503.14476, eq. 11) constrains :math:`0 < |\{o_i : \text{correct}\}| < G`: a
    group that is all right or all wrong has zero group-relative advantage and only dilutes
    the batch. Generalised to real-valued rewards: keep a group iff its valid rewards are not
    all equal.

    Peers (the call that reproduces each; the checked cases are in
    ``docs/conformance.md``):

    * verl 0.9.1: equal: DAPO recipe: keep groups with std > 0.
    * OpenRLHF 0.11.2: differs by design: OpenRLHF keeps groups whose mean lies in a range; ours
      keeps groups whose valid rewards are not all equal (DAPO, arXiv 2503.14476, eq. 11).
    * AgileRL 2.58.0: equal: ``filter_zero_adv``.
    * No counterpart: TRL (not supported in TRL), Liger.

    Args:
        rewards: [N] scalar reward per sequence, groups contiguous.
        group_size: G >= 2.
        mask: [N] bool, True for samples that count; None means all.
        nonfinite: ``"raise"`` on a NaN/inf reward, or ``"mask"`` to treat it as masked.

    Returns:
        [N] bool, True for every sample of a kept group (valid or not), False elsewhere;
        groups with fewer than two valid members are dropped.
    """
    r, m = _grouped(rewards, group_size, mask, nonfinite)
    return (~_degenerate(r, m, 1)).expand_as(r).reshape(-1)
