"""Deterministic mode (SGLang's ``--enable-deterministic-inference``): every
reduction of a round in an order fixed independently of the round's size and mix.

What Flide's own kernels already guarantee, in either mode: ForkAttention walks
a row's keys in tiles fixed by the head size and dtype, aligned to the row's own
path; the GDN chunks start at each segment's start and the inter-chunk and conv
kernels have fixed launch settings; the norms and element-wise kernels work per
row; the CPU path's GEMMs accumulate in float64 (:mod:`flide_ext.layers.linear`).
What the default GPU path does not guarantee: cuBLAS picks a GEMM's kernel (its
tiling, split-K, stream-K) by the number of rows, which a question's round sets
(the graph capacity it replays, or the eager round's size).

Deterministic mode closes that for the GEMMs the process can run. At start, each
of the model's GEMM shapes (and the readout: LM head and log-softmax) runs on
random rows at every row count it may meet (multiples of :data:`ROW_STEPS`' steps
up to the round capacity), one row off from a reference run at the largest
count; a count whose rows differ from the reference's in any bit (another
kernel, or one whose reduction depends on the row's position) is moved to the
next larger count that matches. Every GEMM of that model then runs at its
checked count (:class:`~flide_ext.layers.linear.GemmRows`, held by the model:
another engine in the process keeps its own): every row gets the reference's
reduction, whatever its round. Where no count matches, the process falls back to
SGLang's batch-invariant kernels (``sglang.srt.batch_invariant_ops``: one fixed
tiling for every row count), before any CUDA graph is captured.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from ..layers.linear import GemmRows, Linear, StackedLinear, checked_rows, gemm_key
from ..layers.readout import head_logprobs, readout_key

logger = logging.getLogger(__name__)

# (limit, step): GEMM row counts are multiples of ``step`` up to ``limit`` rows;
# past the last limit, multiples of 1,024. The graph ladder's capacities are
# multiples of 32 up to 1,024 rows and of 64 beyond, so a replay of up to 16,384
# rows pads nothing (a larger graph pads to the next multiple of 256).
ROW_STEPS = ((1024, 32), (16384, 64), (65536, 256))
WIDE_STEP = 1024


def row_steps(max_rows: int) -> tuple:
    """:data:`ROW_STEPS` cut or extended to ``max_rows`` (rounded up to its step)."""
    steps = []
    for limit, step in ROW_STEPS:
        if max_rows <= limit:
            return (*steps, (max(-(-max_rows // step) * step, step), step))
        steps.append((limit, step))
    return (*steps, (-(-max_rows // WIDE_STEP) * WIDE_STEP, WIDE_STEP))


def model_gemms(model) -> dict:
    """The model's GEMMs: ``{key: (gemm(x), in_features, input dtype)}`` with
    :func:`~flide_ext.layers.linear.gemm_key` keys; each ``gemm`` runs a random
    weight of the layer's shape, dtype and device (the kernel choice depends on
    those, not on the values), the readout its LM head's own weight. Layers run
    only inside a :class:`~flide_ext.layers.linear.StackedLinear` count once, as
    the stack."""
    found = {}
    stacks = [v for m in model.modules() for v in vars(m).values() if isinstance(v, StackedLinear)]
    stacked = {id(layer) for stack in stacks for layer in stack.layers}

    def add(out_features, in_features, weight, has_bias):
        key = gemm_key(torch.empty(out_features, in_features, dtype=weight.dtype, device="meta"), weight.dtype,
                       weight.dtype, has_bias)
        if key in found:  # layers of one shape share one check (and one random weight)
            return
        w = torch.randn(out_features, in_features, dtype=weight.dtype, device=weight.device) / in_features ** 0.5
        b = torch.randn(out_features, dtype=weight.dtype, device=weight.device) if has_bias else None
        found[key] = (lambda x: F.linear(x, w, b), in_features, weight.dtype)

    for module in model.modules():
        if isinstance(module, Linear) and id(module) not in stacked and module is not getattr(model, "lm_head", None):
            add(module.out_features, module.in_features, module.weight, module.bias is not None)
    for stack in stacks:
        first = stack.layers[0]
        add(sum(stack.sizes), first.in_features, first.weight, first.bias is not None)
    head = getattr(model, "lm_head", None)
    if head is not None:
        weight = head.weight
        found[readout_key(weight, weight.dtype)] = (lambda x: head_logprobs(x, weight), weight.shape[1], weight.dtype)
    return found


def check_rows(gemm: Callable[[torch.Tensor], torch.Tensor], in_features: int, dtype: torch.dtype,
               device: torch.device, counts: Iterable[int], seed: int = 0) -> dict:
    """Which row counts give every row the bits of the reference (the largest count).

    ``x`` is ``[max + 1, in_features]`` random rows; the reference is
    ``gemm(x[1:])`` (``max`` rows), and each count ``c`` runs ``gemm(x[:c])``,
    whose row ``i >= 1`` must equal the reference's row ``i - 1`` bit for bit:
    the same rows at another count and one position off.

    Returns:
        ``{count: count it runs at}`` for the counts that differ, each moved to
        the next larger count that matched (the largest always runs as itself).

    Raises:
        RuntimeError: the largest count does not match itself one row off (its
            kernel's reduction depends on a row's position).
        ValueError: no counts.
    """
    counts = sorted(counts)
    if not counts:
        raise ValueError("check_rows needs at least one row count")
    top = counts[-1]
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(top + 1, in_features, generator=g, device=device, dtype=torch.float32).to(dtype)
    ref = gemm(x[1:].clone())  # a fresh, aligned input, as a padded one is
    bad = [c for c in counts if c > 1 and not torch.equal(gemm(x[:c])[1:], ref[:c - 1])]
    if top in bad:
        raise RuntimeError(f"a GEMM of {top} rows gives a row other bits one position down")
    moved, target = {}, top
    for c in reversed(counts):
        if c in bad:
            moved[c] = target
        else:
            target = c
    return moved


def enable_deterministic(device: torch.device, model=None, max_rows: int = 0, max_readout: int = 0) -> str:
    """Turn deterministic mode on for ``model`` on ``device``; says what it did.
    The checked row counts become ``model.gemm_rows`` (its forwards run at them);
    the fallback, SGLang's batch-invariant kernels, is process-wide and not undone
    (as SGLang's). Call it before the model's CUDA graphs are captured.

    Args:
        device: the model's device.
        model: the loaded model (on CUDA: its GEMMs are checked; None: SGLang's
            batch-invariant kernels).
        max_rows: the most rows a GEMM may have (the round's token capacity).
        max_readout: the most readout rows (the round's segment capacity;
            without selective readout the model's LM head block).

    Raises:
        RuntimeError: on CUDA, SGLang's batch-invariant kernels are needed and
            cannot be imported or enabled (the message says why).
    """
    if device.type != "cuda":
        return _said("per-row already: float64 GEMMs and the per-segment reference kernels")
    if model is not None and max_rows > 0:
        started = time.perf_counter()
        rows = GemmRows(row_steps(max_rows), {})
        counts = rows.padded_counts()
        if not getattr(model, "selective_readout", True):
            max_readout = max(max_readout, min(max_rows, model.full_readout_block))
        # Up to the first count that holds the most readout rows.
        readout_counts = counts[:bisect.bisect_left(counts, max(max_readout, 1)) + 1]
        moved = {}
        try:
            # Outside any model's counts: each GEMM is checked as it runs unpadded.
            with torch.inference_mode(), checked_rows(None):
                for key, (gemm, in_features, dtype) in model_gemms(model).items():
                    checked = readout_counts if key[0] == "readout" else counts
                    moved[key] = check_rows(gemm, in_features, dtype, device, checked)
        except RuntimeError as e:
            logger.warning("deterministic mode: %s; using SGLang's batch-invariant kernels", e)
        else:
            model.gemm_rows = GemmRows(rows.steps, {k: v for k, v in moved.items() if v})
            torch.cuda.empty_cache()
            n_moved = sum(len(v) for v in moved.values())
            return _said(f"cuBLAS GEMMs at row counts checked bitwise for {len(moved)} shapes up to {rows.max_rows} "
                    f"rows ({len(counts)} counts each, {n_moved} moved; {time.perf_counter() - started:.1f} s)")
    return _said(_batch_invariant())


def _said(what: str) -> str:
    logger.info("Deterministic mode: %s", what)
    return what


def _batch_invariant() -> str:
    try:
        from sglang.srt.batch_invariant_ops import enable_batch_invariant_mode, is_batch_invariant_mode_enabled
    except ImportError as e:
        raise RuntimeError(f"deterministic mode needs SGLang's batch_invariant_ops ({e})") from None
    if not is_batch_invariant_mode_enabled():
        enable_batch_invariant_mode()
    return "SGLang's batch-invariant GEMM, log-softmax and mean kernels"
