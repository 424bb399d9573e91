"""Precision swaps for the error-source diagnostic: one step of Flide's bf16
forward at a time run in float32, inside an otherwise unchanged forward.

Two kinds (names in :data:`SWAPS`):

* a **kernel** swap runs one kernel in float32 with the interface it has: its
  inputs are the bf16 tensors the forward gives it, its output is rounded to the
  dtype the forward stores (so it measures what the kernel loses inside:
  chunk states, probabilities, products);
* a **storage** swap keeps one tensor of the forward in float32 where it is
  stored in bf16, and its consumers read it unrounded (a GEMM then multiplies a
  float32 input by its bf16 weights in float32).

The residual stream is float32 in Flide itself (``residual_dtype``), so it has
no swap. The float32 versions are the kernels' PyTorch references (float32 or float64
inside), so a swap's result is the arithmetic's, not another kernel's. Swaps are
installed by :func:`swapped` on a model built by Flide's engine, which must run
eagerly (no CUDA graphs: a captured graph would not see them).
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch
import torch.nn.functional as F

import flide_ext.layers.attention as attention_layer
import flide_ext.layers.gated_deltanet as gdn_layer
import flide_ext.layers.linear as linear_layer
import flide_ext.layers.mlp as mlp_layer
import flide_ext.layers.readout as readout_layer
import flide_ext.models.base as model_base
from flide_ext.kernels.causal_conv1d import causal_conv1d, causal_conv1d_tree
from flide_ext.kernels.fork_attention import fork_attention
from flide_ext.kernels.gated_delta_rule import gated_delta_rule_tree
from flide_ext.kernels.gdn_gate import gdn_gate
from flide_ext.kernels.rms_norm.reference import rms_norm_ref
from flide_ext.kernels.rotary import rotary
from flide_ext.kernels.sigmoid_mul import sigmoid_mul
from flide_ext.kernels.silu_mul import silu_mul

# name: (kind, what runs in float32)
SWAPS = {
    "gdn_rule": ("kernel", "GDN chunked rule: chunk states, WY solves, outputs (o rounded)"),
    "gdn_gate": ("kernel", "GDN gates: beta = sigmoid(b) handed to the rule unrounded"),
    "gdn_conv": ("kernel", "GDN causal conv + SiLU (q, k, v rounded)"),
    "attention": ("kernel", "ForkAttention: scores, softmax, weighted sum (output rounded)"),
    "rotary": ("kernel", "rotary cos/sin tables and the rotation (q, k rounded)"),
    "norms": ("kernel", "every RMSNorm (outputs rounded)"),
    "mlp_act": ("kernel", "SiLU(gate) * up (output rounded)"),
    "log_softmax": ("kernel", "the readout's log-softmax in float64"),
    "norm_outputs": ("storage", "decoder norms' outputs into their GEMMs"),
    "attention_out": ("storage", "attention (its kernel swap too), output and sigmoid gate into o_proj"),
    "gdn_out": ("storage", "GDN rule (its kernel swap too), output and gated norm into out_proj"),
    "mlp_out": ("storage", "SiLU(gate) * up (its kernel swap too) into down_proj"),
    "lm_head": ("storage", "final norm output into the LM head (its float32 logits are the readout's as is)"),
}
DECODER_NORMS = ("input_layernorm", "post_attention_layernorm")


def _f32(t):
    return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _mixed_linear(original):
    # A float32 input (a storage swap's tensor) meets bf16 weights: multiplied in
    # float32, the product rounded to the weights' dtype as the GEMM would.
    def linear(x, weight, bias=None):
        if x.dtype == weight.dtype:
            return original(x, weight, bias)
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(weight.dtype)

    return linear


class _Patches:
    def __init__(self):
        self.undo = []

    def attr(self, obj, name, value):
        self.undo.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, value)

    def restore(self):
        for obj, name, old in reversed(self.undo):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


_MISSING = object()


def _decoder_norm(module, on: set):
    # The fused add + norm of a pre-norm block in float32 (installed for the norms
    # and norm_outputs swaps), its normalised output kept in float32 for norm_outputs.
    mode = "offset" if type(module).__name__ == "ZeroCenteredRMSNorm" else "cast"

    def forward(x, residual=None):
        total = x if residual is None else x + residual
        normed = rms_norm_ref(total.float(), module.weight, module.eps, mode)
        if "norm_outputs" not in on:
            normed = normed.to(x.dtype)
        return normed if residual is None else (normed, total)

    return forward


def _final_norm(module):
    # Float32 out: the readout rounds it to the LM head's dtype unless lm_head is on.
    def forward(x):
        return rms_norm_ref(x.float(), module.weight, module.eps, "offset" if type(module).__name__ ==
                            "ZeroCenteredRMSNorm" else "cast")

    return forward


def _gated_norm(module, on: set):
    # GatedRMSNorm(o, z): in float32 from its inputs; its output rounded unless gdn_out.
    def forward(x, z, valid=None):
        out = rms_norm_ref(x.float(), module.weight.float(), module.eps, "cast", gate=z.float(), valid=valid)
        return out if "gdn_out" in on else out.to(z.dtype)

    return forward


def _qk_norm(module):
    def forward(x):
        return rms_norm_ref(x.float(), module.weight, module.eps, "offset" if type(module).__name__ ==
                            "ZeroCenteredRMSNorm" else "cast").to(x.dtype)

    return forward


@contextlib.contextmanager
def swapped(model, names: Iterable[str]):
    """Run ``model`` (a Flide :class:`~flide_ext.models.base.FlatCausalLM`) with the
    swaps ``names`` (keys of :data:`SWAPS`) within the block.

    Raises:
        KeyError: an unknown swap name.
    """
    on = set(names)
    unknown = on - set(SWAPS)
    if unknown:
        raise KeyError(f"unknown swaps {sorted(unknown)}; known: {', '.join(SWAPS)}")
    p = _Patches()
    p.attr(linear_layer, "linear", _mixed_linear(linear_layer.linear))
    modules = dict(model.named_modules())
    for name, module in modules.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in DECODER_NORMS and ({"norm_outputs", "norms"} & on):
            p.attr(module, "forward", _decoder_norm(module, on))
        elif name == "model.norm" and "norms" in on:
            p.attr(module, "forward", _final_norm(module))
        elif leaf == "norm" and ".linear_attn" in f".{name}" and ({"gdn_out", "norms"} & on):
            p.attr(module, "forward", _gated_norm(module, on))
        elif leaf in ("q_norm", "k_norm") and "norms" in on:
            p.attr(module, "forward", _qk_norm(module))

    if "gdn_rule" in on or "gdn_out" in on:
        keep = "gdn_out" in on

        def rule(q, k, v, g, beta, scale, state_pool, levels, use_qk_l2norm=True, tables=None, zero_padding=True,
                 backend=None):
            o = gated_delta_rule_tree(q.float(), k.float(), v.float(), g, beta.float(), scale, state_pool, levels,
                                      use_qk_l2norm=use_qk_l2norm, tables=tables, zero_padding=zero_padding,
                                      backend="reference")
            return o if keep else o.to(v.dtype)

        p.attr(gdn_layer, "gated_delta_rule_tree", rule)
        p.attr(gdn_layer, "needs_level_tables", lambda *a, **k: True)  # the reference walks the levels
    if "gdn_gate" in on:
        def gate(a, b, A_log, dt_bias, backend=None):
            g, _ = gdn_gate(a, b, A_log, dt_bias, backend)
            return g, torch.sigmoid(b.double()).float()

        p.attr(gdn_layer, "gdn_gate", gate)
    if "gdn_conv" in on:
        def conv_tree(mixed, weight, bias, conv_pool, *rest, split=None, backend=None):
            outs = causal_conv1d_tree(mixed.float(), weight.float(), bias, conv_pool, *rest, split=split,
                                      backend="reference")
            return [o.to(mixed.dtype) for o in outs]

        def conv(mixed, weight, bias, conv_pool, *rest, activation=None, out=None, backend=None):
            # The reference writes the level's rows of a float32 copy; the other
            # rows go back unchanged (bf16 -> float32 -> bf16 is exact).
            shadow = out.float()
            causal_conv1d(mixed.float(), weight.float(), bias, conv_pool, *rest, activation=activation, out=shadow,
                          backend="reference")
            return out.copy_(shadow)

        p.attr(gdn_layer, "causal_conv1d_tree", conv_tree)
        p.attr(gdn_layer, "causal_conv1d", conv)
    if "attention" in on or "attention_out" in on:
        keep = "attention_out" in on

        def attend(q, k, v, *rest, backend=None, **kw):
            o = fork_attention(q.float(), k.float(), v.float(), *rest, backend="reference", **kw)
            return o if keep else o.to(q.dtype)

        p.attr(attention_layer, "fork_attention", attend)
        if keep:
            def gate_product(x, gate, backend=None):  # the float32 output and its sigmoid gate, unrounded
                return sigmoid_mul(x.float(), gate.float(), backend="reference")

            p.attr(attention_layer, "sigmoid_mul", gate_product)
    if "rotary" in on:
        def rotate(x, cos, sin, backend=None):
            return rotary(x.float(), cos.float(), sin.float(), backend="reference").to(x.dtype)

        rot = model.rotary
        p.attr(rot, "cos_sin", lambda positions, dtype, f=rot.cos_sin: f(positions, torch.float32))
        p.attr(attention_layer, "rotary", rotate)
    if "mlp_act" in on or "mlp_out" in on:
        keep = "mlp_out" in on

        def act(gate_, up, backend=None):
            out = silu_mul(gate_.float(), up.float(), backend="reference")
            return out if keep else out.to(gate_.dtype)

        p.attr(mlp_layer, "silu_mul", act)
    if "log_softmax" in on or "lm_head" in on:
        # The engine stops its forward at the normed readout rows and applies the
        # LM head after it (FlatCausalLM.head_logprobs): both halves are swapped.
        def normed_rows(hidden, rows, norm, lm_head):
            normed = norm(hidden.index_select(0, rows))
            return normed if "lm_head" in on else normed.to(lm_head.weight.dtype)

        def head(normed, weight, softcap=None):
            logits = readout_layer.soft_capped(readout_layer.lm_head_logits(normed, weight), softcap)
            if "log_softmax" in on:
                return torch.log_softmax(logits.double(), dim=-1).float()
            return torch.log_softmax(logits, dim=-1)

        p.attr(model_base, "readout_normed", normed_rows)
        p.attr(model_base, "head_logprobs", head)
    try:
        yield
    finally:
        p.restore()
