"""Chunk sizing: how many rows of logits fit a memory budget."""

from __future__ import annotations

__all__ = ["CPU_MIN_TILE_ROWS", "CPU_TILE_BYTES", "DEFAULT_MEMORY_BUDGET", "auto_chunk_rows"]

#: Default budget for one fp32 logits tile: 256 MiB.
DEFAULT_MEMORY_BUDGET = 256 * 2**20

#: On CPU, the largest tile ``auto_chunk_rows(..., cpu=True)`` prefers: just under 32 MiB,
#: the most glibc's ``malloc`` mmap threshold rises to. A larger block is mapped fresh on every
#: allocation and each of its pages faults (and is zeroed) on first touch; a smaller one is
#: reused from the heap, tile after tile.
CPU_TILE_BYTES = 32 * 2**20 - 2**16

#: The CPU cap applies only where it leaves a tile this many rows: every tile re-reads the
#: whole ``[V, H]`` weight, so fewer rows per tile cost more than the faults save. For the same
#: reason the eighth-of-M cap does not shrink a CPU tile below this many rows (or below
#: :data:`CPU_TILE_BYTES`, whichever is fewer rows).
CPU_MIN_TILE_ROWS = 256


def auto_chunk_rows(
    vocab_size: int,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    *,
    total_rows: int | None = None,
    floor: int = 16,
    cap: int = 8192,
    cpu: bool = False,
) -> int:
    """Rows per chunk so that one fp32 logits tile ``[rows, V]`` stays under ``memory_budget``.

    With ``total_rows`` (the M being processed) the chunk is also at most ``ceil(M / 8)``
    rows: a tile never holds more than an eighth of the full logits, so the fused path stays
    under 1/8 of the naive path's logits memory even when the budget would allow more. On CPU
    that cap stops at ``min(CPU_MIN_TILE_ROWS, cpu_rows)`` rows: small logits (M under 2,048
    rows of a vocabulary that fits) are cut into fewer, larger tiles, whose GEMMs run faster.

    The kernels hold about two such tiles at once (logits and probabilities, then the logits
    gradient in place), so the peak extra memory is about ``2 * memory_budget`` plus the
    gradient buffers of the inputs. ``floor`` keeps the GEMMs efficient for huge vocabularies
    (at V = 152k and 16 rows a tile is 9.7 MB); ``cap`` bounds the chunk for tiny ones.

    With ``cpu`` the tile is also kept under :data:`CPU_TILE_BYTES` where that still leaves it
    :data:`CPU_MIN_TILE_ROWS` rows or more (the tile sizes measured for both constants are in
    ``docs/benchmarks.md``, "How we got here").

    Args:
        vocab_size: V (>= 1).
        memory_budget: Bytes allowed for one fp32 ``[rows, V]`` tile (>= 1).
        total_rows: M, the rows to process, or None (no relative cap).
        floor: Smallest chunk returned.
        cap: Largest chunk returned.
        cpu: The tiles live in CPU memory (prefer tiles under :data:`CPU_TILE_BYTES`).

    Returns:
        ``clamp(min(memory_budget // (4 * V), eighth, cpu_rows), floor, cap)``, where
        ``cpu_rows = CPU_TILE_BYTES // (4 * V)`` with ``cpu`` when it is at least
        :data:`CPU_MIN_TILE_ROWS` (else no limit), and ``eighth = ceil(M / 8)``, on CPU at
        least ``min(CPU_MIN_TILE_ROWS, CPU_TILE_BYTES // (4 * V))``.
    """
    if vocab_size < 1:
        raise ValueError(f"`vocab_size` must be >= 1, got {vocab_size}")
    if memory_budget < 1:
        raise ValueError(f"`memory_budget` must be >= 1 byte, got {memory_budget}")
    if not 1 <= floor <= cap:
        raise ValueError(f"need 1 <= `floor` <= `cap`, got floor={floor}, cap={cap}")
    rows = memory_budget // (4 * vocab_size)
    cpu_rows = CPU_TILE_BYTES // (4 * vocab_size)
    if total_rows is not None:
        eighth = -(-total_rows // 8)
        rows = min(rows, max(eighth, min(CPU_MIN_TILE_ROWS, cpu_rows)) if cpu else eighth)
    if cpu and cpu_rows >= CPU_MIN_TILE_ROWS:
        rows = min(rows, cpu_rows)
    return int(min(max(rows, floor), cap))
