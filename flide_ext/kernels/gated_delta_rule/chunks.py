"""The chunk layout every GDN table builder shares: chunks of ``CHUNK`` rows
start at each segment's (sequence's) first row, so a segment of ``n`` rows has
``ceil(n / CHUNK)`` chunks, the last one partial. fla-core's chunked kernels
address chunks through a (sequence, chunk) table in this order.

Also the interface of the chunked algorithm's state-free steps
(:class:`ChunkSteps`), which the GPU tree pass runs with fla-core's kernels or
with their references."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

# Rows per chunk: fla-core's chunked kernels are built for 64.
CHUNK = 64


def chunk_layout(lengths: Sequence[int], chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks of sequences of the given lengths.

    Args:
        lengths: ``[n]`` rows of each sequence (0 allowed: no chunks).
        chunk: rows per chunk.

    Returns:
        ``(chunks [n], offsets [n+1], pairs [NT, 2])`` int64: each sequence's chunk
        count, the index of its first chunk (``offsets[-1]`` = NT), and every
        chunk's (sequence, chunk within the sequence), in order.
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    chunks = (lengths + chunk - 1) // chunk
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(chunks, out=offsets[1:])
    seq = np.repeat(np.arange(lengths.size, dtype=np.int64), chunks)
    pairs = np.empty((seq.size, 2), dtype=np.int64)
    pairs[:, 0] = seq
    pairs[:, 1] = np.arange(seq.size, dtype=np.int64) - offsets[seq]
    return chunks, offsets, pairs


def chunk_rows(bounds: Sequence[int], chunk: int = CHUNK) -> Iterator[tuple[int, int]]:
    """``(first row, end row)`` of every chunk of the sequences between
    consecutive ``bounds`` (cu_seqlens), in order."""
    bounds = [int(b) for b in bounds]
    for n in range(len(bounds) - 1):
        for t0 in range(bounds[n], bounds[n + 1], chunk):
            yield t0, min(t0 + chunk, bounds[n + 1])


@dataclass(frozen=True)
class ChunkSteps:
    """The state-free steps of the chunked algorithm, 2-D (no batch dimension),
    with the signatures of their references in :mod:`.reference`
    (``chunk_local_cumsum_ref``, ``chunk_wy_ref``, ``chunk_output_ref``) plus
    fla's ``chunk_indices`` table as the last argument."""

    l2norm: Callable  # [T, H, K] -> [T, H, K], rows scaled to unit norm (eps 1e-6)
    local_cumsum: Callable  # (g, cu_seqlens, chunk_indices) -> g_cum
    wy: Callable  # (k, v, g_cum, beta, cu_seqlens, chunk_indices) -> (w, u)
    output: Callable  # (q, k, v_new, h, g_cum, scale, cu_seqlens, chunk_indices) -> o
