"""The gated delta rule over a round's prefix tree, states forked by index: the
public functions (argument checks and dispatch).

Leaves, one way: :mod:`.reference` (plain PyTorch, what CPU runs),
:mod:`.chunks` (the chunk layout every table builder shares), and the GPU path
split by step: :mod:`.recurrent_kernel` (token by token), :mod:`.states_kernel`
(the inter-chunk step, the one that touches the state), :mod:`.fla_steps`
(fla-core's state-free steps), :mod:`.levels` (host metadata of levels and
trees) and :mod:`.tree_kernel` (a level or a whole tree composed of those).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..arguments import argument, check_heads
from ..dispatch import backend_for, reference_signature
from . import fla_steps as fla  # the module: binding its function here would hide the submodule's name
from .chunks import CHUNK, ChunkSteps
from .fla_steps import fla_available
from .reference import (
    chunk_gated_delta_rule_ref,
    chunk_local_cumsum_ref,
    chunk_output_ref,
    chunk_states_ref,
    chunk_wy_ref,
    gated_delta_rule_tree_ref,
    recurrent_gated_delta_rule_ref,
)

__all__ = [
    "CHUNK", "chunk_gated_delta_rule", "chunk_gated_delta_rule_ref", "chunk_states_ref", "fla_available",
    "gated_delta_rule_tree", "gated_delta_rule_tree_ref", "needs_level_tables", "recurrent_gated_delta_rule_ref",
    "reference_steps", "table_steps",
]


def reference_steps() -> ChunkSteps:
    """The PyTorch references of the state-free steps (float64 inside); lets the
    tree's composition run on CPU with the interpreted inter-chunk kernel."""

    def l2norm(x):
        xf = x.double()
        return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)

    return ChunkSteps(
        l2norm=l2norm,
        local_cumsum=lambda g, cu, ci: chunk_local_cumsum_ref(g, cu),
        wy=lambda k, v, g_cum, beta, cu, ci: chunk_wy_ref(k, v, g_cum, beta, cu),
        output=lambda q, k, v_new, h, g_cum, scale, cu, ci: chunk_output_ref(q, k, v_new, h, g_cum, scale, cu),
    )


def table_steps(x: torch.Tensor) -> Optional[ChunkSteps]:
    """The state-free steps the table-driven GPU pass runs with: fla-core's; under
    the Triton interpreter (CPU tensors) their references; None on a GPU without
    fla-core (the levels then run one by one, from the level tables)."""
    if fla_available():
        return fla.fla_steps()
    return None if x.is_cuda else reference_steps()


def needs_level_tables(x: torch.Tensor, tables, backend: Optional[str] = None) -> bool:
    """Whether :func:`gated_delta_rule_tree` on ``x`` needs the plan's level tables
    (:meth:`flide_ext.plan.flat.FlatPlan.level_tables`): always, except on the
    Triton path with the round's kernel tables and steps to run them with
    (building level tables would add launches to a CUDA graph)."""
    return not (tables is not None and backend_for(x, backend) == "triton" and table_steps(x) is not None)


@reference_signature(chunk_gated_delta_rule_ref)
def chunk_gated_delta_rule(*args, backend: Optional[str] = None, **kwargs) -> torch.Tensor:
    """One tree level; arguments and result as :func:`~.reference.chunk_gated_delta_rule_ref`.
    ``backend`` (:mod:`flide_ext.kernels.dispatch`): the GPU path
    (:func:`~.tree_kernel.gated_delta_rule_forked`) or the reference.

    Raises:
        ValueError: HV not a multiple of H; on the GPU path a ``chunk_size`` other
            than ``CHUNK`` (fla's WY kernels are built for 64-row chunks), or a
            level whose segments do not lie back to back in stream order.
    """
    k, v = argument(args, kwargs, 1, "k"), argument(args, kwargs, 2, "v")
    check_heads(k.shape[1], v.shape[1])
    if backend_for(v, backend) == "triton":
        chunk_size = kwargs.pop("chunk_size", args[13] if len(args) > 13 else CHUNK)
        if chunk_size != CHUNK:
            raise ValueError(f"the GPU gated delta rule runs {CHUNK}-row chunks, not chunk_size={chunk_size}")
        from .tree_kernel import gated_delta_rule_forked

        return gated_delta_rule_forked(*args[:13], **kwargs)
    return chunk_gated_delta_rule_ref(*args, **kwargs)


@reference_signature(gated_delta_rule_tree_ref)
def gated_delta_rule_tree(*args, backend: Optional[str] = None, **kwargs) -> torch.Tensor:
    """A whole prefix tree; arguments and result as :func:`~.reference.gated_delta_rule_tree_ref`.
    ``backend`` (:mod:`flide_ext.kernels.dispatch`): the GPU pass
    (:func:`~.tree_kernel.gated_delta_rule_tree_triton`, with the round's
    ``tables`` when :func:`table_steps` has steps for them; ``levels`` may then
    be empty, see :func:`needs_level_tables`) or the reference.

    Raises:
        ValueError: HV is not a multiple of H; on the GPU path ``state_pool`` not
            contiguous, or a level whose segments do not lie back to back in
            stream order.
    """
    k, v = argument(args, kwargs, 1, "k"), argument(args, kwargs, 2, "v")
    check_heads(k.shape[1], v.shape[1])
    if backend_for(v, backend) == "triton":
        from .tree_kernel import gated_delta_rule_tree_triton

        tables = argument(args, kwargs, 10, "tables")
        steps = table_steps(v) if tables is not None else None
        return gated_delta_rule_tree_triton(*args, table_steps=steps, **kwargs)
    return gated_delta_rule_tree_ref(*args, **kwargs)
