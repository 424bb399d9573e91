"""The paged K/V pool: every attention layer's keys and values in rows of one
token each, allocated and freed by row index.

A round's stream writes its K/V into rows it takes from the pool; the rows of
tokens the state cache keeps stay taken (they belong to a radix-tree node) and
the rest go back. ForkAttention reads any row in place through the round's
``kv_index`` (key-array position -> pool row), so resuming from a cached prefix
copies no K/V. Page size is one token, as SGLang's token-level radix cache.
"""

from __future__ import annotations

import numpy as np
import torch


class PoolFullError(RuntimeError):
    """More rows asked for than the pool has free (the caller evicts first)."""


def kv_row_bytes(layer_shapes, dtype: torch.dtype) -> int:
    """Bytes of one K/V row: one token's keys and values in every attention
    layer of ``layer_shapes`` (``(Hkv, D, Dv)`` each), in ``dtype``."""
    item = torch.empty(0, dtype=dtype).element_size()
    return sum((h * d + h * dv) * item for h, d, dv in layer_shapes)


class KVPool:
    """Rows of K/V for all attention layers.

    Args:
        layer_shapes: per attention layer (in the model's attention order)
            ``(Hkv, D, Dv)``.
        dtype: K/V dtype (the model dtype).
        device: where the pool lives.
        rows: allocatable rows. One more row, :attr:`scratch_row`, takes the
            writes of a padded graph round's padding rows.

    Memory is reserved with ``torch.empty``: rows never written are never read
    (ForkAttention only reads the rows a round's ``kv_index`` names).
    """

    def __init__(self, layer_shapes, dtype: torch.dtype, device, rows: int):
        if rows < 1:
            raise ValueError(f"a K/V pool needs at least one row, not {rows}")
        self.dtype, self.device, self.rows = dtype, torch.device(device), int(rows)
        self.k = [torch.empty(rows + 1, h, d, dtype=dtype, device=device) for h, d, _ in layer_shapes]
        self.v = [torch.empty(rows + 1, h, dv, dtype=dtype, device=device) for h, _, dv in layer_shapes]
        self.row_bytes = kv_row_bytes(layer_shapes, dtype)
        # A stack of free rows: the lowest rows come out first.
        self._free = np.arange(rows - 1, -1, -1, dtype=np.int64)
        self._top = rows

    @property
    def scratch_row(self) -> int:
        return self.rows

    @property
    def num_free(self) -> int:
        return self._top

    def allocate(self, n: int) -> np.ndarray:
        """Take ``n`` free rows.

        Returns:
            ``[n]`` int64 row indices.

        Raises:
            PoolFullError: fewer than ``n`` rows are free.
        """
        if n > self._top:
            raise PoolFullError(f"{n} K/V rows asked for, {self._top} free of {self.rows}")
        taken = self._free[self._top - n:self._top][::-1].copy()
        self._top -= n
        return taken

    def release(self, rows: np.ndarray) -> None:
        """Return rows to the pool."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        self._free[self._top:self._top + rows.size] = rows[::-1]
        self._top += rows.size
