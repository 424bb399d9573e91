"""The GDN state pool: fixed-size recurrent states and conv windows in slots.

One slot holds, for every GDN layer of the model, a recurrent state
``[HV, K, V]`` (float32; float64 in the CPU float32 reference) and a conv window ``[C, W-1]`` (model dtype); a slot
index means the same position in every layer. A round takes one slot per
segment that has children (or whose state is kept); a child segment reads its
parent's slot by index. Slots of states kept
as checkpoints stay taken until the checkpoint is evicted.
"""

from __future__ import annotations

import torch


class StatePool:
    """Slots of GDN state for all GDN layers.

    Args:
        recurrent_shape: ``(HV, K, V)`` of one layer's recurrent state.
        conv_shape: ``(C, W-1)`` of one layer's conv window.
        num_layers: GDN layers in the model.
        conv_dtype: dtype of the conv windows (the model dtype).
        device: where the pool lives.
        capacity: initial slot count; the pool doubles when it runs out.
        recurrent_dtype: dtype of the recurrent states (float32; float64 for the
            CPU reference).
    """

    def __init__(self, recurrent_shape, conv_shape, num_layers, conv_dtype, device, capacity: int = 8,
                 recurrent_dtype: torch.dtype = torch.float32):
        self.recurrent_shape, self.conv_shape = tuple(recurrent_shape), tuple(conv_shape)
        self.conv_dtype, self.device = conv_dtype, device
        self.recurrent = [
            torch.zeros(capacity, *self.recurrent_shape, dtype=recurrent_dtype, device=device) for _ in range(num_layers)
        ]
        self.conv = [torch.zeros(capacity, *self.conv_shape, dtype=conv_dtype, device=device) for _ in range(num_layers)]
        self.free = list(range(capacity))
        #: Bumped whenever the pool grows (its tensors are replaced): CUDA graphs
        #: captured over the old tensors must be captured again.
        self.generation = 0

    @property
    def capacity(self) -> int:
        return self.recurrent[0].shape[0] if self.recurrent else 0

    @property
    def num_free(self) -> int:
        """Slots free now (the pool grows beyond them on demand)."""
        return len(self.free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free slots (growing the pool if needed)."""
        while len(self.free) < n:
            old = self.capacity
            grow = max(old, n - len(self.free))
            self.recurrent = [
                torch.cat([t, torch.zeros(grow, *t.shape[1:], dtype=t.dtype, device=t.device)]) for t in self.recurrent
            ]
            self.conv = [torch.cat([t, torch.zeros(grow, *t.shape[1:], dtype=t.dtype, device=t.device)]) for t in self.conv]
            self.free.extend(range(old, old + grow))
            self.generation += 1
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def release(self, slots) -> None:
        """Return slots to the pool."""
        self.free.extend(int(s) for s in slots)
