"""Which implementation a kernel call runs: the Triton kernel on CUDA tensors, the
PyTorch reference elsewhere; one switch forces the reference everywhere.

The switch is the environment variable ``FLIDE_REFERENCE_KERNELS`` (read at
each call; any value but empty or ``0`` forces the reference) or the :func:`force_reference` context manager, e.g. to compare the
two paths on the same GPU inputs. For tests on a CPU machine,
:func:`force_triton` sends CPU tensors to the Triton kernels, which then run
under the Triton interpreter (``TRITON_INTERPRET=1`` set before they are imported).
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

_local = threading.local()


def reference_forced() -> bool:
    """True when the reference is forced by the environment or :func:`force_reference`."""
    if getattr(_local, "forced", 0):
        return True
    return os.environ.get("FLIDE_REFERENCE_KERNELS", "") not in ("", "0")


@contextlib.contextmanager
def force_reference():
    """Run every kernel call inside the block through its PyTorch reference (this thread)."""
    _local.forced = getattr(_local, "forced", 0) + 1
    try:
        yield
    finally:
        _local.forced -= 1


@contextlib.contextmanager
def force_triton():
    """Run kernel calls inside the block through the Triton kernels even for CPU
    tensors (this thread; only meaningful under ``TRITON_INTERPRET=1``)."""
    _local.triton = getattr(_local, "triton", 0) + 1
    try:
        yield
    finally:
        _local.triton -= 1


def use_triton(x: torch.Tensor) -> bool:
    """True when a call on ``x`` should run the Triton kernel: ``x`` is on CUDA (or
    :func:`force_triton` is active) and the reference is not forced."""
    return (x.is_cuda or getattr(_local, "triton", 0) > 0) and not reference_forced()
