"""Gated DeltaNet token mixer (Yang, Kautz & Hatamizadeh, 2024, arXiv:2412.06464)
over a round's flat stream, with state forking in levels.

Per layer: project to q/k/v (+ output gate z, write strength b, decay a), run the
depthwise causal conv1d (SiLU) over q/k/v, L2-normalise q and k, then the gated
delta rule with ``beta = sigmoid(b)`` and ``g = -exp(A_log) * softplus(a + dt_bias)``
(Qwen3.5 / Qwen3-Next model cards), and ``out_proj(GatedRMSNorm(o, z))``.

Forking: the tree's levels run one after another. Level 0 runs every root
segment and writes each segment's final recurrent state and conv window into its
pool slot; each next level runs all its segments at once, each starting from its
parent's slot by index (DESIGN.md, "Gated DeltaNet layers"). With the round's
kernel tables (:mod:`flide_ext.kernels.tables`, the GPU path) the conv runs the
whole tree at once, each segment reading the inputs before it on its path from
the stream, and the recurrent pass reads its levels from the tables.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.causal_conv1d import causal_conv1d, causal_conv1d_tree
from ..kernels.gated_delta_rule import gated_delta_rule_tree, needs_level_tables
from ..kernels.gdn_gate import gdn_gate
from .kernel_module import KernelModule
from .linear import Linear, StackedLinear
from .norm import GatedRMSNorm


class GatedDeltaNet(KernelModule):
    """Qwen3.5 GDN layer (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``,
    ``conv1d``, ``dt_bias``, ``A_log``, ``norm``, ``out_proj``).

    Args:
        index: this layer's rank among the model's GDN layers (its state-pool layer).

    ``rule_dtype`` (None: the activations' dtype) is the dtype the gated delta
    rule's inputs are cast to, so its chunk states, WY factors and corrected
    values are kept in it (float32 in a bf16 model); its output is cast back.
    Set model-wide by :meth:`flide_ext.models.base.FlatCausalLM.set_gdn_rule_dtype`.
    """

    rule_dtype = None

    def __init__(self, config, index: int):
        super().__init__()
        self.index = index
        self.num_v_heads = config.linear_num_value_heads
        self.num_k_heads = config.linear_num_key_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = config.linear_conv_kernel_dim
        H = config.hidden_size
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, H, bias=False)
        self._build_projections(H)

    def _build_projections(self, H: int) -> None:
        self.in_proj_qkv = Linear(H, self.conv_dim, bias=False)
        self.in_proj_z = Linear(H, self.value_dim, bias=False)
        self.in_proj_b = Linear(H, self.num_v_heads, bias=False)
        self.in_proj_a = Linear(H, self.num_v_heads, bias=False)
        # q/k/v, b and a in one GEMM (the conv, the gate kernel read strided rows);
        # z stays apart, as the gated norm reads it by head.
        self.qkv_b_a = StackedLinear(self.in_proj_qkv, self.in_proj_b, self.in_proj_a)

    def project(self, x: torch.Tensor):
        """``x`` ``[T, H]`` -> conv input ``[T, conv_dim]`` (q, k, v channels in that
        order), z ``[T, HV, Dv]``, b and a ``[T, HV]`` (the conv input, b and a are
        column views of one projection)."""
        T = x.shape[0]
        z = self.in_proj_z(x).view(T, self.num_v_heads, self.head_v_dim)
        mixed, b, a = self.qkv_b_a(x)
        return mixed, z, b, a

    def state_shapes(self):
        """Shapes of one pool slot: recurrent ``[HV, K, V]`` and conv window ``[C, W-1]``."""
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim), (self.conv_dim, self.kernel - 1)

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:
        """``x`` ``[T, H]`` -> ``[T, H]``; reads and writes ``ctx.state_pool`` slots."""
        T = x.shape[0]
        plan, pool = ctx.plan, ctx.state_pool
        mixed, z, b, a = self.project(x)
        weight = self.conv1d.weight.squeeze(1)
        conv_pool, state_pool = pool.conv[self.index], pool.recurrent[self.index]

        tables = plan.tables
        split = [self.key_dim, self.key_dim, self.value_dim]
        if tables is not None:
            # The whole tree at once: a segment's first taps read its history rows.
            # q, k and v come out contiguous, as the chunk kernels read them.
            q, k, v = causal_conv1d_tree(mixed, weight, None, conv_pool, tables.token_segment, tables.seg_start,
                                         tables.seg_len, tables.conv_history, tables.history_slot,
                                         tables.final_slot, split=split, backend=self.backend)
        else:
            # Each level writes its own rows; a level's segments read the slots the
            # level before wrote.
            conv_out = torch.empty(mixed.shape, dtype=mixed.dtype, device=mixed.device)
            for level in plan.level_tables():
                causal_conv1d(mixed, weight, None, conv_pool, *level, activation="silu", out=conv_out,
                              backend=self.backend)
            q, k, v = torch.split(conv_out, split, dim=-1)
        q = q.reshape(T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(T, self.num_v_heads, self.head_v_dim)
        g, beta = gdn_gate(a, b, self.A_log, self.dt_bias, self.backend)

        # With tables, the GPU pass needs no level tables (and building them
        # would add launches to a CUDA graph).
        levels = plan.level_tables() if needs_level_tables(v, tables, self.backend) else ()
        dtype = v.dtype
        if self.rule_dtype is not None and self.rule_dtype != dtype:
            q, k, v, beta = (t.to(self.rule_dtype) for t in (q, k, v, beta))
        # Rows past the round (a graph's padding) are zeroed by the norm, in its
        # own launch, not by the rule's pass in one more.
        o = gated_delta_rule_tree(q, k, v, g, beta, self.head_k_dim**-0.5, state_pool, levels,
                                  use_qk_l2norm=True, tables=tables, zero_padding=tables is None,
                                  backend=self.backend).to(dtype)
        o = self.norm(o, z, tables.row_valid if tables is not None else None).reshape(T, -1)
        return self.out_proj(o)


class PackedGatedDeltaNet(GatedDeltaNet):
    """Qwen3-Next GDN layer: ``in_proj_qkvz`` and ``in_proj_ba`` pack each key head's
    q, k, its group of value heads' v and z (and b, a) side by side."""

    def _build_projections(self, H: int) -> None:
        self.in_proj_qkvz = Linear(H, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = Linear(H, 2 * self.num_v_heads, bias=False)

    def project(self, x: torch.Tensor):
        T = x.shape[0]
        nk, dk, dv = self.num_k_heads, self.head_k_dim, self.head_v_dim
        group = self.num_v_heads // nk
        qkvz = self.in_proj_qkvz(x).view(T, nk, 2 * dk + 2 * group * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, group * dv, group * dv], dim=-1)
        ba = self.in_proj_ba(x).view(T, nk, 2 * group)
        b, a = torch.split(ba, [group, group], dim=-1)
        mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1)
        return (
            mixed,
            z.reshape(T, self.num_v_heads, dv),
            b.reshape(T, self.num_v_heads),
            a.reshape(T, self.num_v_heads),
        )
