"""Depthwise causal conv1d over varlen segments (GDN's short convolution): the
public functions, argument checks and dispatch. References in :mod:`.reference`,
Triton kernels in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..dispatch import backend_for
from .reference import causal_conv1d_ref, causal_conv1d_tree_ref

__all__ = ["causal_conv1d", "causal_conv1d_ref", "causal_conv1d_tree", "causal_conv1d_tree_ref", "check_split"]

ACTIVATIONS = ("silu", None)


def check_split(split: Optional[Sequence[int]], C: int) -> None:
    """Raises ValueError unless ``split`` is None or one to three positive channel
    counts summing to ``C``."""
    if split is None:
        return
    if (isinstance(split, torch.Tensor) or not 1 <= len(split) <= 3
            or any(type(n) is not int or n < 1 for n in split) or sum(split) != C):
        raise ValueError(f"split {split!r} must be one to three positive int channel counts summing to {C}")


def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not supported")


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_pool: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    initial_slot: torch.Tensor,
    final_slot: torch.Tensor,
    activation: Optional[str] = "silu",
    out: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """The conv over some segments (e.g. one tree level); arguments, shapes and
    result as :func:`~.reference.causal_conv1d_ref`; ``backend`` as
    :mod:`flide_ext.kernels.dispatch`.

    Raises:
        ValueError: an unsupported activation; on the Triton path ``out`` or
            ``conv_pool`` not contiguous.
    """
    _check_activation(activation)
    args = (x, weight, bias, conv_pool, seg_start, seg_len, initial_slot, final_slot, activation, out)
    if backend_for(x, backend) == "triton":
        from .kernel import causal_conv1d_triton

        return causal_conv1d_triton(*args)
    return causal_conv1d_ref(*args)


def causal_conv1d_tree(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_pool: torch.Tensor,
    token_segment: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    history: torch.Tensor,
    history_slot: torch.Tensor,
    final_slot: torch.Tensor,
    activation: Optional[str] = "silu",
    split: Optional[Sequence[int]] = None,
    backend: Optional[str] = None,
):
    """The conv over a whole prefix tree at once; arguments, shapes and result as
    :func:`~.reference.causal_conv1d_tree_ref`; ``backend`` as
    :mod:`flide_ext.kernels.dispatch`.

    Raises:
        ValueError: an unsupported activation; a ``split`` of more than three
            groups, or not summing to ``C``; on the Triton path ``conv_pool`` not
            contiguous.
    """
    _check_activation(activation)
    check_split(split, x.shape[1])
    args = (x, weight, bias, conv_pool, token_segment, seg_start, seg_len, history, history_slot, final_slot,
            activation, split)
    if backend_for(x, backend) == "triton":
        from .kernel import causal_conv1d_tree_triton

        return causal_conv1d_tree_triton(*args)
    return causal_conv1d_tree_ref(*args)
