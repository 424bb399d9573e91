"""The flat stream of a round: the prefix tree's segments laid back to back.

No padding, no delimiter tokens: each token keeps the logical position it has in
its own prompt, and carries the index of its segment. The segment table gives
each segment's parent, start offset in the stream, length, logical start and
request. Readout rows are the stream rows whose hidden states feed the LM head.

A request may *resume* from a checkpoint of its state's first L tokens: then its
tree is built over the prompts' tokens after L, its roots start at logical
position L, and a *virtual* segment (no stream rows) stands for the checkpoint:
its keys are the checkpoint's cached attention K/V, its GDN state a pool slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from .tree import PrefixTree, build_prefix_tree


@dataclass(frozen=True)
class Resume:
    """A checkpoint a request resumes from.

    Attributes:
        length: tokens the checkpoint covers (a strict prefix of every prompt).
        slot: GDN state-pool slot of the checkpoint (-1 for models without GDN layers).
        kv_start: first row of the checkpoint's K/V in the round's key prefix.
    """

    length: int
    slot: int
    kv_start: int


@dataclass
class FlatPlan:
    """One round as a flat token stream.

    Tensors are int64 on the plan's device. ``S`` counts real segments, ``S_all``
    real plus virtual (checkpoint) segments, which come last in the table.

    Attributes:
        token_ids: ``[T]`` token id of each stream row.
        positions: ``[T]`` logical position of each row (its index in its own prompt).
        token_segment: ``[T]`` segment index of each row.
        seg_parent: ``[S_all]`` parent segment, -1 for a root (virtual segments are
            roots; a resumed request's real roots have its virtual segment as parent).
        seg_start, seg_len: ``[S_all]`` query rows of each segment (virtual: length 0).
        seg_kv_start, seg_kv_len: ``[S_all]`` rows of each segment's keys in the
            attention key array, which is the key prefix (``num_prefix_rows`` rows of
            checkpoint K/V) followed by the stream's own keys.
        kv_positions: ``[P + T]`` logical position of each key row.
        seg_logical_start: ``[S_all]`` logical position of the segment's first token.
        seg_request, seg_depth: ``[S_all]`` request index and tree depth (virtual: -1).
        levels: per depth, the ``[n]`` real segment indices at that depth.
        readout_rows: ``[R]`` distinct stream rows read out, ascending.
        prompt_readout: ``[P]`` for each prompt, its index into ``readout_rows``.
        seg_slot, seg_initial_slot: ``[S]`` GDN pool slot of each real segment and
            the slot its initial state is read from (-1: zeros); set by
            :meth:`assign_slots`.
        resume: request index -> Resume, for requests resuming from a checkpoint.
        tree: the prefix tree of the (cut) prompts.
        tables: the GPU kernels' precomputed round tables
            (:class:`~flide_ext.kernels.tables.KernelTables`), or None: the
            kernels derive what they need from the tensors above.
        kv_index: ``[P + T]`` K/V pool row of each key-array row (the resumed
            prefixes' cached rows, then the stream's), or None: the key array is
            the key prefix and the stream's own K/V; set by :meth:`assign_kv_rows`.
        stream_rows: ``[T]`` the pool row each stream row's K/V is written to.
        kv_scratch: the pool row padding rows write to (graph rounds).
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    token_segment: torch.Tensor
    seg_parent: torch.Tensor
    seg_start: torch.Tensor
    seg_len: torch.Tensor
    seg_kv_start: torch.Tensor
    seg_kv_len: torch.Tensor
    kv_positions: torch.Tensor
    seg_logical_start: torch.Tensor
    seg_request: torch.Tensor
    seg_depth: torch.Tensor
    levels: list
    readout_rows: torch.Tensor
    prompt_readout: torch.Tensor
    tree: PrefixTree
    num_prefix_rows: int = 0
    resume: Mapping[int, Resume] = field(default_factory=dict)
    seg_slot: Optional[torch.Tensor] = None
    seg_initial_slot: Optional[torch.Tensor] = None
    tables: Optional[object] = field(default=None, repr=False)
    kv_index: Optional[torch.Tensor] = None
    stream_rows: Optional[torch.Tensor] = None
    kv_scratch: int = -1
    _level_tables: Optional[list] = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def num_segments(self) -> int:
        """Real segments (those with stream rows)."""
        return len(self.tree.segments)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def assign_slots(self, slots: Sequence[int]) -> None:
        """Give each real segment a GDN pool slot for its final state (-1: not kept,
        for segments no one reads from); each segment's initial state is its
        parent's slot, a resumed root's its checkpoint's slot, and zeros (-1) for
        other roots."""
        device = self.token_ids.device
        S = self.num_segments
        if len(slots) != S:
            raise ValueError(f"{len(slots)} slots for {S} segments")
        initial = []
        for s, seg in enumerate(self.tree.segments):
            if seg.parent >= 0:
                initial.append(slots[seg.parent])
            elif seg.request in self.resume:
                initial.append(self.resume[seg.request].slot)
            else:
                initial.append(-1)
        self.seg_slot = torch.from_numpy(np.asarray(slots, dtype=np.int64).reshape(-1)).to(device)
        self.seg_initial_slot = torch.from_numpy(np.asarray(initial, dtype=np.int64).reshape(-1)).to(device)
        self._level_tables = None

    def assign_kv_rows(self, prefix_rows, stream_rows, scratch: int) -> None:
        """Place the round's keys in a K/V pool: ``prefix_rows`` ``[P]`` the pool
        rows of the key prefix (the resumed checkpoints', in key order),
        ``stream_rows`` ``[T]`` the rows the stream's K/V go to, ``scratch`` the
        row padding writes to. Accepts int64 numpy arrays or tensors.

        Raises:
            ValueError: the row counts do not match the plan's prefix and stream.
        """
        prefix = torch.as_tensor(prefix_rows, dtype=torch.long).reshape(-1)
        stream = torch.as_tensor(stream_rows, dtype=torch.long).reshape(-1)
        if prefix.numel() != self.num_prefix_rows or stream.numel() != self.num_tokens:
            raise ValueError(f"{prefix.numel()} prefix and {stream.numel()} stream rows for a plan of "
                             f"{self.num_prefix_rows} prefix rows and {self.num_tokens} tokens")
        device = self.token_ids.device
        self.kv_index = torch.cat([prefix, stream]).to(device)
        self.stream_rows = stream.to(device)
        self.kv_scratch = int(scratch)

    def level_tables(self) -> list:
        """Per tree level, ``(seg_start, seg_len, initial_slot, final_slot)`` ``[n]``
        int64 tensors of its segments (slots from :meth:`assign_slots`). The same
        tensor objects on every call, so kernels can memoise per-round metadata
        on them (:mod:`flide_ext.kernels.round_cache`).

        Raises:
            ValueError: slots are not assigned yet.
        """
        if self.seg_slot is None:
            raise ValueError("assign_slots() must run before level_tables()")
        if self._level_tables is None:
            self._level_tables = [
                (self.seg_start[l], self.seg_len[l], self.seg_initial_slot[l], self.seg_slot[l]) for l in self.levels
            ]
        return self._level_tables


def plan_round(
    requests: Sequence[int],
    prompts: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
    resume: Optional[Mapping[int, Resume]] = None,
) -> FlatPlan:
    """Merge a round's prompts into prefix trees (one per request) and lay them out
    as a flat stream.

    Args:
        requests: for each prompt, the index of its request (prompts of one
            request may fork from each other; prompts of different requests never do).
        prompts: for each prompt, its full token ids (non-empty).
        device: where the plan's tensors live.
        resume: request index -> the checkpoint it resumes from; that checkpoint's
            ``length`` must be shorter than each of the request's prompts.

    Raises:
        ValueError: an empty prompt, or a checkpoint not shorter than a prompt.
    """
    resume = dict(resume or {})
    device = torch.device(device)  # parsed once, not at each tensor's .to()
    cut = []
    for r, p in zip(requests, prompts):
        skip = resume[r].length if r in resume else 0
        if skip and len(p) <= skip:
            raise ValueError("a checkpoint must be shorter than every prompt that resumes from it")
        cut.append(p[skip:])
    tree = build_prefix_tree(requests, cut)
    num_prefix = max((c.kv_start + c.length for c in resume.values()), default=0)

    S = len(tree.segments)
    virtual_index = {r: S + i for i, r in enumerate(sorted(resume))}
    starts, parent, logical, depth, seg_len = [], [], [], [], []
    offset = 0
    for index, seg in enumerate(tree.segments):
        base = resume[seg.request].length if seg.request in resume else 0
        n = len(seg.tokens)
        starts.append(offset)
        seg_len.append(n)
        parent.append(seg.parent if seg.parent >= 0 else virtual_index.get(seg.request, -1))
        logical.append(base + seg.logical_start)
        depth.append(seg.depth)
        offset += n
    # Per-token arrays in numpy: a long resumed prefix's key positions are
    # thousands of rows, too many to build as Python lists each round.
    lengths = np.asarray(seg_len, dtype=np.int64)
    token_segment = np.repeat(np.arange(S, dtype=np.int64), lengths)
    row_starts = np.asarray(starts, dtype=np.int64)
    positions = np.arange(offset, dtype=np.int64) - row_starts[token_segment] \
        + np.asarray(logical, dtype=np.int64)[token_segment]
    ids = np.concatenate([seg.tokens for seg in tree.segments]) if S else np.zeros(0, np.int64)
    kv_start = [num_prefix + s for s in starts]
    kv_len = list(seg_len)
    request = [s.request for s in tree.segments]
    kv_positions = np.zeros(num_prefix + offset, dtype=np.int64)
    for r in sorted(resume):
        c = resume[r]
        starts.append(offset)
        seg_len.append(0)
        kv_start.append(c.kv_start)
        kv_len.append(c.length)
        parent.append(-1)
        logical.append(0)
        depth.append(-1)
        request.append(r)
        kv_positions[c.kv_start : c.kv_start + c.length] = np.arange(c.length)
    kv_positions[num_prefix:] = positions

    ends = [starts[s] + seg_len[s] - 1 for s in tree.readout_segment]
    rows = sorted(set(ends))
    row_index = {row: i for i, row in enumerate(rows)}

    def t(values):
        # A list through NumPy: torch.tensor(list) costs three times as much,
        # and a plan makes over a dozen of these every round.
        return torch.from_numpy(np.asarray(values, dtype=np.int64)).to(device)

    by_depth: dict[int, list[int]] = {}
    for s, seg in enumerate(tree.segments):
        by_depth.setdefault(seg.depth, []).append(s)
    return FlatPlan(
        token_ids=t(ids),
        positions=t(positions),
        token_segment=t(token_segment),
        seg_parent=t(parent),
        seg_start=t(starts),
        seg_len=t(seg_len),
        seg_kv_start=t(kv_start),
        seg_kv_len=t(kv_len),
        kv_positions=t(kv_positions),
        seg_logical_start=t(logical),
        seg_request=t(request),
        seg_depth=t(depth),
        levels=[t(by_depth[d]) for d in sorted(by_depth)],
        readout_rows=t(rows),
        prompt_readout=t([row_index[e] for e in ends]),
        tree=tree,
        num_prefix_rows=num_prefix,
        resume=resume,
    )
