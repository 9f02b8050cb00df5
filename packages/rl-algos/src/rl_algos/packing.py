"""Padding-free forwards: packed sequences and token-budget micro-batches.

Shapes: ``M`` rows of a micro-batch, ``L`` tokens per right-padded row, ``T = L - 1``
predictions (shifted by one against ``input_ids``), ``S`` packed tokens (the sum of the rows'
real lengths), ``H`` hidden size. Masks are True (or 1) where a token counts.

**Packing.** :func:`pack_rows` concatenates the real tokens of ``M`` padded rows into one
sequence ``[1, S]``; each token keeps the position the padded forward gives it (its column:
``position_ids`` restart at 0 on every right-padded row; a left-padded row keeps its offset, as
the padded forward's default ``0..L-1`` positions do). The model is called with
``attention_mask=None``, those ``position_ids`` (RoPE per row) and the rows' cumulative
lengths ``cu_seq_lens_q/k`` (transformers' ``FlashAttentionKwargs``, passed down to every
attention call). Attention stays inside each row, by implementation:

* ``flash_attention_2`` / ``_3`` (CUDA only, not exercised by the CPU tests): transformers calls
  ``flash_attn_varlen_func`` with the cumulative lengths; cost ``sum_i L_i^2``.
* ``sdpa`` and ``eager`` (CPU and CUDA): for the packed forward the model runs
  :func:`varlen_sdpa_attention` (registered in transformers' ``AttentionInterface`` as
  ``"rl_varlen_sdpa"``; the config's implementation is switched for the forward and restored
  after, a :func:`rl_adapters.replay.replayable` switch, so a checkpointed layer recomputes
  with it too): causal SDPA on each row's slice, so the cost is ``sum_i L_i^2`` and no ``[S, S]``
  mask is built. Equal to the padded forward to float rounding.
* ``flex_attention``: transformers' own packed path. With ``attention_mask=None`` and
  restarting ``position_ids`` (no cache), ``masking_utils.create_causal_mask`` detects the
  packed layout (``find_packed_sequence_indices``) and builds a block-diagonal causal mask.
  The same detection makes SDPA/eager models correct when called with packed
  ``position_ids`` directly, at ``S^2`` cost (a dense ``[1, 1, S, S]`` mask).

:func:`unpack` scatters the packed hidden states back onto the padded ``[M, L, H]`` layout
(zeros on padding), so every consumer (the fused log-prob head, the value heads, the losses)
reads exactly the tensors of the padded forward at the positions its mask selects.

**The default** (``use_sequence_packing=None``, "auto"): :class:`PackingReport` packs a forward
when :func:`packing_blocker` finds nothing against it (a packable attention implementation,
each row's attention one contiguous span) and otherwise runs it padded, with one warning per
reason and the counts and last reason on the report (``agent.packing_report``).
``use_sequence_packing=True`` raises where auto falls back; ``False`` never packs.

**Token budgets.** :func:`token_budget_groups` splits rows into micro-batches of at most
``micro_batch_tokens`` real tokens, balanced by the sum of squared lengths (attention grows with
``L^2``): rows longest first, each into the micro-batch of least cost it still fits in.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from rl_adapters.replay import replayable

__all__ = [
    "FLASH_IMPLEMENTATIONS",
    "PACKABLE_IMPLEMENTATIONS",
    "PackedRows",
    "PackingReport",
    "RowSplit",
    "pack_rows",
    "packed_hidden_states",
    "packing_blocker",
    "row_lengths",
    "split_rows",
    "token_budget_groups",
    "unpack",
    "varlen_sdpa_attention",
]

#: Attention implementations whose varlen kernel reads ``cu_seq_lens`` (no mask is built).
FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
#: Attention implementations for which transformers builds the packed (block-diagonal) mask.
PACKABLE_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", *FLASH_IMPLEMENTATIONS)


@dataclass(frozen=True)
class PackedRows:
    """``M`` right-padded rows as one packed sequence, and the way back."""

    input_ids: torch.Tensor
    """[1, S] long: the rows' real tokens, one row after the other."""
    position_ids: torch.Tensor
    """[1, S] long: 0..len_i - 1 for each row ``i``."""
    lengths: torch.Tensor
    """[M] long: real tokens per row (0 for a row without any)."""
    cu_seqlens: torch.Tensor
    """[M' + 1] int32: cumulative lengths of the non-empty rows (flash-attention varlen)."""
    max_length: int
    """The longest row."""
    index: torch.Tensor
    """[S] long: flat position ``row * L + t`` in the padded ``[M, L]`` layout of each token."""
    width: int
    """``L``, the padded row width."""

    @property
    def num_rows(self) -> int:
        """``M``."""
        return int(self.lengths.shape[0])

    @property
    def num_tokens(self) -> int:
        """``S``."""
        return int(self.input_ids.shape[1])


