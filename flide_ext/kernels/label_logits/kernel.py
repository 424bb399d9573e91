"""Triton label logits: one program per (readout row, label) pair, the products
accumulated in float32 over fixed blocks of the hidden size, so a pair's value
is the same whatever the other pairs of its round (the launch's size changes
the number of programs, never a program's order of additions)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arguments import check_float32_math_dtypes

BLOCK = 1024  # hidden elements per step of a program's loop


@triton.jit
def _label_logits_kernel(X, W, ROWS, LABELS, OUT, stride_x, stride_w, HIDDEN: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    row = tl.load(ROWS + p).to(tl.int64)
    label = tl.load(LABELS + p).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, HIDDEN, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < HIDDEN
        a = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(W + label * stride_w + cols, mask=mask, other=0.0).to(tl.float32)
        acc += a * b
    tl.store(OUT + p, tl.sum(acc, axis=0))


def label_logits_triton(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor,
                        labels: torch.Tensor) -> torch.Tensor:
    """:func:`flide_ext.kernels.label_logits.label_logits_ref`'s contract, with
    float32 accumulation (bf16 / fp16 products are exact in float32).

    Raises:
        ValueError: a dtype other than float32, bfloat16 or float16.
    """
    check_float32_math_dtypes("label_logits_triton", x=x, weight=weight)
    hidden = x.shape[1]
    if rows.numel() == 0 or hidden == 0:  # no pairs; or empty rows, whose dot products are 0
        return torch.zeros(rows.numel(), dtype=torch.float32, device=x.device)
    out = torch.empty(rows.numel(), dtype=torch.float32, device=x.device)
    # Rows are read at their own stride: a head that is a view of a larger tensor
    # is never copied (a 248k-row head is a gigabyte); only a transposed one would be.
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    _label_logits_kernel[(rows.numel(),)](
        x, weight, rows.contiguous(), labels.contiguous(), out, x.stride(0), weight.stride(0),
        HIDDEN=hidden, BLOCK=min(BLOCK, triton.next_power_of_2(hidden)), num_warps=4,
    )
    return out
