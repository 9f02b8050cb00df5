"""Attention confined to each packed row, by attention implementation.

A packed forward (:mod:`rl_algos.packing`) runs ``M`` rows as one sequence ``[1, S]`` with
``attention_mask=None``, restarting ``position_ids`` and the rows' cumulative lengths
``cu_seq_lens_q/k`` (transformers' ``FlashAttentionKwargs``, passed down to every attention
call). Attention stays inside each row, by implementation:

* ``flash_attention_2`` / ``_3`` (CUDA only, not exercised by the CPU tests): transformers calls
  ``flash_attn_varlen_func`` with the cumulative lengths; cost ``sum_i L_i^2``.
* ``sdpa`` and ``eager`` (CPU and CUDA): for the packed forward the model runs
  :func:`varlen_sdpa_attention` (registered in transformers' ``AttentionInterface`` as
  ``"rl_varlen_sdpa"``; the config's implementation is switched for the forward and restored
  after by :func:`switched_to`, wrapped by the caller in a :func:`rl_adapters.replay.replayable`
  switch, so a checkpointed layer recomputes with it too): causal SDPA on each row's slice, so
  the cost is ``sum_i L_i^2`` and no ``[S, S]`` mask is built. Equal to the padded forward to
  float rounding.
* ``flex_attention``: transformers' own packed path. With ``attention_mask=None`` and
  restarting ``position_ids`` (no cache), ``masking_utils.create_causal_mask`` detects the
  packed layout (``find_packed_sequence_indices``) and builds a block-diagonal causal mask.
  The same detection makes SDPA/eager models correct when called with packed
  ``position_ids`` directly, at ``S^2`` cost (a dense ``[1, 1, S, S]`` mask).

Shapes: ``S`` packed tokens, ``M`` rows, ``d`` head dimension.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = [
    "FLASH_IMPLEMENTATIONS",
    "PACKABLE_IMPLEMENTATIONS",
    "UNSUPPORTED_ARGUMENTS",
    "VARLEN_SDPA",
    "attention_configs",
    "attention_implementation",
    "refuse_unsupported",
    "register_attention",
    "register_varlen_sdpa",
    "sdpa_key_value",
    "switched_to",
    "varlen_sdpa_attention",
]

#: Attention implementations whose varlen kernel reads ``cu_seq_lens`` (no mask is built).
FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
#: Attention implementations for which transformers builds the packed (block-diagonal) mask.
PACKABLE_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", *FLASH_IMPLEMENTATIONS)


def attention_implementation(model: Any) -> str:
    """The attention implementation a transformers model runs (``config._attn_implementation``)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


@contextlib.contextmanager
def switched_to(configs: Sequence[Any], impl: str) -> Iterator[None]:
    """Run the body with attention implementation ``impl`` in ``configs``; restore after."""
    saved = [c._attn_implementation_internal for c in configs]
    try:
        for c in configs:
            c._attn_implementation_internal = impl
        yield
    finally:
        for c, value in zip(configs, saved, strict=True):
            c._attn_implementation_internal = value


#: The name :func:`varlen_sdpa_attention` is registered under in transformers.
VARLEN_SDPA = "rl_varlen_sdpa"

#: Attention arguments some models pass that SDPA cannot apply (a logit soft-cap, attention
#: sinks, an additive position bias): the packed attention functions refuse them.
UNSUPPORTED_ARGUMENTS = ("softcap", "s_aux", "position_bias")


def refuse_unsupported(kwargs: dict[str, Any], name: str, fix: str) -> None:
    """Raise where the model passes an attention argument SDPA cannot apply.

    Raises:
        ValueError: One of :data:`UNSUPPORTED_ARGUMENTS` is set (not None); the message names
            it and ``fix``.
    """
    for key in UNSUPPORTED_ARGUMENTS:
        if kwargs.get(key) is not None:
            raise ValueError(f"{name} (SDPA) cannot apply the model's attention `{key}`: {fix}")


def attention_configs(model: Any) -> list[Any]:
    """The distinct configs (with an attention implementation) of a model's modules."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            seen.setdefault(id(config), config)
    return list(seen.values())


def register_attention(name: str, function: Any) -> None:
    """Register ``function`` in transformers' ``AttentionInterface`` as ``name`` (once)."""
    from transformers import AttentionInterface

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, function)


def register_varlen_sdpa() -> None:
    """Register :func:`varlen_sdpa_attention` in transformers' ``AttentionInterface`` (once)."""
    register_attention(VARLEN_SDPA, varlen_sdpa_attention)


def sdpa_key_value(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(key, value, enable_gqa)`` for SDPA under grouped-query attention (heads on dim 1).

    SDPA's ``enable_gqa`` (no copies), as transformers' SDPA path does without a mask; head
    dimensions above 256, or keys and values of different head dimensions, repeat the key and
    value heads instead.
    """
    gqa = query.shape[1] != key.shape[1] and key.shape[-1] == value.shape[-1] <= 256
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and not gqa:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return key, value, gqa


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
        ValueError: Without ``cu_seq_lens_q``, with a mask, with a row longer than a
            sliding window (a shorter row attends causally to all of itself either way), or
            with an argument SDPA cannot apply (:data:`UNSUPPORTED_ARGUMENTS`).
    """
    del module
    refuse_unsupported(kwargs, VARLEN_SDPA, "pass use_sequence_packing=False")
    if cu_seq_lens_q is None or attention_mask is not None or query.shape[0] != 1:
        raise ValueError(
            f"{VARLEN_SDPA} runs packed rows only: one sequence [1, S] with cu_seq_lens_q and "
            "no attention mask (rl_algos.packing.packed_hidden_states sets them)"
        )
    runs = row_runs(cu_seq_lens_q)
    if sliding_window is not None and max(length for _, _, length in runs) > int(sliding_window):
        raise ValueError(
            "sliding-window attention cannot be packed with SDPA here: pass "
            "use_sequence_packing=False (or use flash-attention on CUDA)"
        )
    key, value, gqa = sdpa_key_value(query, key, value)
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


#: The last ``cu_seq_lens_q`` read to the host, and its runs: every layer of a forward (and a
#: checkpointed layer's recomputation) gets the same tensor, so only the first layer reads it
#: back (on CUDA, a synchronisation with the device each time).
_LAST_RUNS: list[Any] = [None, -1, []]


def row_runs(cu_seq_lens: torch.Tensor) -> list[tuple[int, int, int]]:
    """:func:`_runs` of ``cu_seq_lens`` [M + 1], read to the host once per tensor (and version).

    An inference tensor (made by a forward in ``torch.inference_mode``, as the scoring
    forwards are) has no version counter: it is read once per tensor (the packing makes a new
    one per forward and nothing writes it).
    """
    version = -1 if cu_seq_lens.is_inference() else cu_seq_lens._version
    ref, last, runs = _LAST_RUNS
    if ref is not None and ref() is cu_seq_lens and last == version:
        return runs  # type: ignore[no-any-return]
    runs = _runs(cu_seq_lens.tolist())
    _LAST_RUNS[:] = [weakref.ref(cu_seq_lens), version, runs]
    return runs


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
