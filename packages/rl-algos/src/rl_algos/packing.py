"""Padding-free forwards: padded rows run as one packed sequence.

Shapes: ``M`` rows of a micro-batch, ``L`` tokens per right-padded row, ``T = L - 1``
predictions (shifted by one against ``input_ids``), ``S`` packed tokens (the sum of the rows'
real lengths), ``H`` hidden size. Masks are True (or 1) where a token counts.

**Packing.** :func:`pack_rows` concatenates the real tokens of ``M`` padded rows into one
sequence ``[1, S]``; each token keeps the position the padded forward gives it (its column:
``position_ids`` restart at 0 on every right-padded row; a left-padded row keeps its offset, as
the padded forward's default ``0..L-1`` positions do). The model is called with
``attention_mask=None``, those ``position_ids`` (RoPE per row) and the rows' cumulative
lengths ``cu_seq_lens_q/k`` (transformers' ``FlashAttentionKwargs``, passed down to every
attention call). Attention stays inside each row by the attention implementation
(:mod:`rl_algos.varlen_attention`).

:func:`unpack` scatters the packed hidden states back onto the padded ``[M, L, H]`` layout
(zeros on padding), so every consumer (the fused log-prob head, the value heads, the losses)
reads exactly the tensors of the padded forward at the positions its mask selects.

**The default** (``use_sequence_packing=None``, "auto"): :class:`PackingReport` packs a forward
when :func:`packing_blocker` finds nothing against it (a packable attention implementation,
each row's attention one contiguous span) and otherwise runs it padded, with one warning per
reason and the counts and last reason on the report (``agent.packing_report``).
``use_sequence_packing=True`` raises where auto falls back; ``False`` never packs.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from rl_adapters.replay import replayable

from rl_algos.router_balance import RouterBalance
from rl_algos.router_replay import RouterReplay, laid_out
from rl_algos.shared_prefix import (
    SHARED_PREFIX_IMPLEMENTATIONS,
    SHARED_PREFIX_SDPA,
    SharedPrefixRows,
    body_parameters,
    prompt_lengths,
    shared_prefix_attention,
    shared_prefix_rows,
    unshare,
)
from rl_algos.varlen_attention import (
    PACKABLE_IMPLEMENTATIONS,
    VARLEN_SDPA,
    attention_configs,
    attention_implementation,
    register_attention,
    register_varlen_sdpa,
    switched_to,
)

__all__ = [
    "PackedRows",
    "PackingReport",
    "pack_rows",
    "packed_hidden_states",
    "packing_blocker",
    "row_lengths",
    "unpack",
]


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


def packed_hidden_states(
    policy: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    role: str = "actor",
    checked: bool = False,
    scored: torch.Tensor | None = None,
    report: PackingReport | None = None,
    min_saved_work: int = 0,
    router: RouterBalance | None = None,
    replay: RouterReplay | None = None,
) -> torch.Tensor:
    """[M, L, H] last hidden states of padded rows, computed as one packed sequence.

    Equal (to float rounding) to ``policy.hidden_states(input_ids, attention_mask, role)`` at
    every real token; zeros on the padding. With ``scored``, consecutive rows that start with
    the same prompt compute it once (:mod:`rl_algos.shared_prefix`; SDPA and eager attention).

    Args:
        policy: An :class:`rl_adapters.PolicyModel`.
        input_ids: [M, L] padded (right, left or both).
        attention_mask: [M, L], 1 on one contiguous span of each row.
        role: ``"actor"``, ``"reference"`` or ``"critic"``.
        checked: The caller has just found no :func:`packing_blocker` for these rows (the
            default's :meth:`PackingReport.choose`): not checked again.
        scored: [M, L - 1] bool, shifted by one: the positions the caller reads. Rows may share
            the tokens before their first scored one
            (:func:`rl_algos.shared_prefix.prompt_lengths`); None: no sharing.
        report: Counts the forwards in which rows shared a prefix
            (:attr:`PackingReport.shared_forwards`).
        min_saved_work: Rows that all have one length (no padding, which run as a plain
            batch otherwise) share only when the shared tokens times the model's per-token
            parameters (:func:`rl_algos.shared_prefix.body_parameters`) reach it; other rows
            share wherever a token is saved.
        router: Recording the forward's router logits: they are laid out per row with the
            hidden states ([M, L, H + Y * E], :meth:`RouterBalance.attach`).
        replay: Recording or replaying the forward's routes: told each flat position's row
            position (:func:`rl_algos.router_replay.laid_out`); pass ``scored=None`` with it.

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
    uniform = bool((lengths == lengths[0]).all()) and not bool(starts.any())
    if scored is not None and impl in SHARED_PREFIX_IMPLEMENTATIONS:
        # rows of one length run as a plain batch, without any layout to build: the shared
        # one must save min_saved_work (the whole batch shared would not: none is built)
        per_token = body_parameters(policy.causal_lm)
        need = min_saved_work if uniform else 0
        if input_ids.numel() * per_token >= need:
            min_saved = -(-need // max(per_token, 1))  # tokens, rounded up
            prefix = prompt_lengths(attention_mask, scored)
            shared = shared_prefix_rows(input_ids, starts, lengths, prefix, min_saved)
            if shared is not None:
                if report is not None:
                    report.shared_forwards += 1
                return _shared_hidden_states(policy, shared, role, router)
    if uniform:
        return _unpadded_hidden_states(policy, input_ids, int(lengths[0]), role, router, replay)
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
        register_varlen_sdpa()
        configs = attention_configs(policy.causal_lm if model is None else model)
        # replayable: a checkpointed layer recomputes with the varlen attention too
        switch = replayable(functools.partial(switched_to, tuple(configs), VARLEN_SDPA))
    with switch, laid_out(replay, rows.index):
        hidden: torch.Tensor = policy.hidden_states(
            rows.input_ids, None, role=role, position_ids=rows.position_ids, **extra
        )
    return unpack(hidden if router is None else router.attach(hidden), rows)


def _shared_hidden_states(
    policy: Any, rows: SharedPrefixRows, role: str, router: RouterBalance | None
) -> torch.Tensor:
    """[M, L, H] of :func:`packed_hidden_states`, each shared prefix computed once."""
    register_attention(SHARED_PREFIX_SDPA, shared_prefix_attention)
    model = policy.reference_model if role == "reference" else None
    configs = attention_configs(policy.causal_lm if model is None else model)
    # replayable: a checkpointed layer recomputes with the shared-prefix attention too
    switch = replayable(functools.partial(switched_to, tuple(configs), SHARED_PREFIX_SDPA))
    with switch:
        hidden: torch.Tensor = policy.hidden_states(
            rows.input_ids, None, role=role, position_ids=rows.position_ids, rl_shared_prefix=rows
        )
    return unshare(hidden if router is None else router.attach(hidden), rows)


def _unpadded_hidden_states(
    policy: Any,
    input_ids: torch.Tensor,
    length: int,
    role: str,
    router: RouterBalance | None,
    replay: RouterReplay | None = None,
) -> torch.Tensor:
    """[M, L, H]: rows that all hold ``length`` real tokens need no packing.

    Their first ``length`` columns are an ``[M, length]`` batch without padding, which is
    exactly what packing would compute (the padded forward of those columns, run without an
    attention mask, as transformers reads a mask of ones); the rest is zeros, as
    :func:`unpack` leaves it.
    """
    # no padding left: no mask either (what transformers assumes without one, exactly;
    # it skips the mask's inspection)
    switch: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if replay is not None:  # row m's column t is flat position m * length + t here
        M, L = input_ids.shape
        columns = torch.arange(length, device=input_ids.device)
        rows = torch.arange(M, device=columns.device)[:, None]
        switch = laid_out(replay, (rows * L + columns).reshape(-1))
    with switch:
        hidden: torch.Tensor = policy.hidden_states(input_ids[:, :length], None, role=role)
    if router is not None:
        hidden = router.attach(hidden)
    pad = input_ids.shape[1] - length
    return torch.nn.functional.pad(hidden, (0, 0, 0, pad)) if pad else hidden


def packing_blocker(model: Any, attention_mask: torch.Tensor) -> str | None:
    """Why the rows ``attention_mask`` [M, L] cannot run packed through ``model``, or None.

    Packing is exact when the attention implementation confines attention to each row
    (:data:`PACKABLE_IMPLEMENTATIONS`), each row's real tokens are one contiguous span
    (:func:`row_spans`; left padding is fine), some row is not empty, and, for SDPA/eager,
    no row is longer than a sliding window the model applies and its attention applies no
    logit soft-cap (which the packed SDPA cannot). ``flex_attention`` finds the
    rows from the ``position_ids`` (a restart): a left-padded row whose first position
    continues the previous row's would merge with it, so that layout is refused too.
    """
    impl = attention_implementation(model)
    reason = _model_blocker(model, impl)
    if reason is not None:
        return reason
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


def _model_blocker(model: Any, impl: str) -> str | None:
    """Why no rows can run packed through ``model`` (attention implementation ``impl``)."""
    if impl not in PACKABLE_IMPLEMENTATIONS:
        return (
            f"the model's attention implementation {impl!r} cannot confine attention to each "
            f"packed row (packable: {', '.join(PACKABLE_IMPLEMENTATIONS)}; load the model with "
            "attn_implementation='sdpa' or a flash-attention one)"
        )
    if impl in ("sdpa", "eager") and _softcap(model) is not None:
        return (
            "the model's attention applies a logit soft-cap (attn_logit_softcapping), which the "
            "packed SDPA attention cannot"
        )
    return None


def _softcap(model: Any) -> float | None:
    """The logit soft-cap a model's attention applies (Gemma 2's), or None."""
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)()
    cap = getattr(config, "attn_logit_softcapping", None)
    return None if cap is None else float(cap)


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
    shared_forwards: int = 0
    """Packed forwards in which rows shared a prompt (``share_prompt_prefix``)."""
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
