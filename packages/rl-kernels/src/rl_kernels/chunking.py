"""Chunk sizing: how many rows of logits fit a memory budget."""

from __future__ import annotations

__all__ = ["DEFAULT_MEMORY_BUDGET", "auto_chunk_rows"]

#: Default budget for one fp32 logits tile: 256 MiB.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def auto_chunk_rows(
    vocab_size: int,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    *,
    total_rows: int | None = None,
    floor: int = 16,
    cap: int = 8192,
) -> int:
    """Rows per chunk so that one fp32 logits tile ``[rows, V]`` stays under ``memory_budget``.

    With ``total_rows`` (the M being processed) the chunk is also at most ``ceil(M / 8)``
    rows: a tile never holds more than an eighth of the full logits, so the fused path stays
    under 1/8 of the naive path's logits memory even when the budget would allow more.

    The kernels hold about two such tiles at once (logits and probabilities, then the logits
    gradient in place), so the peak extra memory is about ``2 * memory_budget`` plus the
    gradient buffers of the inputs. ``floor`` keeps the GEMMs efficient for huge vocabularies
    (at V = 152k and 16 rows a tile is 9.7 MB); ``cap`` bounds the chunk for tiny ones.

    Args:
        vocab_size: V (>= 1).
        memory_budget: Bytes allowed for one fp32 ``[rows, V]`` tile (>= 1).
        total_rows: M, the rows to process, or None (no relative cap).
        floor: Smallest chunk returned.
        cap: Largest chunk returned.

    Returns:
        ``clamp(min(memory_budget // (4 * V), ceil(M / 8)), floor, cap)``.
    """
    if vocab_size < 1:
        raise ValueError(f"`vocab_size` must be >= 1, got {vocab_size}")
    if memory_budget < 1:
        raise ValueError(f"`memory_budget` must be >= 1 byte, got {memory_budget}")
    if not 1 <= floor <= cap:
        raise ValueError(f"need 1 <= `floor` <= `cap`, got floor={floor}, cap={cap}")
    rows = memory_budget // (4 * vocab_size)
    if total_rows is not None:
        rows = min(rows, -(-total_rows // 8))
    return int(min(max(rows, floor), cap))
