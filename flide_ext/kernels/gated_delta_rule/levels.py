"""Host-side metadata of tree levels and whole trees for the GPU gated delta
rule: varlen bounds and fla's chunk tables (from :func:`~.chunks.chunk_layout`),
built once per round and memoised (:mod:`flide_ext.kernels.round_cache`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..round_cache import round_cache
from .chunks import chunk_layout

@dataclass
class LevelMeta:
    """Host-side facts and varlen tables of one tree level (built once per round)."""

    lo: int  # first stream row of the level's (non-empty) segments
    hi: int  # one past the last row
    max_len: int
    forked: bool  # some segment starts from a parent state
    cu_seqlens: torch.Tensor  # [n+1] int64, relative to lo, non-empty segments only
    chunk_indices: Optional[torch.Tensor]  # fla's (sequence, chunk) table, [NT, 2]
    chunk_offsets: torch.Tensor  # [n+1] first chunk of each sequence
    num_chunks: int
    initial: torch.Tensor  # [n] int32 slots of the non-empty segments
    final: torch.Tensor
    through: Optional[tuple[torch.Tensor, torch.Tensor]]  # empty segments: (from, to) slots


def _level_meta(seg_start, seg_len, initial_slot, final_slot) -> LevelMeta:
    lens = seg_len.tolist()
    starts = seg_start.tolist()
    initial = initial_slot.tolist()
    keep = [i for i, n in enumerate(lens) if n > 0]
    empty = [i for i, n in enumerate(lens) if n == 0]
    device = seg_start.device
    through = None
    if empty:
        idx = torch.tensor(empty, device=device)
        src, dst = initial_slot[idx], final_slot[idx]
        keep_dst = dst >= 0
        through = (src[keep_dst], dst[keep_dst])
    if not keep:
        z = torch.zeros(1, dtype=torch.long, device=device)
        return LevelMeta(0, 0, 0, False, z, None, z, 0, z[:0].int(), z[:0].int(), through)
    lo = starts[keep[0]]
    bounds, pos = [0], lo
    for i in keep:
        if starts[i] != pos:
            raise ValueError("a tree level's segments must lie back to back in stream order")
        pos += lens[i]
        bounds.append(pos - lo)
    _, offsets, pairs = chunk_layout([lens[i] for i in keep])
    idx = torch.tensor(keep, device=device)
    return LevelMeta(
        lo=lo, hi=pos, max_len=max(lens[i] for i in keep),
        forked=any(initial[i] >= 0 for i in keep),
        cu_seqlens=torch.tensor(bounds, dtype=torch.long, device=device),
        chunk_indices=torch.from_numpy(pairs).to(device),
        chunk_offsets=torch.from_numpy(offsets).to(device),
        num_chunks=int(offsets[-1]),
        initial=initial_slot[idx].int(), final=final_slot[idx].int(), through=through,
    )


def level_meta(seg_start, seg_len, initial_slot, final_slot) -> LevelMeta:
    """:class:`LevelMeta` of a level, memoised for the round (:mod:`flide_ext.kernels.round_cache`).

    Raises:
        ValueError: the non-empty segments do not lie back to back in stream order.
    """
    tensors = (seg_start, seg_len, initial_slot, final_slot)
    return round_cache.get("gdn_level", tensors, lambda: _level_meta(*tensors))


def pass_through(meta: LevelMeta, state_pool: torch.Tensor) -> None:
    """Copy each kept empty segment's initial state to its final slot (an empty
    segment's state is its initial state; zeros for none)."""
    if meta.through is not None and meta.through[0].numel():
        src, dst = meta.through
        state = torch.where((src >= 0)[:, None, None, None], state_pool[src.clamp(min=0)], 0)
        state_pool[dst] = state.to(state_pool.dtype)


@dataclass
class TreeMeta:
    """Host-side facts and varlen tables of a whole tree (built once per round):
    every non-empty segment of every level, in stream order, as one varlen batch."""

    lo: int  # first stream row of the tree's segments
    hi: int  # one past the last row
    cu_seqlens: torch.Tensor  # [n+1] int64, relative to lo
    chunk_indices: torch.Tensor  # fla's (sequence, chunk) table, [NT, 2]
    num_chunks: int
    levels: list  # per level: (LevelMeta, first chunk of the level in the tree's numbering)


def _tree_meta(levels) -> Optional[TreeMeta]:
    metas = [level_meta(*level) for level in levels]
    spans = sorted((start, n) for level in levels for start, n in zip(level[0].tolist(), level[1].tolist()) if n > 0)
    if not spans:
        return None
    bounds, first_chunk = [0], {}
    _, offsets, pairs = chunk_layout([n for _, n in spans])
    lo = pos = spans[0][0]
    for i, (start, n) in enumerate(spans):
        if start != pos:
            return None  # rows between segments: the levels run one by one instead
        first_chunk[start] = int(offsets[i])
        pos += n
        bounds.append(pos - lo)
    device = levels[0][0].device
    return TreeMeta(
        lo=lo, hi=pos,
        cu_seqlens=torch.tensor(bounds, dtype=torch.long, device=device),
        chunk_indices=torch.from_numpy(pairs).to(device),
        num_chunks=int(offsets[-1]),
        levels=[(m, first_chunk.get(m.lo, 0)) for m in metas],
    )


def tree_meta(levels) -> Optional[TreeMeta]:
    """:class:`TreeMeta` of a tree's level tables, memoised for the round
    (:mod:`flide_ext.kernels.round_cache`); None when the segments leave rows between them.

    Raises:
        ValueError: a level's non-empty segments do not lie back to back in stream order.
    """
    tensors = tuple(t for level in levels for t in level)
    return round_cache.get("gdn_tree", tensors, lambda: _tree_meta(levels))
