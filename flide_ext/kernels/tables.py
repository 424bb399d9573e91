"""Every kernel's metadata for one round, built on the host in one pass.

The Triton kernels index a round's topology through small integer tables
(ForkAttention's segment paths and query blocks, the causal conv's history rows,
the GDN pass's chunk and level tables). Built on the host from the plan, they
reach the GPU in one copy per round, and the kernels never wait on the device
to size a launch. Built at a *capacity* larger than the round, every table has
a fixed shape and every launch a fixed grid, so one CUDA graph serves any round
that fits (:mod:`flide_ext.runtime.graph_runner`).

Padding follows one rule: entries past the round's own point at the *padding
segment*, the table's last entry, which has no rows, no keys, no parent and no
slots, so a program given it finds nothing to read or write. Stream rows past
the round's own belong to it too: kernels write zeros there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .fork_attention.paths import block_arrays, path_arrays
from .gated_delta_rule.chunks import CHUNK, chunk_layout


@dataclass(frozen=True)
class TableCapacity:
    """Sizes every table is padded to.

    Attributes:
        tokens: stream rows.
        segments: segments (real and checkpoint); the tables hold one more, the
            padding segment.
        levels: tree levels (one inter-chunk launch each in a GDN layer).
    """

    tokens: int
    segments: int
    levels: int

    @property
    def chunks(self) -> int:
        """Upper bound of GDN chunks: every segment adds at most one partial chunk."""
        return -(-self.tokens // CHUNK) + self.segments

    def blocks(self, tokens_per_block: int) -> int:
        """Upper bound of ForkAttention query blocks of ``tokens_per_block`` rows."""
        return -(-self.tokens // tokens_per_block) + self.segments


@dataclass
class KernelTables:
    """One round's kernel metadata (device tensors; int32 unless noted).

    ``S1`` is the table's segment count (capacity + 1, the last entry the padding
    segment), ``T`` its stream rows.

    Attributes:
        attention: ForkAttention's tables by block size (stream rows per
            program; a model whose attention layers have different head shapes,
            such as Gemma 4's sliding and full layers, may need two), each
            ``(num_blocks, block_seg [NB], block_row [NB], seg_start [S1],
            seg_len [S1], own_offset [S1], path_kv [S1, D], path_offset [S1, D],
            path_len [S1, D])`` with ``D = PATH_DEPTH``
            (:func:`flide_ext.kernels.fork_attention.paths.path_tables`).
        token_segment: ``[T]`` segment of each row (the padding segment past the round).
        seg_start, seg_len: ``[S1]`` stream rows of each segment.
        conv_history: ``[S1, W-1]`` the ``W-1`` conv inputs before each segment's
            first row on its path, oldest first: a stream row (>= 0), zero (-1), or
            entry ``-2 - h`` of the window in ``conv_pool[history_slot]`` (a
            checkpoint's).
        history_slot: ``[S1]`` state slot of the checkpoint a segment's path starts
            from (-1: none).
        initial_slot, final_slot: ``[S1]`` GDN state slots each segment starts from
            and ends in (-1: zeros / not kept).
        cu_seqlens: ``[S1 + 1]`` int64 row bounds of the segments as fla varlen
            sequences.
        chunk_indices: ``[NT, 2]`` int64 fla's (sequence, chunk) pairs; padding
            pairs name the padding segment.
        chunk_offsets: ``[S1 + 1]`` first chunk of each segment.
        level_range: ``[L, 2]`` first and end segment index of each tree level
            (padding levels are empty).
        num_levels: ``L``.
        level_programs: programs per value head and block in one inter-chunk launch.
        row_valid: ``[T]`` bool, False past the round's rows.
        padding_segment: ``S1 - 1``.
    """

    attention: dict
    token_segment: torch.Tensor
    seg_start: torch.Tensor
    seg_len: torch.Tensor
    conv_history: torch.Tensor
    history_slot: torch.Tensor
    initial_slot: torch.Tensor
    final_slot: torch.Tensor
    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    level_range: torch.Tensor
    num_levels: int
    level_programs: int
    row_valid: torch.Tensor
    padding_segment: int


def conv_history(parent, start, length, request, resumed, width: int) -> np.ndarray:
    """``[S, width-1]`` int64 history table (see :attr:`KernelTables.conv_history`).

    Args:
        parent, start, length, request: per real segment (lists or arrays), the
            tree parent (-1 root), first stream row, rows, request.
        resumed: requests whose roots continue a checkpoint's conv window.
        width: the conv kernel width W.
    """
    W1 = width - 1
    S = len(length)
    hist = np.full((S, W1), -1, dtype=np.int64)
    if S == 0 or W1 == 0:
        return hist
    parent = np.asarray(parent, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    # The common case at once: a parent at least W-1 rows long holds the whole history.
    p = np.maximum(parent, 0)
    simple = (parent >= 0) & (length[p] >= W1)
    ends = start[p] + length[p]
    hist[simple] = ends[simple, None] - W1 + np.arange(W1)[None, :]
    # Roots at once too: nothing before them, or a checkpoint's whole window.
    roots = parent < 0
    if resumed:
        lent = roots & np.isin(np.asarray(request, dtype=np.int64), list(resumed))
        hist[lent] = -2 - np.arange(W1)[None, :]
    for s in np.flatnonzero(~(simple | roots)):
        rows, node = [], int(parent[s])
        root = s
        while len(rows) < W1 and node >= 0:
            take = min(W1 - len(rows), int(length[node]))
            end = int(start[node] + length[node])
            rows.extend(range(end - 1, end - 1 - take, -1))
            root, node = node, int(parent[node])
        while node >= 0:  # the root of the path, for its checkpoint
            root, node = node, int(parent[node])
        entries = rows[::-1]
        missing = W1 - len(entries)
        if missing and int(request[root]) in resumed:
            # The newest missing inputs are the checkpoint window's last entries.
            entries = [-2 - h for h in range(W1 - missing, W1)] + entries
        else:
            entries = [-1] * missing + entries
        hist[s] = entries
    return hist


def _filled(size: int, value: int, dtype=np.int64) -> np.ndarray:
    # np.full without its Python-level wrapper (a round builds a dozen of these).
    out = np.empty(size, dtype=dtype)
    out.fill(value)
    return out


def table_arrays(plan, capacity: Optional[TableCapacity], conv_width: int, block_sizes: tuple[int, ...],
                 level_programs: Optional[int] = None) -> dict:
    """The tables of a round as host numpy arrays, padded to ``capacity``
    (int32, except ``cu_seqlens`` and ``chunk_indices`` int64 and ``row_valid``
    bool): what :class:`~flide_ext.runtime.round_buffers.RoundBuffers` copies
    to the device.

    Args:
        plan: the round's :class:`~flide_ext.plan.flat.FlatPlan` with CPU tensors and
            slots assigned (models with GDN layers).
        capacity: sizes to pad to; None pads to the round itself (plus the
            padding segment).
        conv_width: the GDN conv kernel width (any value >= 1 without GDN layers).
        block_sizes: ForkAttention's query rows per program, one entry per
            tile shape the model's attention layers use.
        level_programs: programs per inter-chunk launch (default: the largest level).

    Returns:
        The fields of :class:`KernelTables` (``attention`` a dict from block size to a
        tuple of its count and arrays).

    Raises:
        ValueError: the round does not fit ``capacity``.
    """
    T, S_all, L = plan.num_tokens, int(plan.seg_start.numel()), plan.num_levels
    S = plan.num_segments
    if capacity is None:
        capacity = TableCapacity(max(T, 1), S_all, max(L, 1))
    if T > capacity.tokens or S_all > capacity.segments or L > capacity.levels:
        raise ValueError(f"a round of {T} tokens, {S_all} segments and {L} levels does not fit {capacity}")
    S1, pad = capacity.segments + 1, capacity.segments
    # Host arrays throughout: a round's tables are a few dozen small array
    # operations, each a microsecond in numpy against several as a torch op.

    def padded(t, fill, size=S1):
        out = _filled(size, fill)
        out[:t.numel()] = t.numpy()
        return out

    seg_start = padded(plan.seg_start, T)
    seg_len = padded(plan.seg_len, 0)
    path_kv, path_offset, path_len, own = path_arrays(padded(plan.seg_parent, -1), padded(plan.seg_kv_start, 0),
                                                      padded(plan.seg_kv_len, 0))

    token_segment = _filled(capacity.tokens, pad, np.int32)
    token_segment[:T] = plan.token_segment.numpy()
    W1 = max(conv_width - 1, 0)
    history = _filled(S1 * W1, -1, np.int32).reshape(S1, W1)
    history_slot = _filled(S1, -1, np.int32)
    tree_parent = [seg.parent for seg in plan.tree.segments]
    requests = [seg.request for seg in plan.tree.segments]
    history[:S] = conv_history(tree_parent, seg_start[:S], seg_len[:S], requests, set(plan.resume), conv_width)
    for s in range(S) if plan.resume else ():  # only checkpoints lend windows
        r = requests[plan.tree.path(s)[0]]
        if r in plan.resume:
            history_slot[s] = plan.resume[r].slot
    initial = _filled(S1, -1, np.int32)
    final = _filled(S1, -1, np.int32)
    if plan.seg_slot is not None:
        initial[:S], final[:S] = plan.seg_initial_slot.numpy(), plan.seg_slot.numpy()

    _, chunk_offsets, pairs = chunk_layout(seg_len)
    NT_real = int(chunk_offsets[-1])
    chunk_indices = np.empty((capacity.chunks, 2), dtype=np.int64)
    chunk_indices[:NT_real] = pairs
    chunk_indices[NT_real:] = (pad, 0)
    cu_seqlens = np.empty(S1 + 1, dtype=np.int64)
    cu_seqlens[:S1], cu_seqlens[S1] = seg_start, T

    level_range = np.zeros((capacity.levels, 2), dtype=np.int32)
    widest = 1
    for d, members in enumerate(plan.levels):
        first, last = int(members.min()), int(members.max()) + 1
        if last - first != members.numel():
            raise ValueError("a tree level's segments must be consecutive in the segment table")
        level_range[d] = (first, last)
        widest = max(widest, last - first)
    row_valid = np.zeros(capacity.tokens, dtype=bool)
    row_valid[:T] = True

    seg_start32, seg_len32 = seg_start.astype(np.int32), seg_len.astype(np.int32)
    attention = {}
    for size in block_sizes:
        block_seg, block_row = block_arrays(seg_len, size)
        NB = capacity.blocks(size)
        blocks = _filled(NB, pad, np.int32)
        blocks[:block_seg.size] = block_seg
        block_rows = np.zeros(NB, dtype=np.int32)
        block_rows[:block_row.size] = block_row
        attention[size] = (NB, blocks, block_rows, seg_start32, seg_len32, own, path_kv, path_offset, path_len)
    return dict(
        attention=attention, token_segment=token_segment, seg_start=seg_start32, seg_len=seg_len32,
        conv_history=history, history_slot=history_slot, initial_slot=initial, final_slot=final,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets.astype(np.int32),
        level_range=level_range, num_levels=capacity.levels, level_programs=level_programs or widest,
        row_valid=row_valid, padding_segment=pad,
    )


def build_tables(plan, capacity: Optional[TableCapacity], conv_width: int, block_sizes: tuple[int, ...],
                 level_programs: Optional[int] = None) -> dict:
    """The tables of a round as host (CPU) tensors, padded to ``capacity``:
    :func:`table_arrays` with its arrays as tensors (sharing their memory).

    Returns:
        The fields of :class:`KernelTables` as CPU tensors (``attention`` a dict of tuples).

    Raises:
        ValueError: as :func:`table_arrays`.
    """
    arrays = table_arrays(plan, capacity, conv_width, block_sizes, level_programs)
    out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    out["attention"] = {size: (att[0],) + tuple(torch.from_numpy(a) for a in att[1:])
                        for size, att in arrays["attention"].items()}
    return out