def row_spans(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(starts, lengths)``, both [M] long: each row's real tokens ``attention_mask`` [M, L].

    A row's real tokens must be one contiguous span (right padding, left padding, or both);
    an empty row has start 0 and length 0.

    Raises:
        ValueError: A row whose mask has holes (0 between two 1s).
    """
    if attention_mask.dim() != 2:
        raise ValueError(
            f"`attention_mask` must be [M, L] to pack, got {tuple(attention_mask.shape)}"
        )
    real = attention_mask.bool()
    if bool(real.all()):  # no padding at all: one test instead of four passes
        m, length = real.shape
        full = torch.full((m,), length, dtype=torch.long, device=real.device)
        return torch.zeros_like(full), full
    lengths = real.sum(1)
    starts = real.long().argmax(1)  # the first real token (0 for an empty row)
    positions = torch.arange(real.shape[1], device=real.device)
    span = (positions[None] >= starts[:, None]) & (positions[None] < (starts + lengths)[:, None])
    if not bool((real == span).all()):
        raise ValueError(
            "packing needs each row's `attention_mask` to be one contiguous span of 1s (right- "
            "or left-padded): masks with holes cannot be packed; pass use_sequence_packing="
            "False (or None, the default, which then runs such batches padded)"
        )
    return starts.long(), lengths.long()


def row_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """[M] long: tokens per row of a padded ``attention_mask`` [M, L] (see :func:`row_spans`)."""
    return row_spans(attention_mask)[1]


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """The :class:`PackedRows` of padded ``input_ids`` [M, L] and ``attention_mask``.

    Each row's real tokens (one contiguous span, :func:`row_spans`) keep their column as
    position: ``0..len - 1`` for a right-padded row, ``start..start + len - 1`` for a
    left-padded one, the positions of the padded forward (transformers' default ``0..L-1``).
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"`input_ids` {tuple(input_ids.shape)} and `attention_mask` "
            f"{tuple(attention_mask.shape)} must have the same [M, L] shape"
        )
    M, L = input_ids.shape
    lengths = row_lengths(attention_mask)
    real = attention_mask.bool()  # [M, L], one span per row
    index = real.reshape(-1).nonzero().squeeze(1)  # [S], row-major: row by row
    positions = torch.arange(L, device=input_ids.device).expand(M, L)
    nonempty = lengths[lengths > 0]
    cu = torch.zeros(nonempty.shape[0] + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = nonempty.cumsum(0)
    return PackedRows(
        input_ids=input_ids.reshape(-1)[index][None],
        position_ids=positions.reshape(-1)[index][None],
        lengths=lengths,
        cu_seqlens=cu,
        max_length=int(lengths.max()) if M else 0,
        index=index,
        width=L,
    )


def unpack(packed: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """[M, L, ...] from packed values [S, ...] or [1, S, ...]: zeros on the padding.

    Differentiable in ``packed`` (the padding gets no gradient).
    """
    flat = packed[0] if packed.dim() >= 2 and packed.shape[0] == 1 else packed
    if flat.shape[0] != rows.num_tokens:
        raise ValueError(
            f"`packed` holds {flat.shape[0]} tokens, the packed rows {rows.num_tokens}"
        )
    out = flat.new_zeros((rows.num_rows * rows.width, *flat.shape[1:]))
    out = out.index_copy(0, rows.index, flat)
    return out.view(rows.num_rows, rows.width, *flat.shape[1:])


def attention_implementation(model: Any) -> str:
    """The attention implementation a transformers model runs (``config._attn_implementation``)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def packed_hidden_states(
    policy: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    role: str = "actor",
    checked: bool = False,
) -> torch.Tensor:
    """[M, L, H] last hidden states of padded rows, computed as one packed sequence.

    Equal (to float rounding) to ``policy.hidden_states(input_ids, attention_mask, role)`` at
    every real token; zeros on the padding.

    Args:
        policy: An :class:`rl_adapters.PolicyModel`.
        input_ids: [M, L] padded (right, left or both).
        attention_mask: [M, L], 1 on one contiguous span of each row.
        role: ``"actor"``, ``"reference"`` or ``"critic"``.
        checked: The caller has just found no :func:`packing_blocker` for these rows (the
            default's :meth:`PackingReport.choose`): not checked again.

    Raises:
        ValueError: What :func:`packing_blocker` finds (the message names it and the fix).
    """
    reason = None if checked else packing_blocker(policy.causal_lm, attention_mask)
    if reason is not None:
        raise ValueError(
            f"use_sequence_packing=True cannot pack this forward: {reason}; pass "
            "use_sequence_packing=False, or None (the default: packs where it can, else padded)"
        )
    impl = attention_implementation(policy.causal_lm)
    starts, lengths = row_spans(attention_mask)
    if bool((lengths == lengths[0]).all()) and not bool(starts.any()):
        return _unpadded_hidden_states(policy, input_ids, int(lengths[0]), role)
    rows = pack_rows(input_ids, attention_mask)
    extra: dict[str, Any] = {
        "cu_seq_lens_q": rows.cu_seqlens,
        "cu_seq_lens_k": rows.cu_seqlens,
        "max_length_q": rows.max_length,
        "max_length_k": rows.max_length,
    }
    model = policy.reference_model if role == "reference" else None
    switch: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if impl in ("sdpa", "eager"):
        _register_varlen()
        configs = _configs(policy.causal_lm if model is None else model)
        # replayable: a checkpointed layer recomputes with the varlen attention too
        switch = replayable(functools.partial(_attention, tuple(configs), VARLEN_SDPA))
    with switch:
        hidden: torch.Tensor = policy.hidden_states(
            rows.input_ids, None, role=role, position_ids=rows.position_ids, **extra
        )
    return unpack(hidden, rows)


@contextlib.contextmanager
def _attention(configs: Sequence[Any], impl: str) -> Iterator[None]:
    """Run the body with attention implementation ``impl`` in ``configs``; restore after."""
    saved = [c._attn_implementation_internal for c in configs]
    try:
        for c in configs:
            c._attn_implementation_internal = impl
        yield
    finally:
        for c, value in zip(configs, saved, strict=True):
            c._attn_implementation_internal = value


def _unpadded_hidden_states(
    policy: Any, input_ids: torch.Tensor, length: int, role: str
) -> torch.Tensor:
    """[M, L, H]: rows that all hold ``length`` real tokens need no packing.

    Their first ``length`` columns are an ``[M, length]`` batch without padding, which is
    exactly what packing would compute (the padded forward of those columns, run without an
    attention mask, as transformers reads a mask of ones); the rest is zeros, as
    :func:`unpack` leaves it.
    """
    # no padding left: no mask either (what transformers assumes without one, exactly;
    # it skips the mask's inspection)
    hidden: torch.Tensor = policy.hidden_states(input_ids[:, :length], None, role=role)
    pad = input_ids.shape[1] - length
    return torch.nn.functional.pad(hidden, (0, 0, 0, pad)) if pad else hidden


def packing_blocker(model: Any, attention_mask: torch.Tensor) -> str | None:
    """Why the rows ``attention_mask`` [M, L] cannot run packed through ``model``, or None.

    Packing is exact when the attention implementation confines attention to each row
    (:data:`PACKABLE_IMPLEMENTATIONS`), each row's real tokens are one contiguous span
    (:func:`row_spans`; left padding is fine), some row is not empty, and, for SDPA/eager,
    no row is longer than a sliding window the model applies. ``flex_attention`` finds the
    rows from the ``position_ids`` (a restart): a left-padded row whose first position
    continues the previous row's would merge with it, so that layout is refused too.
    """
    impl = attention_implementation(model)
    if impl not in PACKABLE_IMPLEMENTATIONS:
        return (
            f"the model's attention implementation {impl!r} cannot confine attention to each "
            f"packed row (packable: {', '.join(PACKABLE_IMPLEMENTATIONS)}; load the model with "
            "attn_implementation='sdpa' or a flash-attention one)"
        )
    try:
        starts, lengths = row_spans(attention_mask)
    except ValueError:
        return "a row's attention_mask is not one contiguous span of 1s (holes)"
    if not bool((lengths > 0).any()):
        return "every row of the micro-batch is empty (attention_mask all 0)"
    window = _sliding_window(model)
    if impl in ("sdpa", "eager") and window is not None and int(lengths.max()) > window:
        return (
            f"a row of {int(lengths.max())} tokens is longer than the model's sliding window "
            f"({window}), which packed SDPA does not apply (flash-attention does)"
        )
    if impl == "flex_attention" and bool(starts.any()):
        ends = (starts + lengths)[lengths > 0]
        if bool((starts[lengths > 0][1:] == ends[:-1]).any()):
            return (
                "flex_attention finds packed rows by their restarting position_ids, and a "
                "left-padded row here continues the previous row's positions"
            )
    return None


def _sliding_window(model: Any) -> int | None:
    """The sliding window a model's attention applies (None: none)."""
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)()
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


@dataclass
class PackingReport:
    """What the default ``use_sequence_packing=None`` ("auto") did, forward by forward.

    :meth:`choose` packs a forward when :func:`packing_blocker` finds nothing against it, and
    otherwise runs it padded: it warns once per reason (a ``RuntimeWarning``) and records
    the reason, so a run never falls back silently. Read it as
    ``agent.packing_report``.
    """

    packed_forwards: int = 0
    """Forwards that ran packed."""
    padded_forwards: int = 0
    """Forwards that ran padded because packing was not possible."""
    reason: str | None = None
    """Why the last padded forward could not be packed (None: every forward packed)."""
    warned: set[str] = field(default_factory=set)
    """The reasons already warned about."""

    def choose(self, model: Any, attention_mask: torch.Tensor) -> bool:
        """Whether to pack the forward of ``attention_mask`` [M, L] through ``model``."""
        reason = packing_blocker(model, attention_mask)
        if reason is None:
            self.packed_forwards += 1
            return True
        self.padded_forwards += 1
        self.reason = reason
        if reason not in self.warned:
            self.warned.add(reason)
            message = f"use_sequence_packing=None (auto): running padded, {reason}"
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return False


#: The name :func:`varlen_sdpa_attention` is registered under in transformers.
VARLEN_SDPA = "rl_varlen_sdpa"


def _configs(model: Any) -> list[Any]:
    """The distinct configs (with an attention implementation) of a model's modules."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def _register_varlen() -> None:
    from transformers import AttentionInterface

    if VARLEN_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed row: SDPA on every row's slice.

    Consecutive rows of equal length share one batched call (uniform lengths cost what the
    padded batch does).

    A transformers attention function (``AttentionInterface``): ``query`` [1, heads, S, d],
    ``key``/``value`` [1, kv_heads, S, d] (grouped-query attention), the rows'
    boundaries ``cu_seq_lens_q`` [M + 1]. Returns ``([1, S, heads, d], None)``.

    Raises:
        ValueError: Without ``cu_seq_lens_q``, with a mask, or with a row longer than a
            sliding window (a shorter row attends causally to all of itself either way).
    """
    del module, kwargs
    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1:
        raise ValueError(
            f"{VARLEN_SDPA} runs packed rows only: one sequence [1, S] with cu_seq_lens_q and "
            "no attention mask (rl_algos.packing.packed_hidden_states sets them)"
        )
    if sliding_window is not None and max(
        b - a for a, b in itertools.pairwise(cu_seq_lens_q.tolist())
    ) > int(sliding_window):
        raise ValueError(
            "sliding-window attention cannot be packed with SDPA here: pass "
            "use_sequence_packing=False (or use flash-attention on CUDA)"
        )
    # grouped-query heads: SDPA's enable_gqa (no copies), as transformers' SDPA path does
    # without a mask; larger head dims repeat the key/value heads
    gqa = query.shape[1] != key.shape[1] and key.shape[-1] == value.shape[-1] <= 256
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and not gqa:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    runs = _runs(cu_seq_lens_q.tolist())
    sizes = [n * length for _, n, length in runs]
    # one split per tensor (its backward is one concatenation, where a slice per run would
    # scatter into a zero [heads, S, d] gradient per run)
    splits = [torch.split(t[0], sizes, dim=1) for t in (query, key, value)]
    parts = []
    for (_, n, length), *qkv in zip(runs, *splits, strict=True):
        # n consecutive rows of one length: one batched call on [n, heads, length, d]
        q, k, v = (t.unflatten(1, (n, length)).transpose(0, 1) for t in qkv)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
        )  # [n, heads, length, d]
        parts.append(out.transpose(0, 1).flatten(1, 2))  # [heads, n * length, d]
    return torch.cat(parts, dim=1).transpose(0, 1)[None].contiguous(), None


def _runs(bounds: list[int]) -> list[tuple[int, int, int]]:
    """``(start, rows, length)`` of each run of consecutive equal-length rows of ``bounds``."""
    runs: list[tuple[int, int, int]] = []
    for a, b in itertools.pairwise(bounds):
        if runs and runs[-1][2] == b - a:
            start, n, length = runs[-1]
            runs[-1] = (start, n + 1, length)
        else:
            runs.append((a, 1, b - a))
    return runs


def token_budget_groups(
    lengths: Sequence[int], budget: int, max_rows: int | None = None, groups: int = 0
) -> list[list[int]]:
    """Indices of ``lengths`` in micro-batches of at most ``budget`` tokens, balanced.

    Two passes. The first counts the micro-batches a first-fit pass needs (rows longest first,
    each into the first micro-batch with room: ``budget`` tokens and ``max_rows`` rows). The
    second opens that many (or ``groups``, if more: e.g. the most any process needs, so every
    process runs the same number of forwards; never more than there are rows) and puts the rows,
    longest first, each into the micro-batch of least cost (sum of squared lengths, as attention
    grows with ``L^2``) that has room, opening another when none has. Each micro-batch lists
    its rows in ascending order; the micro-batches are ordered by their first row.

    Raises:
        ValueError: A row longer than ``budget`` (both numbers are named).
    """
    if budget < 1:
        raise ValueError(f"`micro_batch_tokens` must be >= 1, got {budget}")
    longest = max(lengths, default=0)
    if longest > budget:
        raise ValueError(
            f"a row has {longest} tokens, more than micro_batch_tokens={budget}: raise "
            "micro_batch_tokens to at least the longest row (prompt + completion), or shorten "
            "max_output_tokens"
        )
    order = sorted(range(len(lengths)), key=lambda k: (-lengths[k], k))
    first_fit = _fill(order, lengths, budget, max_rows, 0, balanced=False)
    bins = _fill(order, lengths, budget, max_rows, max(groups, len(first_fit)), balanced=True)
    out = [sorted(b) for b in bins if b]
    return sorted(out, key=lambda b: b[0])


def _fill(
    order: list[int],
    lengths: Sequence[int],
    budget: int,
    max_rows: int | None,
    opened: int,
    balanced: bool,
) -> list[list[int]]:
    """Rows ``order`` into ``opened`` micro-batches, more when needed.

    Each row goes into the first micro-batch with room or (``balanced``) the one of least sum
    of squared lengths with room.
    """
    bins: list[list[int]] = [[] for _ in range(min(opened, len(order)))]
    tokens = [0] * len(bins)
    cost = [0] * len(bins)
    for i in order:
        n = lengths[i]
        fits = [
            b
            for b in range(len(bins))
            if tokens[b] + n <= budget and (max_rows is None or len(bins[b]) < max_rows)
        ]
        if not fits:
            bins.append([])
            tokens.append(0)
            cost.append(0)
            fits = [len(bins) - 1]
        b = min(fits, key=lambda k: (cost[k], tokens[k], k)) if balanced else fits[0]
        bins[b].append(i)
        tokens[b] += n
        cost[b] += n * n
    return bins


@dataclass(frozen=True)
class RowSplit:
    """How a set of rows is cut into forwards (micro-batches)."""

    micro_batch_rows: int | None = None
    """At most this many rows per micro-batch (None: no row limit)."""
    micro_batch_tokens: int | None = None
    """At most this many real tokens per micro-batch (None: no token budget)."""


def split_rows(
    rows: torch.Tensor, attention_mask: torch.Tensor, split: RowSplit
) -> list[torch.Tensor]:
    """``rows`` [R] (indices into ``attention_mask`` [N, L]) cut into micro-batches.

    Without a token budget: consecutive slices of ``split.micro_batch_rows`` rows (all rows
    when None). With one: :func:`token_budget_groups` over the rows' real lengths (the row
    limit still applies); under data parallelism every process gets as many micro-batches as
    the process that needs the most, so collective forwards (ZeRO-3) stay in step.
    """
    if split.micro_batch_tokens is None:
        size = split.micro_batch_rows or max(1, len(rows))
        return [rows[s : s + size] for s in range(0, len(rows), size)]
    lengths = attention_mask[rows].sum(1).tolist()
    groups = token_budget_groups(lengths, split.micro_batch_tokens, split.micro_batch_rows)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        count = torch.tensor([len(groups)], device=attention_mask.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        if int(count) > len(groups):
            groups = token_budget_groups(
                lengths, split.micro_batch_tokens, split.micro_batch_rows, groups=int(count)
            )
        if int(count) > len(groups):
            raise ValueError(
                f"another process needs {int(count)} micro-batches of micro_batch_tokens="
                f"{split.micro_batch_tokens}, this one has only {len(groups)} rows: give every "
                "process the same number of rows, or raise micro_batch_tokens"
            )
    return [rows[torch.tensor(g, dtype=torch.long, device=rows.device)] for g in groups]
