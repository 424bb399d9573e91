"""fla-core's kernels (GPU machines only): the state-free steps of the chunked
algorithm as :class:`~.chunks.ChunkSteps`, and fla's public chunked kernel with
the parent states gathered, kept as the measured alternative."""

from __future__ import annotations

import functools

import torch

from .chunks import CHUNK, ChunkSteps
from .levels import level_meta, pass_through

@functools.lru_cache(maxsize=None)
def fla_available() -> bool:
    """True when fla-core's chunked gated delta rule imports (GPU machines only:
    on a CPU-only machine importing fla makes transformers pick it and fail).
    Asked once per process: every GDN layer's dispatch consults it."""
    from ..fla_configs import use_shipped

    use_shipped()
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # fla-core's fused row L2 norm (eps 1e-6, as the reference): one kernel
    # where the same in PyTorch ops took five.
    from fla.modules.norm.l2norm import l2norm_fwd

    return l2norm_fwd(x.contiguous())[0]


@functools.lru_cache(maxsize=None)
def fla_steps() -> ChunkSteps:
    """fla-core's kernels for the state-free steps (``CHUNK``-row chunks)."""
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    def local_cumsum(g, cu, ci):
        return chunk_local_cumsum(g[None].float(), chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci)[0]

    def wy(k, v, g_cum, beta, cu, ci):
        w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k[None], v=v[None], g=g_cum[None], beta=beta[None].contiguous(),
                                                   cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=ci)
        return w[0], u[0]

    def output(q, k, v_new, h, g_cum, scale, cu, ci):
        return chunk_fwd_o(q=q[None], k=k[None], v=v_new[None], h=h[None], g=g_cum[None], scale=scale,
                           cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=ci)[0]

    return ChunkSteps(l2norm=_l2norm, local_cumsum=local_cumsum, wy=wy, output=output)


def chunk_gated_delta_rule_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    initial_slot: torch.Tensor,
    final_slot: torch.Tensor,
    use_qk_l2norm: bool = True,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """fla-core's public chunked kernel over one tree level, initial states
    gathered (copied) from their slots and final states scattered back: the
    alternative :func:`~.tree_kernel.chunk_gated_delta_rule_forked` is measured against.
    Arguments and result as :func:`flide_ext.kernels.gated_delta_rule.reference.chunk_gated_delta_rule_ref`.

    Raises:
        ValueError: the level's segments do not lie back to back in stream order.
    """
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    if out is None:
        out = v.new_zeros(v.shape)
    meta = level_meta(seg_start, seg_len, initial_slot, final_slot)
    pass_through(meta, state_pool)
    if meta.hi == meta.lo:
        return out
    lo, hi = meta.lo, meta.hi
    initial = None
    if meta.forked:
        first = meta.initial.long()
        initial = torch.where((first >= 0)[:, None, None, None], state_pool[first.clamp(min=0)], 0).float()
    o, final = fla_chunk(
        q[None, lo:hi], k[None, lo:hi], v[None, lo:hi], g[None, lo:hi].float(), beta[None, lo:hi],
        scale=scale, initial_state=initial, output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices,
    )
    out[lo:hi] = o[0].to(out.dtype)
    last = meta.final.long()
    kept = last >= 0
    state_pool[last[kept]] = final[kept].to(state_pool.dtype)
    return out
