"""Argument checks shared by each kernel's reference and its Triton kernel, so
both refuse the same inputs with the same message."""

from __future__ import annotations

from typing import Optional

import torch


def check_groups(heads: int, shared_heads: int, heads_name: str, shared_name: str) -> None:
    """Grouped heads: each of ``shared_heads`` serves ``heads // shared_heads`` heads
    (GQA's key heads for query heads, GDN's key heads for value heads).

    Raises:
        ValueError: ``heads`` is not a positive multiple of ``shared_heads``.
    """
    if shared_heads < 1 or heads < shared_heads or heads % shared_heads:
        raise ValueError(f"{heads_name} {heads} are not a multiple of {shared_name} {shared_heads}")


def check_window(sliding_window: Optional[float]) -> None:
    """Raises ValueError unless the sliding window is None or a whole number >= 1 (tokens)."""
    if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive whole number of tokens, not {sliding_window!r}")


def check_written(**tensors: torch.Tensor) -> None:
    """Tensors a kernel writes in place cannot be replaced by contiguous copies.

    Raises:
        ValueError: naming the first argument that is not contiguous.
    """
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (it is written in place)")


# Dtypes the element-wise kernels take: they compute in float32, so float64
# inputs keep the reference's precision only in the reference.
FLOAT32_MATH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def float32_math_dtypes(*tensors: Optional[torch.Tensor]) -> bool:
    """True when every given tensor (None skipped) has a dtype of ``FLOAT32_MATH_DTYPES``."""
    return all(t is None or t.dtype in FLOAT32_MATH_DTYPES for t in tensors)


def check_float32_math_dtypes(kernel: str, **tensors: Optional[torch.Tensor]) -> None:
    """Raises ValueError naming the first argument (None skipped) whose dtype is not
    one of ``FLOAT32_MATH_DTYPES``."""
    for name, t in tensors.items():
        if t is not None and t.dtype not in FLOAT32_MATH_DTYPES:
            raise ValueError(f"{kernel}: {name} dtype {t.dtype} is not one of float32, bfloat16, float16")


def check_heads(key_heads: int, value_heads: int) -> None:
    """Gated DeltaNet heads: each key head serves ``value_heads // key_heads`` value heads.

    Raises:
        ValueError: ``value_heads`` is not a positive multiple of ``key_heads``.
    """
    check_groups(value_heads, key_heads, "value heads", "key heads")


def argument(args: tuple, kwargs: dict, index: int, name: str, default=None):
    """A call's argument ``name``, given at position ``index`` or by keyword (else
    ``default``): what a public kernel function passing ``*args, **kwargs`` on to
    its reference or kernel reads for its checks."""
    return args[index] if len(args) > index else kwargs.get(name, default)
