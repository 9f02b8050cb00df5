"""Float64 loop references for every ``rl_advantages`` estimator.

Written directly from ``/work/spec/rl_advantages_spec.md``, independently of the implementation:
plain Python loops over rows / steps / groups on Python floats (inputs are turned into nested
lists first), no vectorised tricks. ``ref_<name>`` takes the same arguments, with the same keyword
names, as ``rl_advantages.<name>`` (minus ``nonfinite``) and returns float64 tensors (bool tensors
for masks). Invalid positions are never read except to check that they are invalid.

Readings of the spec chosen here where it is not explicit (see also the notes at each function):

* ``group_relative``: a group whose valid rewards are all equal gets exactly 0, for every scale.
  ``scale="batch"``: the batch std is over ALL valid samples, including those in groups with fewer
  than two valid members.
* ``gpg(alpha="nonzero_rewards")``: ``N`` is the number of rows (the glossary's ``N``); nonzero
  rewards are counted over valid samples only (invalid values never influence any output).
* ``opo``: no special case for groups with one valid member (``r - r = 0`` falls out).
* ``pass_at_k``: a group with fewer than two valid members gets 0 (there is no second best).
* ``group_relative_per_turn``: a (group, turn) whose players' rewards are all equal gets 0.
* ``dynamic_sampling_mask``: "True for every member of a group whose valid rewards are not all
  equal" conflicts with "outputs are exactly 0 at invalid positions" for an invalid member of a
  kept group. The reference follows the function's own clause (every member, invalid ones too);
  the tests compare valid positions only.
* ``kl_in_reward(kl=None)``: no KL term, only the score on the last valid token.
* ``gap`` (``discounted_returns``, ``gae``, ``reinforce_plus_plus``; issue 44): each row is cut
  into episodes first (``_episodes``), then each episode runs the plain recursion:
  ``"skip"`` one episode of the valid steps; ``"reset"`` one terminal episode per run of
  consecutive valid steps (the bootstrap goes to the last); ``"carry"`` one episode of every step
  from the first valid to the last, with reward 0 and value 0 at the invalid ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

F64 = torch.float64

__all__ = [
    "ref_broadcast_to_tokens",
    "ref_discounted_returns",
    "ref_dynamic_sampling_mask",
    "ref_gae",
    "ref_gpg",
    "ref_group_relative",
    "ref_group_relative_per_turn",
    "ref_kl_in_reward",
    "ref_masked_mean",
    "ref_masked_sum",
    "ref_masked_var",
    "ref_opo",
    "ref_overlong_penalty",
    "ref_pass_at_k",
    "ref_pool_to_turns",
    "ref_rebn",
    "ref_reinforce_plus_plus",
    "ref_reinforce_plus_plus_baseline",
    "ref_remax",
    "ref_rloo",
]


# --------------------------------------------------------------------------- small helpers


def _lst(x: torch.Tensor) -> list:
    """Nested Python list of a tensor (float64 for floating tensors)."""
    x = x.detach().cpu()
    if x.is_floating_point():
        x = x.to(F64)
    return x.tolist()


def _mean(xs: Sequence[float]) -> float:
    total = 0.0
    for v in xs:
        total += v
    return total / len(xs)


def _var(xs: Sequence[float], unbiased: bool) -> float:
    """sum((x - mean)^2) / (n - 1) if unbiased else / n (caller checks n)."""
    m = _mean(xs)
    ss = 0.0
    for v in xs:
        ss += (v - m) * (v - m)
    return ss / (len(xs) - 1) if unbiased else ss / len(xs)


def _std(xs: Sequence[float], unbiased: bool) -> float:
    return math.sqrt(_var(xs, unbiased))


def _all_equal(xs: Sequence[float]) -> bool:
    return all(v == xs[0] for v in xs)


def _tensor(rows: list, shape: Sequence[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64).reshape(list(shape))


def _groups(n: int, group_size: int) -> list[list[int]]:
    assert group_size >= 2 and n % group_size == 0, (n, group_size)
    return [list(range(g * group_size, (g + 1) * group_size)) for g in range(n // group_size)]


def _row_mask(mask: torch.Tensor | None, n: int) -> list[bool]:
    return [True] * n if mask is None else [bool(b) for b in _lst(mask)]


# --------------------------------------------------------------------------- stats


def _reduce(
    x: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None,
    keepdim: bool,
    fn: Callable[[list[float]], float],
) -> torch.Tensor:
    """Applies ``fn`` to the list of valid values of each reduced slice."""
    assert x.shape == mask.shape
    if dim is None:
        flat_x = _lst(x.reshape(-1))
        flat_m = _lst(mask.reshape(-1))
        vals = [v for v, m in zip(flat_x, flat_m, strict=True) if m]
        return torch.tensor(fn(vals), dtype=F64)
    d = dim % x.dim()
    xm = x.movedim(d, -1)
    mm = mask.movedim(d, -1)
    lead = list(xm.shape[:-1])
    size = xm.shape[-1]
    rows_x = _lst(xm.reshape(-1, size))
    rows_m = _lst(mm.reshape(-1, size))
    out = []
    for row_x, row_m in zip(rows_x, rows_m, strict=True):
        vals = [v for v, m in zip(row_x, row_m, strict=True) if m]
        out.append(fn(vals))
    res = _tensor(out, lead)
    return res.unsqueeze(d) if keepdim else res


def _sum(vals: list[float]) -> float:
    total = 0.0
    for v in vals:
        total += v
    return total


def ref_masked_sum(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False
) -> torch.Tensor:
    return _reduce(x, mask, dim, keepdim, _sum)


def ref_masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False
) -> torch.Tensor:
    # masked_sum / count; 0 where count == 0
    return _reduce(x, mask, dim, keepdim, lambda vals: _sum(vals) / len(vals) if vals else 0.0)


def ref_masked_var(
    x: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    keepdim: bool = False,
    unbiased: bool = True,
) -> torch.Tensor:
    def var(vals: list[float]) -> float:
        if len(vals) < (2 if unbiased else 1):
            return 0.0
        return _var(vals, unbiased)

    return _reduce(x, mask, dim, keepdim, var)


def ref_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    assert x.shape == mask.shape
    flat_x = _lst(x.reshape(-1))
    flat_m = _lst(mask.reshape(-1))
    vals = [v for v, m in zip(flat_x, flat_m, strict=True) if m]
    out = []
    if len(vals) < 2:
        # fewer than 2 valid entries: x unchanged at valid positions, 0 elsewhere
        for v, m in zip(flat_x, flat_m, strict=True):
            out.append(v if m else 0.0)
        return _tensor(out, x.shape)
    mean = _mean(vals)
    denom = math.sqrt(_var(vals, unbiased) + eps)
    for v, m in zip(flat_x, flat_m, strict=True):
        if not m:
            out.append(0.0)
            continue
        w = (v - mean) / denom if denom > 0 else v - mean  # zero spread, eps 0: centred (0)
        if not shift_mean:
            w = w + mean
        out.append(w)
    return _tensor(out, x.shape)


# --------------------------------------------------------------------------- turns


def ref_pool_to_turns(
    values: torch.Tensor,
    turn_ids: torch.Tensor,
    num_turns: int | None = None,
    reduction: str = "sum",
) -> tuple[torch.Tensor, torch.Tensor]:
    vals = _lst(values)
    ids = _lst(turn_ids)
    N, T = turn_ids.shape
    if num_turns is None:
        largest = -1
        for row in ids:
            for k in row:
                largest = max(largest, k)
        K = largest + 1
    else:
        K = num_turns
    out = [[0.0] * K for _ in range(N)]
    tmask = [[False] * K for _ in range(N)]
    for n in range(N):
        for k in range(K):
            toks = [t for t in range(T) if ids[n][t] == k]
            if not toks:
                continue
            tmask[n][k] = True
            if reduction == "sum":
                out[n][k] = _sum([vals[n][t] for t in toks])
            elif reduction == "mean":
                out[n][k] = _sum([vals[n][t] for t in toks]) / len(toks)
            elif reduction == "final":
                out[n][k] = vals[n][max(toks)]
            else:
                raise ValueError(reduction)
    return _tensor(out, (N, K)), torch.tensor(tmask, dtype=torch.bool).reshape(N, K)


def ref_broadcast_to_tokens(
    turn_values: torch.Tensor, turn_ids: torch.Tensor, placement: str = "all"
) -> torch.Tensor:
    tv = _lst(turn_values)
    ids = _lst(turn_ids)
    N, T = turn_ids.shape
    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        for t in range(T):
            k = ids[n][t]
            if k == -1:
                continue
            if placement == "all":
                out[n][t] = tv[n][k]
            elif placement == "last":
                last = max(s for s in range(T) if ids[n][s] == k)
                if t == last:
                    out[n][t] = tv[n][k]
            else:
                raise ValueError(placement)
    return _tensor(out, (N, T))


# --------------------------------------------------------------------------- returns


def _episodes(row_mask: list[bool], gap: str) -> list[list[int]]:
    """The episodes of one row under ``gap``, each a list of step indices in time order.

    The last episode ends where the row's trajectory ends (the bootstrap applies after it); the
    others are terminal. ``"carry"`` episodes include the invalid steps inside the row.
    """
    valid = [t for t, ok in enumerate(row_mask) if ok]
    if not valid:
        return []
    if gap == "skip":
        return [valid]
    if gap == "carry":
        return [list(range(valid[0], valid[-1] + 1))]
    assert gap == "reset", gap
    runs: list[list[int]] = [[valid[0]]]
    for t in valid[1:]:
        if t == runs[-1][-1] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def ref_discounted_returns(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    bootstrap: torch.Tensor | None = None,
    gap: str = "skip",
) -> torch.Tensor:
    r = _lst(rewards)
    m = _lst(mask)
    boot = None if bootstrap is None else _lst(bootstrap)
    N, K = rewards.shape
    out = [[0.0] * K for _ in range(N)]
    for n in range(N):
        episodes = _episodes(m[n], gap)  # rows with no valid step are all 0
        for e, steps in enumerate(episodes):
            last = e == len(episodes) - 1
            g = boot[n] if last and boot is not None else 0.0  # G after the episode
            for t in reversed(steps):  # an invalid step here is a carried gap: reward 0
                g = (r[n][t] if m[n][t] else 0.0) + gamma * g
                if m[n][t]:
                    out[n][t] = g
    return _tensor(out, (N, K))


def ref_rebn(
    returns: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, unbiased: bool = True
) -> torch.Tensor:
    x = _lst(returns.reshape(-1))
    m = _lst(mask.reshape(-1))
    vals = [v for v, b in zip(x, m, strict=True) if b]
    out = [0.0] * len(x)
    if len(vals) >= 2:
        mean = _mean(vals)
        std = _std(vals, unbiased)
        for i in range(len(x)):
            if m[i]:
                out[i] = (x[i] - mean) / (std + eps)
    return _tensor(out, returns.shape)


def ref_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lmbda: float,
    bootstrap: torch.Tensor | None = None,
    gap: str = "skip",
) -> tuple[torch.Tensor, torch.Tensor]:
    r = _lst(rewards)
    v = _lst(values)
    m = _lst(mask)
    boot = None if bootstrap is None else _lst(bootstrap)
    N, K = rewards.shape
    adv = [[0.0] * K for _ in range(N)]
    ret = [[0.0] * K for _ in range(N)]
    for n in range(N):
        episodes = _episodes(m[n], gap)
        for e, steps in enumerate(episodes):
            last = e == len(episodes) - 1
            v_next = boot[n] if last and boot is not None else 0.0  # V_end
            a_next = 0.0  # A_end
            for t in reversed(steps):
                r_t, v_t = (r[n][t], v[n][t]) if m[n][t] else (0.0, 0.0)  # a carried gap step
                delta = r_t + gamma * v_next - v_t
                a = delta + gamma * lmbda * a_next
                if m[n][t]:
                    adv[n][t] = a
                    ret[n][t] = a + v_t
                v_next = v_t
                a_next = a
    return _tensor(adv, (N, K)), _tensor(ret, (N, K))


# --------------------------------------------------------------------------- group-relative


def ref_group_relative(
    rewards: torch.Tensor,
    group_size: int,
    scale: str = "group",
    unbiased: bool = True,
    eps: float = 1e-6,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r = _lst(rewards)
    N = len(r)
    valid = _row_mask(mask, N)
    out = [0.0] * N
    batch_vals = [r[i] for i in range(N) if valid[i]]
    std_batch = None
    if len(batch_vals) >= 2 or (not unbiased and len(batch_vals) >= 1):
        std_batch = _std(batch_vals, unbiased)
    for members in _groups(N, group_size):
        idx = [i for i in members if valid[i]]
        if len(idx) < 2:
            continue  # fewer than 2 valid members -> 0
        vals = [r[i] for i in idx]
        if _all_equal(vals):
            continue  # zero-variance group -> 0
        mean = _mean(vals)
        std_g = _std(vals, unbiased)
        for i in idx:
            c = r[i] - mean
            if scale == "group":
                out[i] = c / (std_g + eps)
            elif scale == "batch":
                assert std_batch is not None
                out[i] = c / (std_batch + eps)
            elif scale == "none":
                out[i] = c
            else:
                raise ValueError(scale)
    return _tensor(out, (N,))


def ref_group_relative_per_turn(
    rewards: torch.Tensor,
    turn_mask: torch.Tensor,
    group_size: int,
    scale: str = "group",
    unbiased: bool = True,
    eps: float = 1e-6,
    fallback: torch.Tensor | None = None,
) -> torch.Tensor:
    r = _lst(rewards)
    tm = _lst(turn_mask)
    fb = None if fallback is None else _lst(fallback)
    N, K = rewards.shape
    out = [[0.0] * K for _ in range(N)]
    for members in _groups(N, group_size):
        for k in range(K):
            players = [i for i in members if tm[i][k]]
            if len(players) < 2:
                for i in players:
                    out[i][k] = fb[i] if fb is not None else 0.0
                continue
            vals = [r[i][k] for i in players]
            if _all_equal(vals):
                continue
            mean = _mean(vals)
            std = _std(vals, unbiased)
            for i in players:
                c = r[i][k] - mean
                if scale == "group":
                    out[i][k] = c / (std + eps)
                elif scale == "none":
                    out[i][k] = c
                else:
                    raise ValueError(scale)
    return _tensor(out, (N, K))


def ref_rloo(
    rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r = _lst(rewards)
    N = len(r)
    valid = _row_mask(mask, N)
    out = [0.0] * N
    for members in _groups(N, group_size):
        idx = [i for i in members if valid[i]]
        if len(idx) < 2:
            continue
        for i in idx:
            others = [r[j] for j in idx if j != i]
            out[i] = r[i] - _sum(others) / len(others)
    return _tensor(out, (N,))


def ref_gpg(
    rewards: torch.Tensor,
    group_size: int,
    alpha: str | float = "valid_groups",
    f_norm: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r = _lst(rewards)
    N = len(r)
    valid = _row_mask(mask, N)
    out = [0.0] * N
    n_valid = sum(1 for i in range(N) if valid[i])
    non_degenerate: list[list[int]] = []
    for members in _groups(N, group_size):
        idx = [i for i in members if valid[i]]
        if len(idx) >= 2 and not _all_equal([r[i] for i in idx]):
            non_degenerate.append(idx)
    in_non_degenerate = sum(len(idx) for idx in non_degenerate)
    if in_non_degenerate == 0:
        return _tensor(out, (N,))
    if alpha == "valid_groups":
        a = n_valid / in_non_degenerate  # B / (B - M)
    elif alpha == "nonzero_rewards":
        nonzero = sum(1 for i in range(N) if valid[i] and r[i] != 0.0)
        a = N / max(1, nonzero)
    elif isinstance(alpha, str):
        raise ValueError(alpha)
    else:
        a = float(alpha)
    for idx in non_degenerate:
        mean = _mean([r[i] for i in idx])
        for i in idx:
            out[i] = a * (r[i] - mean) / f_norm
    return _tensor(out, (N,))


def ref_opo(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r = _lst(rewards)
    lens = _lst(lengths)
    N = len(r)
    valid = _row_mask(mask, N)
    out = [0.0] * N
    for members in _groups(N, group_size):
        idx = [i for i in members if valid[i]]
        if not idx:
            continue
        num = 0.0
        den = 0.0
        for j in idx:
            num += abs(float(lens[j])) * r[j]
            den += abs(float(lens[j]))
        baseline = num / den  # length-weighted mean reward of the group
        for i in idx:
            out[i] = r[i] - baseline
    return _tensor(out, (N,))


def ref_pass_at_k(
    rewards: torch.Tensor,
    group_size: int,
    scale: str = "group",
    eps: float = 1e-6,
    unbiased: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r = _lst(rewards)
    N = len(r)
    valid = _row_mask(mask, N)
    out = [0.0] * N
    for members in _groups(N, group_size):
        idx = [i for i in members if valid[i]]
        if len(idx) < 2:
            continue  # no second best: 0 (reading of the spec)
        best = idx[0]
        for i in idx:
            if r[i] > r[best]:  # strict: first index wins on ties
                best = i
        second = max(r[i] for i in idx if i != best)
        a = r[best] - second
        if scale == "group":
            s = _std([r[i] for i in idx], unbiased)
            a = a / (s + eps) if s > 0 else 0.0  # all valid equal: the gap is 0 (eps = 0 too)
        elif scale != "none":
            raise ValueError(scale)
        out[best] = a
    return _tensor(out, (N,))


def ref_remax(
    token_rewards: torch.Tensor, mask: torch.Tensor, baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r = _lst(token_rewards)
    m = _lst(mask)
    b = _lst(baselines)
    N, T = token_rewards.shape
    adv = [[0.0] * T for _ in range(N)]
    ret = [[0.0] * T for _ in range(N)]
    for n in range(N):
        acc = 0.0
        for t in reversed(range(T)):
            if not m[n][t]:
                continue
            acc += r[n][t]  # sum_{k >= t, valid} r_k
            ret[n][t] = acc
            adv[n][t] = acc - b[n]
    return _tensor(adv, (N, T)), _tensor(ret, (N, T))


# --------------------------------------------------------------------------- REINFORCE++


def ref_kl_in_reward(
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
) -> torch.Tensor:
    s = _lst(scores)
    m = _lst(mask)
    k = None if kl is None else _lst(kl)
    N, T = mask.shape
    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        valid = [t for t in range(T) if m[n][t]]
        if not valid:
            continue
        for t in valid:
            out[n][t] = 0.0 if k is None else -beta * k[n][t]
        out[n][valid[-1]] += s[n]  # the score sits on the LAST valid token
    return _tensor(out, (N, T))


def ref_reinforce_plus_plus(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    unbiased: bool = True,
    eps: float = 1e-8,
    gap: str = "skip",
) -> tuple[torch.Tensor, torch.Tensor]:
    returns = ref_discounted_returns(token_rewards, mask, gamma, gap=gap)
    advantages = ref_whiten(returns, mask, shift_mean=True, unbiased=unbiased, eps=eps)
    return advantages, returns


def ref_reinforce_plus_plus_baseline(
    scores: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
    gamma: float = 1.0,
    unbiased: bool = True,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    s = _lst(scores)
    N = len(s)
    centered = [0.0] * N
    for members in _groups(N, group_size):
        mean = _mean([s[i] for i in members])  # over the group, all members
        for i in members:
            centered[i] = s[i] - mean
    token_rewards = ref_kl_in_reward(_tensor(centered, (N,)), mask, kl, beta)
    return ref_reinforce_plus_plus(token_rewards, mask, gamma, unbiased, eps)


# --------------------------------------------------------------------------- shaping


def ref_overlong_penalty(
    lengths: torch.Tensor,
    max_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    out = []
    for length in _lst(lengths):
        if length <= max_length - buffer_length:
            out.append(0.0)
        elif length <= max_length:
            out.append((max_length - buffer_length - length) / buffer_length * penalty_factor)
        else:
            out.append(-penalty_factor)
    return _tensor(out, lengths.shape)


def ref_dynamic_sampling_mask(
    rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r = _lst(rewards)
    N = len(r)
    valid = _row_mask(mask, N)
    out = [False] * N
    for members in _groups(N, group_size):
        idx = [i for i in members if valid[i]]
        keep = len(idx) >= 2 and not _all_equal([r[i] for i in idx])
        for i in members:  # every member of the group (see the module docstring)
            out[i] = keep
    return torch.tensor(out, dtype=torch.bool).reshape(N)
