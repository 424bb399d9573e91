"""What every layer of one forward pass over a round needs besides its input."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..plan.flat import FlatPlan


@dataclass
class ForwardContext:
    """Per-forward state shared by the layers.

    Attributes:
        plan: the round's flat plan (segment table, levels, slots).
        rope: the rotary tables at the stream's logical positions, by name, each
            ``(cos, sin)`` ``[T, rotary_dim]``: ``""`` for a model with one set;
            Gemma 4 names its sliding and full layers' sets by layer type.
        state_pool: the engine's GDN state pool (hybrid models), else None.
        kv_pool: the K/V pool (``k``, ``v``: per attention layer ``[N, Hkv, D]``)
            that attention layers write the stream's K/V to (at
            ``plan.stream_rows``) and read every key from (through
            ``plan.kv_index``), or None: keys are the stream's own.
        residual_dtype: the residual stream's dtype (the first block's input
            is converted to it); None: the activations'.
        layer_kv: attention layer index -> its ``(k, v)`` ``[T, Hkv, D]`` of this
            forward, kept by the layers that lend them (KV sharing) when there
            is no K/V pool to read them from.
        per_layer_inputs: ``[T, layers, P]`` per-layer embeddings (Gemma 4), or None.
    """

    plan: FlatPlan
    rope: dict
    state_pool: Optional[object] = None
    kv_pool: Optional[object] = None
    residual_dtype: Optional[torch.dtype] = None
    layer_kv: dict = field(default_factory=dict)
    per_layer_inputs: Optional[torch.Tensor] = None
