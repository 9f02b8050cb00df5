"""A packed forward in which rows that start with the same prompt compute it once.

The ``G`` completions of one prompt repeat the prompt's tokens at the same positions, and a
causal model's hidden states there depend on nothing after them: they are the same in every
row of the group. :func:`shared_prefix_rows` packs ``M`` padded rows so that such a prefix
appears once (as in Prefix Grouper, Liu et al. 2025): the per-token work (embeddings, the
linear layers, norms, rotary, MLP) runs on ``S' = S - sum_followers P`` tokens instead of the
``S`` real tokens of plain packing. Only attention mixes tokens; :func:`shared_prefix_attention`
gathers each row's keys, values and queries back into right-aligned rows (its prompt from the
group's one copy), runs causal SDPA on them, and takes each packed token's output from one row
that holds it. Every row therefore attends exactly as in its own padded forward,
and :func:`unshare` gives back the ``[M, L, H]`` tensor of the padded forward (each row's
prompt positions read the group's one copy; their gradients add up there).

Which rows share: consecutive rows with the same first real column, the same ``prefix``
length (``P``, the real tokens before each row's first scored token, from the caller) and the
same tokens there. A row that shares with the previous one follows that row's leader (the
first row of the run). Rows that share with nothing are packed whole, as
:func:`rl_algos.packing.pack_rows` packs them.

Cost: the attention runs on buckets of rows of similar lengths, ``[M_b, heads, R_b, d]`` each
(``R_b`` the bucket's longest row, the others at least :data:`BUCKET_RATIO` of it), so at most
``1 / BUCKET_RATIO^2`` what plain packing's ``sum_i L_i^2`` costs; everything else runs on
``S'`` tokens. Equal to the padded and packed forwards to float rounding, values and
gradients.

Shapes: ``M`` rows, ``L`` padded width, ``S'`` packed tokens, ``M_b`` rows of a bucket and
``R_b`` its longest row's real tokens, ``H`` hidden size, ``d`` head dimension.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from rl_algos.varlen_attention import refuse_unsupported, sdpa_key_value

__all__ = [
    "BUCKET_RATIO",
    "MIN_SAVED_WORK",
    "SHARED_PREFIX_IMPLEMENTATIONS",
    "SHARED_PREFIX_SDPA",
    "SharedPrefixRows",
    "body_parameters",
    "prompt_lengths",
    "shared_prefix_attention",
    "shared_prefix_rows",
    "shares_previous",
    "unshare",
]

#: The name :func:`shared_prefix_attention` is registered under in transformers.
SHARED_PREFIX_SDPA = "rl_shared_prefix_sdpa"
#: The model attention implementations whose packed forwards can share prefixes (the others:
#: flash-attention's varlen kernels take no such layout, flex attention builds its own mask).
SHARED_PREFIX_IMPLEMENTATIONS = ("sdpa", "eager")


#: The least work (saved tokens x the model's per-token parameters, i.e. half the FLOPs) for
#: which the default shares the prefixes of rows that all have one length: such rows otherwise
#: run as a plain batch, and below it building the layout and gathering every attention's
#: inputs cost more than the saved tokens (``docs/benchmarks.md``). Ragged rows otherwise run
#: the varlen attention, whose costs the layout replaces: they share wherever a token is saved.
MIN_SAVED_WORK = 2**28

_EMBEDDINGS = ("get_input_embeddings", "get_output_embeddings")
_BODY_PARAMETERS: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()


def body_parameters(model: torch.nn.Module) -> int:
    """The parameters a token passes through, the input and output embeddings aside."""
    count = _BODY_PARAMETERS.get(model)
    if count is None:
        embeddings = [getattr(model, name)() for name in _EMBEDDINGS]
        skip = {id(getattr(m, "weight", None)) for m in embeddings if m is not None}
        count = sum(p.numel() for p in model.parameters() if id(p) not in skip)
        _BODY_PARAMETERS[model] = count
    return count


def prompt_lengths(attention_mask: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """[M] long: each row's real tokens before its first scored token (all of them if none).

    Args:
        attention_mask: [M, L], one contiguous span of real tokens per row.
        scored: [M, L - 1] bool, shifted by one: position ``t`` scores token ``t + 1``.
    """
    if scored.shape != (attention_mask.shape[0], attention_mask.shape[1] - 1):
        raise ValueError(
            f"`scored` must be [M, L - 1] for `attention_mask` {tuple(attention_mask.shape)}, "
            f"got {tuple(scored.shape)}"
        )
    real = attention_mask.bool()
    start = real.long().argmax(1)
    length = real.sum(1)
    first = scored.long().argmax(1) + 1 - start  # real tokens before the first scored one
    return torch.where(scored.any(1), first, length).clamp(min=0)


@dataclass(frozen=True)
class SharedPrefixRows:
    """``M`` padded rows packed with each shared prefix once, and the ways back."""

    input_ids: torch.Tensor
    """[1, S'] long: the packed tokens (a leader row whole, a follower row after its prefix)."""
    position_ids: torch.Tensor
    """[1, S'] long: each token's column in the padded rows (the padded forward's position)."""
    source: torch.Tensor
    """[M * L] long: the packed index of every padded position (``S'`` on padding)."""
    rows: tuple[torch.Tensor, ...]
    """The attention's buckets of rows of similar lengths (:data:`BUCKET_RATIO`), each
    [M_b, R_b] long: the packed index of each of its rows' ``t``-th real token (0 past the
    row's end), ``R_b`` its longest row."""
    take: torch.Tensor
    """[S'] long: where packed token ``s`` is in the buckets' outputs, flattened and
    concatenated (``[sum_b M_b R_b]``), read from one row that holds it."""
    width: int
    """``L``, the padded row width."""
    padded: bool
    """Some padded position is padding (``source`` holds ``S'``)."""

    @property
    def num_tokens(self) -> int:
        """``S'``."""
        return int(self.input_ids.shape[1])


def shared_prefix_rows(
    input_ids: torch.Tensor,
    starts: torch.Tensor,
    lengths: torch.Tensor,
    prefix: torch.Tensor,
    min_saved: int = 1,
) -> SharedPrefixRows | None:
    """The :class:`SharedPrefixRows` of padded ``input_ids`` [M, L], or None if fewer than
    ``min_saved`` tokens would be shared.

    Args:
        input_ids: [M, L] padded rows.
        starts: [M] long, each row's first real column (``rl_algos.packing.row_spans``).
        lengths: [M] long, each row's real tokens (one contiguous span).
        prefix: [M] long, the real tokens at the start of each row that rows holding the same
            ones may share (its prompt: the tokens before its first scored one); clipped to
            the row's length.
        min_saved: The fewest tokens the layout must save (None is returned below it).
    """  # noqa: D205
    M, L = input_ids.shape
    if prefix.shape != (M,):
        raise ValueError(f"`prefix` must be [M] = [{M}], got {tuple(prefix.shape)}")
    device = input_ids.device
    P = torch.minimum(prefix.clamp(min=0), lengths)
    cols = torch.arange(L, device=device)
    in_prefix = (cols >= starts[:, None]) & (cols < (starts + P)[:, None])  # [M, L]
    same = _same_as_previous(input_ids, starts, P, in_prefix)
    if int((P * same).sum()) < max(1, min_saved):
        return None
    rows = torch.arange(M, device=device)
    leader = torch.where(same, 0, rows).cummax(0).values  # [M]: the first row of each run
    real = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    shared = in_prefix & same[:, None]  # a follower's prefix: read from its leader
    own = (real & ~shared).reshape(-1).nonzero().squeeze(1)  # [S'] flat m * L + c, row-major
    S = int(own.shape[0])
    pid = torch.full((M * L,), S, dtype=torch.long, device=device)
    pid[own] = torch.arange(S, device=device)
    pid = pid.view(M, L)
    pid = torch.where(shared, pid[leader], pid)  # a leader's prefix is its own
    buckets, offsets = _buckets(lengths.tolist())
    index = []
    for bucket in buckets:
        picked = torch.tensor(bucket, dtype=torch.long, device=device)
        R = int(lengths[bucket[0]])  # the longest row of the bucket comes first
        t = torch.arange(R, device=device)
        at = (starts[picked, None] + t).clamp(max=L - 1)  # the column of each row's t-th token
        valid = t[None] < lengths[picked, None]
        index.append(torch.where(valid, pid[picked].gather(1, at), 0))
    m, c = own // L, own % L
    first = torch.tensor(offsets, dtype=torch.long, device=device)  # [M]
    return SharedPrefixRows(
        input_ids=input_ids.reshape(-1)[own][None],
        position_ids=c[None],
        source=pid.reshape(-1),
        rows=tuple(index),
        take=first[m] + (c - starts[m]),
        width=L,
        padded=not bool(real.all()),
    )


#: A bucket of the shared attention holds the rows at least this fraction as long as its
#: longest, so its padded attention costs at most ``1 / BUCKET_RATIO^2`` (1.56x) what the rows'
#: own lengths would (plain packing's ``sum_i L_i^2``), in one SDPA call per bucket.
BUCKET_RATIO = 0.8


def _buckets(lengths: list[int]) -> tuple[list[list[int]], list[int]]:
    """``(buckets, offsets)``: the rows by length, longest first, cut into buckets of rows
    at least :data:`BUCKET_RATIO` times the bucket's first; and each row's first position in
    the buckets' outputs, flattened and concatenated (``[M_b, R_b]`` each).
    """  # noqa: D205
    order = sorted(range(len(lengths)), key=lambda k: (-lengths[k], k))
    buckets: list[list[int]] = []
    for k in order:
        if not buckets or lengths[k] < BUCKET_RATIO * lengths[buckets[-1][0]]:
            buckets.append([])
        buckets[-1].append(k)
    offsets = [0] * len(lengths)
    base = 0
    for bucket in buckets:
        width = lengths[bucket[0]]
        for j, k in enumerate(bucket):
            offsets[k] = base + j * width
        base += len(bucket) * width
    return buckets, offsets


def _same_as_previous(
    input_ids: torch.Tensor, starts: torch.Tensor, P: torch.Tensor, in_prefix: torch.Tensor
) -> torch.Tensor:
    """[M] bool: row ``m`` starts with the prefix of row ``m - 1`` (``P`` [M] tokens from
    ``starts`` [M], the columns ``in_prefix`` [M, L]): same first column, length and tokens.
    """  # noqa: D205
    same = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    if input_ids.shape[0] > 1:
        equal = ((input_ids[1:] == input_ids[:-1]) | ~in_prefix[1:]).all(1)
        same[1:] = (starts[1:] == starts[:-1]) & (P[1:] == P[:-1]) & (P[1:] > 0) & equal
    return same


def shares_previous(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor
) -> torch.Tensor:
    """[M] bool: row ``m`` holds the prompt of row ``m - 1``, so the two can share it.

    The prompt is a row's tokens before its first scored one (:func:`prompt_lengths`); the
    rows must also start at the same column.

    Args:
        input_ids: [M, L] padded rows.
        attention_mask: [M, L], one contiguous span of real tokens per row.
        scored: [M, L - 1] bool, shifted by one.
    """
    real = attention_mask.bool()
    starts, lengths = real.long().argmax(1), real.sum(1)
    P = torch.minimum(prompt_lengths(attention_mask, scored), lengths)
    cols = torch.arange(input_ids.shape[1], device=input_ids.device)
    in_prefix = (cols >= starts[:, None]) & (cols < (starts + P)[:, None])
    return _same_as_previous(input_ids, starts, P, in_prefix)


def unshare(packed: torch.Tensor, rows: SharedPrefixRows) -> torch.Tensor:
    """[M, L, ...] from packed values [1, S', ...]: zeros on the padding.

    Every row's prefix positions read the group's one copy, so their gradients add up there.
    """
    flat = packed[0]
    if flat.shape[0] != rows.num_tokens:
        raise ValueError(
            f"`packed` holds {flat.shape[0]} tokens, the packed rows {rows.num_tokens}"
        )
    if rows.padded:
        flat = torch.cat([flat, flat.new_zeros((1, *flat.shape[1:]))])  # row S': the padding
    M = rows.source.shape[0] // rows.width
    return flat.index_select(0, rows.source).view(M, rows.width, *flat.shape[1:])


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    rl_shared_prefix: SharedPrefixRows | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of every row over its own tokens, its prefix read from the one copy.

    A transformers attention function (``AttentionInterface``): ``query`` [1, heads, S', d],
    ``key``/``value`` [1, kv_heads, S', d] (grouped-query attention), the layout
    ``rl_shared_prefix`` (:class:`SharedPrefixRows`, passed down by the model's forward).
    Returns ``([1, S', heads, d], None)``.

    Raises:
        ValueError: Without the layout, with a mask, with a row longer than a sliding
            window, or with an argument SDPA cannot apply
            (:data:`rl_algos.varlen_attention.UNSUPPORTED_ARGUMENTS`).
    """
    del module
    refuse_unsupported(kwargs, SHARED_PREFIX_SDPA, "pass share_prompt_prefix=False")
    layout = rl_shared_prefix
    if layout is None or attention_mask is not None or query.shape[0] != 1:
        raise ValueError(
            f"{SHARED_PREFIX_SDPA} runs shared-prefix packed rows only: one sequence [1, S'] "
            "with rl_shared_prefix and no attention mask (rl_algos.packing.packed_hidden_states "
            "sets them)"
        )
    longest = max(int(rows.shape[1]) for rows in layout.rows)
    if sliding_window is not None and int(sliding_window) < longest:
        raise ValueError(
            "sliding-window attention cannot share prompt prefixes with SDPA here: pass "
            "share_prompt_prefix=False (or use_sequence_packing=False)"
        )
    key, value, gqa = sdpa_key_value(query, key, value)
    # token-major, as the projections laid them out ([S', h, d] memory): whole rows copied
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    parts = []
    for rows in layout.rows:  # one SDPA call per bucket of rows of similar lengths

        def by_row(x: torch.Tensor, rows: torch.Tensor = rows) -> torch.Tensor:
            # [S', h, d] -> [M_b, h, R_b, d]
            picked: torch.Tensor = x.index_select(0, rows.reshape(-1)).unflatten(0, rows.shape)
            return picked.transpose(1, 2)

        out = torch.nn.functional.scaled_dot_product_attention(
            by_row(q),
            by_row(k),
            by_row(v),
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=gqa,
        )  # [M_b, heads, R_b, d]; a row's padding attends to its real tokens, never read
        parts.append(out.transpose(1, 2).flatten(0, 1))  # [M_b * R_b, heads, d]
    by_token = parts[0] if len(parts) == 1 else torch.cat(parts)
    return by_token.index_select(0, layout.take)[None], None
