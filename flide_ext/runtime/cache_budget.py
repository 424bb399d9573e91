"""How much memory the state cache gets and how it is split: K/V rows of
attention layers and GDN state slots (bytes throughout)."""

from __future__ import annotations

import torch

from .capacity import RoundCapacity
from .kv_pool import kv_row_bytes


def default_cache_bytes(device: torch.device, working_bytes: int = 0) -> int:
    """The state cache's default budget, in bytes: 40% of the GPU memory free
    once the weights are loaded and one round's working pools
    (``working_bytes``) are set aside; 256 MiB on the CPU.

    Free memory is read after torch's allocator hands back what it caches
    (loading the weights leaves blocks there that the driver counts as used).
    The round's pools are taken out first because they are allocated with the
    cache, before the graphs are captured: a budget of 40% of all free memory
    left too little for capturing the largest graphs on an 80 GB card.
    """
    if device.type != "cuda":
        return 256 << 20
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return max(int(0.4 * (free - working_bytes)), 1 << 20)


def round_working_bytes(model, dtype: torch.dtype, round_capacity: RoundCapacity) -> int:
    """Bytes of one full round's working pools: a K/V row for every token of
    the round and a GDN state slot for every request (:func:`cache_sizes`' row
    and slot sizes)."""
    row_bytes, slot_bytes = row_and_slot_bytes(model, dtype)
    return round_capacity.tokens * row_bytes + round_capacity.requests * slot_bytes


def row_and_slot_bytes(model, dtype: torch.dtype) -> tuple[int, int]:
    """Bytes of one K/V row (one token of every attention layer) and of one
    GDN state slot (one state of every GDN layer: float32 recurrent state and
    ``dtype`` conv window; 0 for models without GDN layers)."""
    item = torch.empty(0, dtype=dtype).element_size()
    row_bytes = kv_row_bytes(model.attention_shapes(), dtype)
    slot_bytes = 0
    if model.num_gdn_layers:
        (hv, kd, vd), conv = model.gdn_state_shapes()
        slot_bytes = model.num_gdn_layers * (hv * kd * vd * 4 + conv[0] * conv[1] * item)
    return row_bytes, slot_bytes


def cache_sizes(model, dtype: torch.dtype, budget: int) -> tuple[int, int, int]:
    """How a state-cache budget is spent: ``(K/V rows, GDN slots, bytes per slot)``.

    A K/V row holds one token of every attention layer; a slot one state of
    every GDN layer. GDN models give slots the share of the budget one
    checkpoint per ``2 * 1024`` cached tokens would take, at least 2 slots.

    Args:
        model: the Flide model.
        dtype: the model dtype.
        budget: bytes for the cache (0: none).
    """
    row_bytes, slot_bytes = row_and_slot_bytes(model, dtype)
    if budget <= 0:
        return 0, 0, slot_bytes
    slots = 0
    if slot_bytes:
        share = slot_bytes / (slot_bytes + 2048 * row_bytes)
        slots = max(2, int(budget * share) // slot_bytes)
    rows = max(budget - slots * slot_bytes, 0) // row_bytes if row_bytes else 0
    return int(rows), int(slots), slot_bytes
