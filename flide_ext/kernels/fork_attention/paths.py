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
    chain = np.full((S, depth + 1), -1, dtype=np.int64)  # chain[:, i]: the i-th segment up from the leaf
    chain[:, 0] = np.arange(S)
    for i in range(depth):
        cur = chain[:, i]
        up = cur >= 0
        if not up.any():
            break
        chain[up, i + 1] = parent[cur[up]]
    if S and bool((chain[:, depth] >= 0).any()):
        raise ValueError(f"ForkAttention handles segment paths of at most {depth} segments")
    leaf_first = chain[:, :depth]  # -1 past the root
    length = (leaf_first >= 0).sum(1, keepdims=True)
    level = np.arange(depth)[None, :]
    pick = np.maximum(length - 1 - level, 0)
    root_first = np.where(level < length, np.take_along_axis(leaf_first, pick, 1), -1)
    valid = root_first >= 0
    idx = np.maximum(root_first, 0)
    kv = np.where(valid, kv_start[idx], 0) if S else np.zeros((0, depth), np.int64)
    count = np.where(valid, kv_len[idx], 0) if S else np.zeros((0, depth), np.int64)
    offset = np.cumsum(count, axis=1) - count
    own = np.take_along_axis(offset, np.maximum(length - 1, 0), 1)[:, 0]
    return tuple(np.ascontiguousarray(a, dtype=np.int32) for a in (kv, offset, count, own))


def block_arrays(seg_len: np.ndarray, block_m: int):
    """ForkAttention's query blocks on the host: ``(block_seg, block_row)`` int32,
    every ``block_m`` rows of each segment (an empty segment has none)."""
    blocks = (seg_len + block_m - 1) // block_m
    block_seg = np.repeat(np.arange(seg_len.size), blocks)
    first_block = np.cumsum(blocks) - blocks
    block_row = (np.arange(block_seg.size) - first_block[block_seg]) * block_m
    return block_seg.astype(np.int32), block_row.astype(np.int32)
