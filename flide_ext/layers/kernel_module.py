"""The base of every layer that calls Flide's kernels."""

from __future__ import annotations

from typing import Optional

from torch import nn


class KernelModule(nn.Module):
    """A layer whose kernel calls pass ``backend`` (:mod:`flide_ext.kernels.dispatch`:
    ``"triton"``, ``"reference"``, or None to pick by the input's device). A model
    sets it on all its layers at once when it is loaded
    (:meth:`flide_ext.models.base.FlatCausalLM.set_kernel_backend`)."""

    backend: Optional[str] = None
