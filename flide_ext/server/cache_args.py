"""The server's state-cache flags: ``--disable-radix-cache`` (SGLang's),
``--state-cache-gb`` (Flide's) and SGLang's ``--mem-fraction-static``, turned
into the :class:`~flide_ext.runtime.engine.Engine`'s ``radix_cache`` and
``state_cache_bytes``.

Which budget the cache gets, first rule that applies:

1. ``--disable-radix-cache``: no cache (setting a budget as well is refused).
2. ``--state-cache-gb G``: ``G`` GiB (``G * 2**30`` bytes).
3. ``--mem-fraction-static F`` (a CUDA device only): ``F`` of the GPU's total
   memory, less the weights (the checkpoint's safetensors files, as sized on
   disk) and a reserve of :data:`RESERVE_BYTES` for one round's working memory
   and the CUDA context. Computed in the scheduler process, which owns the GPU;
   when nothing is left, a warning is logged and the default is used.
4. The engine's default (:func:`~flide_ext.runtime.cache_budget.default_cache_bytes`:
   40% of the GPU memory free after the weights and one round's working pools;
   256 MiB on the CPU).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Optional, Union

from ..protocol.errors import FlideError

logger = logging.getLogger(__name__)

GIB = 1 << 30
RESERVE_BYTES = 8 * GIB  # one round's working memory and the CUDA context, under --mem-fraction-static

Number = Union[int, float, str, None]


def _number(flag: str, value: Number) -> Optional[float]:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise FlideError(f"{flag} {value!r} is not a number") from None
    if not math.isfinite(out):
        raise FlideError(f"{flag} {value!r} is not a finite number")
    return out


def cache_settings(disable_radix_cache: bool, state_cache_gb: Number, mem_fraction_static: Number,
                   device: str) -> tuple[dict, Optional[float]]:
    """Check the flags (before any process starts, so a bad one is one line).

    Returns:
        The Engine's cache keyword arguments, and the ``--mem-fraction-static``
        fraction the scheduler sizes the cache from (None: nothing to size).

    Raises:
        FlideError: a budget that is not a positive number, a fraction outside
            (0, 1], a fraction without a CUDA device, or a budget together with
            ``--disable-radix-cache``.
    """
    gb = _number("--state-cache-gb", state_cache_gb)
    fraction = _number("--mem-fraction-static", mem_fraction_static)
    if disable_radix_cache:
        for flag, value in (("--state-cache-gb", gb), ("--mem-fraction-static", fraction)):
            if value is not None:
                raise FlideError(f"{flag} sizes the state cache, which --disable-radix-cache turns off; remove one")
        return {"radix_cache": False}, None
    if gb is not None:
        if gb <= 0 or int(gb * GIB) < 1:
            raise FlideError(f"--state-cache-gb {state_cache_gb} must be a positive number of GiB (2**30 bytes)")
        return {"state_cache_bytes": int(gb * GIB)}, None
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise FlideError(f"--mem-fraction-static {mem_fraction_static} must be in (0, 1]")
        if not str(device).startswith("cuda"):
            raise FlideError(f"--mem-fraction-static sizes the state cache from GPU memory and needs a CUDA device "
                             f"(--device {device}); use --state-cache-gb")
        return {}, fraction
    return {}, None


def weights_bytes(model_path: str) -> int:
    """The checkpoint's weights as stored: its safetensors files' sizes on disk."""
    return sum(p.stat().st_size for p in Path(model_path).glob("*.safetensors"))


def fraction_budget(fraction: float, total_memory: int, weights: int) -> Optional[int]:
    """``--mem-fraction-static``'s cache budget in bytes: ``fraction`` of
    ``total_memory`` less ``weights`` and :data:`RESERVE_BYTES`; None (the
    engine's default) with a warning when that is not positive."""
    budget = int(fraction * total_memory) - weights - RESERVE_BYTES
    if budget <= 0:
        logger.warning("--mem-fraction-static %s leaves no state cache (%.1f GiB of %.1f GiB, less %.1f GiB of weights "
                       "and a %d GiB reserve); using the default budget", fraction, fraction * total_memory / GIB,
                       total_memory / GIB, weights / GIB, RESERVE_BYTES // GIB)
        return None
    return budget


def device_fraction_budget(fraction: float, device: str, model_path: str) -> Optional[int]:
    """:func:`fraction_budget` on ``device``'s total memory (in the process that owns the GPU)."""
    import torch

    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return fraction_budget(fraction, total, weights_bytes(model_path))
