"""ForkAttention's host-side tables: each segment's root-to-leaf path and the
query blocks, built with numpy (a few small array operations; as torch
operations each would cost a launch or a dispatch)."""

from __future__ import annotations

import numpy as np
import torch

# Segments one path-table row holds: the deepest request tree the planner
# accepts (flide_ext.plan.tree.MAX_TREE_DEPTH is derived from it) plus the
# checkpoint segment a resumed request's path starts with. The Triton kernel
# walks every row to this width, so it is fixed: a question's path is walked
# the same way alone, forked or resumed.
PATH_DEPTH = 16


def path_tables(seg_parent: torch.Tensor, seg_kv_start: torch.Tensor, seg_kv_len: torch.Tensor, depth: int = PATH_DEPTH):
    """Each segment's root-to-leaf path as tables ``[S, depth]`` (int32): key start
    row, path offset and key count of each path segment (count 0 past the leaf),
    and ``[S]`` the path offset of the segment's own first key. Computed on the
    host (a few small array operations; as torch operations each would cost a
    launch or a dispatch); returned on the inputs' device.

    Raises:
        ValueError: a path is deeper than ``depth`` segments.
    """
    arrays = path_arrays(host_array(seg_parent), host_array(seg_kv_start), host_array(seg_kv_len), depth)
    return tuple(torch.from_numpy(a).to(seg_parent.device) for a in arrays)


def host_array(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.int64, copy=False)


def path_arrays(parent: np.ndarray, kv_start: np.ndarray, kv_len: np.ndarray, depth: int = PATH_DEPTH):
    """:func:`path_tables` on int64 host arrays; returns int32 arrays ``(kv, offset, count, own)``."""
    S = parent.size
    # A sentinel entry past the end: index -1 (no segment) reads parent -1, keys 0.
    up = np.append(parent, -1)
    chain = np.empty((S, depth + 1), dtype=np.int64)  # chain[:, i]: the i-th segment up from the leaf
    chain.fill(-1)
    cur = chain[:, 0] = np.arange(S)
    for i in range(depth):
        cur = up[cur]
        if S == 0 or cur.max() < 0:
            break
        chain[:, i + 1] = cur
    if S and bool((chain[:, depth] >= 0).any()):
        raise ValueError(f"ForkAttention handles segment paths of at most {depth} segments")
    length = (chain[:, :depth] >= 0).sum(1)
    # Root first: entry j of a path of n segments is chain entry n-1-j; past the
    # leaf, column ``depth`` (always -1).
    pick = length[:, None] - 1 - np.arange(depth)[None, :]
    pick[pick < 0] = depth
    root_first = chain[np.arange(S)[:, None], pick]
    kv = np.append(kv_start, 0)[root_first]
    count = np.append(kv_len, 0)[root_first]
    offset = np.cumsum(count, axis=1) - count
    own = offset[np.arange(S), np.maximum(length - 1, 0)] if S else np.zeros(0, np.int64)
    return tuple(np.ascontiguousarray(a, dtype=np.int32) for a in (kv, offset, count, own))


def block_arrays(seg_len: np.ndarray, block_m: int):
    """ForkAttention's query blocks on the host: ``(block_seg, block_row)`` int32,
    every ``block_m`` rows of each segment (an empty segment has none)."""
    blocks = (seg_len + block_m - 1) // block_m
    block_seg = np.repeat(np.arange(seg_len.size), blocks)
    first_block = np.cumsum(blocks) - blocks
    block_row = (np.arange(block_seg.size) - first_block[block_seg]) * block_m
    return block_seg.astype(np.int32), block_row.astype(np.int32)
