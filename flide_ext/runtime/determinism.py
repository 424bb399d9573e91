"""Deterministic mode (SGLang's ``--enable-deterministic-inference``): every
reduction of a round in an order fixed independently of the round's size and mix.

What Flide's own kernels already guarantee, in either mode: ForkAttention walks
a row's keys in tiles fixed by the head size and dtype, aligned to the row's own
path; the GDN chunks start at each segment's start and the inter-chunk and conv
kernels have fixed launch settings; the norms and element-wise kernels work per
row; the CPU path's GEMMs accumulate in float64 (:mod:`flide_ext.layers.linear`).
What the default GPU path does not guarantee: cuBLAS picks a GEMM's kernel (its
tiling, split-K) by the number of rows, which a question's round sets (the graph
capacity it replays, or the eager round's size). Deterministic mode replaces the
process's GEMMs (and log-softmax, mean) with SGLang's batch-invariant kernels
(``sglang.srt.batch_invariant_ops``: one fixed tiling for every row count, after
Thinking Machines' batch-invariant ops), as SGLang's own deterministic mode does,
before any CUDA graph is captured.
"""

from __future__ import annotations

import torch


def enable_deterministic(device: torch.device) -> str:
    """Turn deterministic mode on for this process's work on ``device``; says what
    it did. Process-wide and not undone (as SGLang's): call it in a process that
    serves, before its CUDA graphs are captured.

    Raises:
        RuntimeError: on CUDA, SGLang's batch-invariant kernels cannot be imported
            or enabled (the message says why).
    """
    if device.type != "cuda":
        return "per-row already: float64 GEMMs and the per-segment reference kernels"
    try:
        from sglang.srt.batch_invariant_ops import enable_batch_invariant_mode, is_batch_invariant_mode_enabled
    except ImportError as e:
        raise RuntimeError(f"deterministic mode needs SGLang's batch_invariant_ops ({e})") from None
    if not is_batch_invariant_mode_enabled():
        enable_batch_invariant_mode()
    return "SGLang's batch-invariant GEMM, log-softmax and mean kernels"
