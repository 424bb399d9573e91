"""The flat stream of a round: the prefix tree's segments laid back to back.

No padding, no delimiter tokens: each token keeps the logical position it has in
its own prompt, and carries the index of its segment. The segment table gives
each segment's parent, start offset in the stream, length, logical start and
request. Readout rows are the stream rows whose hidden states feed the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .tree import PrefixTree, build_prefix_tree


@dataclass
class FlatPlan:
    """One round as a flat token stream.

    Tensors are int64 (``torch.long``) on the device given to :func:`plan_round`.

    Attributes:
        token_ids: ``[T]`` token id of each stream row.
        positions: ``[T]`` logical position of each row (its index in its own prompt).
        token_segment: ``[T]`` segment index of each row.
        seg_parent: ``[S]`` parent segment, -1 for a root.
        seg_start: ``[S]`` first stream row of the segment.
        seg_len: ``[S]`` number of rows of the segment.
        seg_logical_start: ``[S]`` logical position of the segment's first token.
        seg_request: ``[S]`` request index of the segment.
        seg_depth: ``[S]`` tree depth (0 for roots).
        readout_rows: ``[R]`` distinct stream rows read out, ascending.
        prompt_readout: ``[P]`` for each prompt, its index into ``readout_rows``.
        tree: the prefix tree the stream was laid from.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    token_segment: torch.Tensor
    seg_parent: torch.Tensor
    seg_start: torch.Tensor
    seg_len: torch.Tensor
    seg_logical_start: torch.Tensor
    seg_request: torch.Tensor
    seg_depth: torch.Tensor
    readout_rows: torch.Tensor
    prompt_readout: torch.Tensor
    tree: PrefixTree

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def num_segments(self) -> int:
        return int(self.seg_start.numel())

    @property
    def num_levels(self) -> int:
        return self.tree.num_levels


def plan_round(
    requests: Sequence[int],
    prompts: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
) -> FlatPlan:
    """Merge a round's prompts into a prefix tree and lay it out as a flat stream.

    Args:
        requests: for each prompt, the index of its request (prompts of one
            request may fork from each other; prompts of different requests never do).
        prompts: for each prompt, its full token ids (non-empty).
        device: where the plan's tensors live.

    Raises:
        ValueError: a prompt is empty.
    """
    tree = build_prefix_tree(requests, prompts)
    starts, ids, positions, token_segment = [], [], [], []
    offset = 0
    for index, seg in enumerate(tree.segments):
        starts.append(offset)
        n = len(seg.tokens)
        ids.extend(seg.tokens)
        positions.extend(range(seg.logical_start, seg.logical_start + n))
        token_segment.extend([index] * n)
        offset += n
    seg_len = [len(s.tokens) for s in tree.segments]
    ends = [starts[s] + seg_len[s] - 1 for s in tree.readout_segment]
    rows = sorted(set(ends))
    row_index = {row: i for i, row in enumerate(rows)}

    def t(values):
        return torch.tensor(values, dtype=torch.long, device=device)

    return FlatPlan(
        token_ids=t(ids),
        positions=t(positions),
        token_segment=t(token_segment),
        seg_parent=t([s.parent for s in tree.segments]),
        seg_start=t(starts),
        seg_len=t(seg_len),
        seg_logical_start=t([s.logical_start for s in tree.segments]),
        seg_request=t([s.request for s in tree.segments]),
        seg_depth=t([s.depth for s in tree.segments]),
        readout_rows=t(rows),
        prompt_readout=t([row_index[e] for e in ends]),
        tree=tree,
    )
