"""Per-round kernel metadata, memoised on the identity of the plan tensors.

Every layer of one forward passes the same plan tensors (segment table, a
level's rows and slots) to its kernels, so tables derived from them (paths,
query blocks, chunk indices, host-side sizes) are built once per round instead
of once per layer; building them is where the host waits for the device.
A tensor changed in place through autograd-tracked ops (its version counter
moved) is a miss. Inference tensors carry no version counter, and writes through
``.data`` or NumPy views move none: callers must not change plan tensors in
place; a new round builds new tensors (static buffers for CUDA graphs need their
own metadata, not this cache).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Sequence

import torch


class RoundCache:
    """A small LRU map from (kind, tensors by identity) to derived metadata.

    Args:
        capacity: entries kept. A round has about two per tree level (GDN level
            tables, conv row blocks) and a few more (ForkAttention paths, the GDN
            tree), up to ~36 at the deepest tree (``MAX_TREE_DEPTH``); every layer
            asks for all of them, so the cache must hold a whole round's.
    """

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._entries: OrderedDict = OrderedDict()

    def get(self, kind: Hashable, tensors: Sequence[torch.Tensor], build: Callable[[], object]):
        """The metadata of ``kind`` for ``tensors``, built by ``build()`` on a miss."""
        # Inference tensors keep no version counter (and cannot be changed in
        # place outside inference mode); identity alone keys them.
        key = (kind,) + tuple((id(t), -1 if t.is_inference() else t._version) for t in tensors)
        entry = self._entries.get(key)
        # The entry holds the tensors themselves, so their ids cannot be reused
        # by other tensors while it lives.
        if entry is not None and all(a is b for a, b in zip(entry[0], tensors)):
            self._entries.move_to_end(key)
            return entry[1]
        value = build()
        self._entries[key] = (tuple(tensors), value)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value


round_cache = RoundCache()
