"""ForkAttention: attention over a round's flat stream under the fork visibility rule.

Query row t may attend key row s iff both lie in the same request, s lies on t's
root-to-leaf segment path (an ancestor segment or t's own segment), and s is not
later than t in logical position (DESIGN.md, "ForkAttention visibility rule").
Optionally a sliding window also requires ``pos[t] - pos[s] < window``.

Each segment's queries see the whole of every ancestor segment and their own
segment causally, so this is ordinary causal attention of the question's full
prompt, computed without materialising any stream x stream mask.

Keys and values are addressed through the *key array*: segment ``s``'s keys are
key-array positions ``seg_kv_start[s] .. seg_kv_start[s] + seg_kv_len[s]``, and
``kv_positions`` gives each key-array position's logical position. Without
``kv_index`` the key array is ``k``/``v`` themselves (position ``j`` is row ``j``);
with it, position ``j`` is row ``kv_index[j]`` of ``k`` and ``v``, which may then be
larger K/V pools read in place (rows no path reaches are never read).
"""

from __future__ import annotations

from typing import Optional

import torch


# Query rows per block in the reference, so a long state's score matrix
# stays a few hundred MB at most.
_QUERY_BLOCK = 512


def _segment_key_rows(segment: int, parent: list[int], kv_start: list[int], kv_len: list[int]) -> torch.Tensor:
    path = []
    s = segment
    while s >= 0:
        path.append(s)
        s = parent[s]
    rows = [torch.arange(kv_start[a], kv_start[a] + kv_len[a]) for a in reversed(path)]
    return torch.cat(rows)


def fork_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seg_parent: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    seg_kv_start: torch.Tensor,
    seg_kv_len: torch.Tensor,
    positions: torch.Tensor,
    kv_positions: torch.Tensor,
    scale: float,
    sliding_window: Optional[int] = None,
    tables: Optional[tuple] = None,
    kv_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Plain PyTorch ForkAttention, segment by segment, accumulated in float64.

    Scores, softmax and the weighted sum run in float64 and are rounded once to
    ``q.dtype``, so a row's output does not depend on how many rows or keys share
    its block (float32 matmuls pick their reduction order by shape): a question
    gets the same bits inside a round as alone.

    Args:
        q: ``[T, Hq, D]`` queries of the flat stream (any float dtype).
        k: ``[Tk, Hkv, D]`` keys, the key array itself (a prefix of cached
            checkpoint rows, then one row per stream row); or, with ``kv_index``,
            a K pool ``[N, Hkv, D]`` of any row count ``N`` whose row
            ``kv_index[j]`` holds key-array position ``j`` (other rows are never
            read and may hold anything, NaNs included). ``Hq`` must be a multiple
            of ``Hkv`` (GQA).
        v: ``[Tk, Hkv, Dv]`` values, laid out like ``k`` (with ``kv_index``, a V pool
            ``[N, Hkv, Dv]`` indexed as ``k``).
        seg_parent: ``[S]`` int64 parent segment, -1 for a root.
        seg_start, seg_len: ``[S]`` int64 query rows of each segment (0 rows allowed:
            a checkpoint segment only lends its keys).
        seg_kv_start, seg_kv_len: ``[S]`` int64 key-array positions of each
            segment's keys; a segment with query rows has as many keys, in the
            same order.
        positions: ``[T]`` int64 logical position of each query row.
        kv_positions: ``[Tk]`` int64 logical position of each key-array position
            (indexed by key-array position, not by pool row, also with ``kv_index``).
        scale: softmax scale (usually ``D ** -0.5``).
        sliding_window: if set, key s is visible to query t only when
            ``positions[t] - kv_positions[s] < sliding_window``.
        tables: the Triton kernel's precomputed metadata (ignored here).
        kv_index: ``[Tk']`` int32 or int64 pool row of each key-array position
            (``Tk'`` at least every key-array position a segment uses, each value a
            row of ``k`` and ``v``; neither is checked here); None: the identity,
            ``k`` and ``v`` are the key array.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``. Rows not covered by any segment are zero.

    Arguments are checked by :func:`flide_ext.kernels.fork_attention.fork_attention`.
    """
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    out = torch.zeros(T, Hq, v.shape[-1], dtype=q.dtype, device=q.device)
    parent, start, length = seg_parent.tolist(), seg_start.tolist(), seg_len.tolist()
    kv_start, kv_len = seg_kv_start.tolist(), seg_kv_len.tolist()
    for s in range(len(start)):
        n = length[s]
        if n == 0:
            continue
        rows = _segment_key_rows(s, parent, kv_start, kv_len).to(q.device)
        kv_rows = rows if kv_index is None else kv_index[rows].long()  # pool row of each key
        keys = k[kv_rows].double()  # [M, Hkv, D]
        values = v[kv_rows].double()
        key_pos = kv_positions[rows]
        prefix = rows.numel() - n  # keys from ancestor segments
        for b in range(0, n, _QUERY_BLOCK):
            e = min(n, b + _QUERY_BLOCK)
            queries = q[start[s] + b : start[s] + e].double().view(e - b, Hkv, G, D)
            scores = torch.einsum("qhgd,khd->hgqk", queries, keys) * scale
            own = torch.arange(b, e, device=q.device)[:, None]
            key_idx = torch.arange(rows.numel(), device=q.device)[None, :]
            visible = key_idx < prefix + own + 1  # ancestors, then own segment causally
            if sliding_window is not None:
                q_pos = positions[start[s] + b : start[s] + e][:, None]
                visible = visible & (q_pos - key_pos[None, :] < sliding_window)
            scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            o = torch.einsum("hgqk,khd->qhgd", probs, values)
            out[start[s] + b : start[s] + e] = o.reshape(e - b, Hq, -1).to(q.dtype)
    return out
