"""ForkAttention: attention over a round's flat stream under the fork visibility
rule (the rule and its reference in :mod:`.reference`). This module is the public
function: argument checks and dispatch to the reference or the Triton kernel
(:mod:`.kernel`, with its host tables in :mod:`.paths`)."""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import argument, check_groups, check_window
from ..dispatch import backend_for, checked_reference, reference_signature
from .paths import PATH_DEPTH, path_tables
from . import reference

__all__ = ["PATH_DEPTH", "fork_attention", "fork_attention_ref", "path_tables", "tokens_per_block"]


@reference_signature(reference.fork_attention_ref)
def fork_attention(*args, backend: Optional[str] = None, **kwargs) -> torch.Tensor:
    """ForkAttention; arguments, shapes and result as
    :func:`~.reference.fork_attention_ref`. ``backend``
    (:mod:`flide_ext.kernels.dispatch`): the Triton kernel (head sizes up to 512;
    ``tables``, the round's precomputed metadata by block size, holding this
    layer's tile shape, fixes its grid for CUDA graphs) or the reference (which
    ignores ``tables``).

    ``kv_index`` (``[Tk']`` int32 or int64, on ``q``'s device; None: the
    identity): the row of ``k`` and ``v`` holding each key-array position, so
    ``k`` ``[N, Hkv, D]`` and ``v`` ``[N, Hkv, Dv]`` may be K/V pools read in
    place; rows no used key-array position maps to are never read (they may
    hold anything, NaNs included). Its values are not checked (that would cost a
    device sync): ``Tk'`` must cover every key-array position a segment uses, and
    each value must be a row of ``k`` and ``v``.

    Raises:
        ValueError: ``q``, ``k`` or ``v`` not 3-D; ``Hq`` not a multiple of ``Hkv``; a sliding window below 1 or
            not whole; ``kv_index`` not a 1-D int32/int64 tensor on ``q``'s device;
            on the Triton path a head size over 512 or a segment path deeper than
            ``PATH_DEPTH``.
    """
    q, k, v = (argument(args, kwargs, i, name) for i, name in enumerate(("q", "k", "v")))
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"fork_attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                         "[rows, heads, head size]")
    check_groups(q.shape[1], k.shape[1], "query heads", "key heads")
    check_window(argument(args, kwargs, 11, "sliding_window"))
    _check_kv_index(argument(args, kwargs, 13, "kv_index"), q.device)
    if backend_for(q, backend) == "triton":
        from .kernel import fork_attention_triton

        return fork_attention_triton(*args, **kwargs)
    return reference.fork_attention_ref(*args, **kwargs)


def _check_kv_index(kv_index: Optional[torch.Tensor], device: torch.device) -> None:
    """Raises ValueError unless ``kv_index`` is None or a 1-D int32/int64 tensor on ``device``."""
    if kv_index is None:
        return
    if not isinstance(kv_index, torch.Tensor):
        raise ValueError(f"fork_attention: kv_index must be a 1-D int32 or int64 tensor, not {type(kv_index).__name__}")
    if kv_index.dim() != 1 or kv_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fork_attention: kv_index must be a 1-D int32 or int64 tensor, not {kv_index.dtype} "
                         f"{tuple(kv_index.shape)}")
    if kv_index.device != device:
        raise ValueError(f"fork_attention: kv_index is on {kv_index.device}, q on {device}")


def tokens_per_block(D: int, dtype: torch.dtype, group: int) -> int:
    """Stream rows one Triton program covers for head size ``D``, ``dtype`` and
    ``group`` query heads per key head (the block size of the round's tables)."""
    from .kernel import tokens_per_block as rows

    return rows(D, dtype, group)


fork_attention_ref = checked_reference(fork_attention, reference.fork_attention_ref)
