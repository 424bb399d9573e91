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
        cos, sin: ``[T, rotary_dim]`` rotary tables at the stream's logical positions.
        state_pool: the engine's GDN state pool (hybrid models), else None.
        kv_prefix: per attention layer, the ``(k, v)`` ``[P, Hkv, D]`` of the
            checkpoints this round resumes from (stacked in the plan's key order),
            or None when it resumes from none.
        kv_capture: when not None, attention layers append their ``(k, v)`` of the
            stream rows here (for new checkpoints), in layer order.
    """

    plan: FlatPlan
    cos: torch.Tensor
    sin: torch.Tensor
    state_pool: Optional[object] = None
    kv_prefix: Optional[list] = None
    kv_capture: Optional[list] = field(default=None)
