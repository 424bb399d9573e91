"""Depthwise causal conv1d over varlen segments (GDN's short convolution): the
public functions, argument checks and dispatch. References in :mod:`.reference`,
Triton kernels in :mod:`.kernel`."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..arguments import argument
from ..dispatch import backend_for, checked_reference, reference_signature
from . import reference

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


def _check(x: torch.Tensor, activation) -> None:
    if x.dim() != 2:
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)} must be [T, C]")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not supported")


@reference_signature(reference.causal_conv1d_ref)
def causal_conv1d(*args, backend: Optional[str] = None, **kwargs) -> torch.Tensor:
    """The conv over some segments (e.g. one tree level); arguments, shapes and
    result as :func:`~.reference.causal_conv1d_ref`; ``backend`` as
    :mod:`flide_ext.kernels.dispatch`.

    Raises:
        ValueError: ``x`` not 2-D; an unsupported activation; on the Triton path ``out`` or
            ``conv_pool`` not contiguous.
    """
    x = argument(args, kwargs, 0, "x")
    _check(x, argument(args, kwargs, 8, "activation", "silu"))
    if backend_for(x, backend) == "triton":
        from .kernel import causal_conv1d_triton

        return causal_conv1d_triton(*args, **kwargs)
    return reference.causal_conv1d_ref(*args, **kwargs)


@reference_signature(reference.causal_conv1d_tree_ref)
def causal_conv1d_tree(*args, backend: Optional[str] = None, **kwargs):
    """The conv over a whole prefix tree at once; arguments, shapes and result as
    :func:`~.reference.causal_conv1d_tree_ref`; ``backend`` as
    :mod:`flide_ext.kernels.dispatch`.

    Raises:
        ValueError: ``x`` not 2-D; an unsupported activation; a ``split`` of more than three
            groups, or not summing to ``C``; on the Triton path ``conv_pool`` not
            contiguous.
    """
    x = argument(args, kwargs, 0, "x")
    _check(x, argument(args, kwargs, 10, "activation", "silu"))
    check_split(argument(args, kwargs, 11, "split"), x.shape[1])
    if backend_for(x, backend) == "triton":
        from .kernel import causal_conv1d_tree_triton

        return causal_conv1d_tree_triton(*args, **kwargs)
    return reference.causal_conv1d_tree_ref(*args, **kwargs)


causal_conv1d_ref = checked_reference(causal_conv1d, reference.causal_conv1d_ref)
causal_conv1d_tree_ref = checked_reference(causal_conv1d_tree, reference.causal_conv1d_tree_ref)
