"""Every Triton launch the wrappers make compiles for the H200 (sm_90), on CPU.

The interpreter (``TRITON_INTERPRET=1``, see conftest.py) runs kernels as
Python and skips the compiler's type checks: a kernel can pass every
interpreted test and still fail to compile on the GPU. Here each wrapper runs
with bf16 inputs, its launches are recorded instead of run, and each recorded
launch (argument types, constexprs, warps, stages) is compiled to a cubin for
``GPUTarget("cuda", 90, 32)`` with Triton's own compiler and ptxas, in a
process without the interpreter (``scripts/gpu_compile.py``).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

import flide_ext.kernels.causal_conv1d.kernel as conv
import flide_ext.kernels.fork_attention.kernel as fat
import flide_ext.kernels.gated_delta_rule.recurrent_kernel as gdr
import flide_ext.kernels.gated_delta_rule.states_kernel as gds
from flide_ext.plan.flat import plan_round
from test.helpers import ROOT
from test.helpers.plans import keep_parent_states

POINTER = {torch.bool: "*i1", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
           torch.int64: "*i64"}


class Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` records."""

    def __init__(self, module, name):
        self.module, self.name = module.__name__, name
        self.arg_names = list(inspect.signature(getattr(module, name).fn).parameters)
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def describe(recorder, args, kwargs) -> dict:
    """A recorded launch as the compiler's signature, constexprs and options."""
    signature, constexprs = {}, {}
    for name, value in zip(recorder.arg_names, args):
        if isinstance(value, torch.Tensor):
            signature[name] = POINTER[value.dtype]
        elif value is None:
            signature[name], constexprs[name] = "constexpr", None
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{name}: {type(value)}")
    for name in recorder.arg_names[len(args):]:
        signature[name], constexprs[name] = "constexpr", kwargs[name]
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    return {"module": recorder.module, "kernel": recorder.name, "signature": signature, "constexprs": constexprs,
            "options": options}


def record(monkeypatch, module, name):
    recorder = Recorder(module, name)
    monkeypatch.setattr(module, name, recorder)
    return recorder


def _plan():
    state = list(range(3, 80))
    prompts = [state + [100, 101], state + [102] * 20, [5, 6, 7]]
    plan = plan_round([0, 0, 1], prompts)
    plan.assign_slots(list(range(plan.num_segments)))
    return plan


def _compiled(*recorders) -> list[int]:
    """Compile every recorded launch for sm_90 in a fresh process; launches per recorder."""
    launches = [describe(r, a, k) for r in recorders for a, k in r.launches]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_compile.py")],
                          input=json.dumps(launches), capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("bytes of cubin") == len(launches)
    return [len(r.launches) for r in recorders]


@pytest.mark.parametrize("Hq,Hkv,D,window", [(16, 4, 256, None), (8, 2, 128, 64), (4, 4, 64, None)])
def test_fork_attention_compiles_for_h200(monkeypatch, Hq, Hkv, D, window):
    rec = record(monkeypatch, fat, "_fork_attention_kernel")
    plan = _plan()
    T = plan.num_tokens
    q = torch.zeros(T, Hq, D, dtype=torch.bfloat16)
    kv = torch.zeros(T, Hkv, D, dtype=torch.bfloat16)
    fat.fork_attention_triton(q, kv, kv, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start,
                              plan.seg_kv_len, plan.positions, plan.kv_positions, D**-0.5, sliding_window=window)
    assert _compiled(rec) == [1]


def test_conv1d_and_gated_delta_rule_compile_for_h200(monkeypatch):
    plan = _plan()
    T, H, HV, K, V = plan.num_tokens, 16, 32, 128, 128
    levels = plan.level_tables()
    rec_conv = record(monkeypatch, conv, "_causal_conv1d_kernel")
    C = 2 * H * K + HV * V
    x = torch.zeros(T, C, dtype=torch.bfloat16)
    pool = torch.zeros(plan.num_segments, C, 3, dtype=torch.bfloat16)
    for level in levels:
        conv.causal_conv1d_triton(x, torch.zeros(C, 4, dtype=torch.bfloat16), None, pool, *level, "silu")

    rec_rec = record(monkeypatch, gdr, "_recurrent_kernel")
    rec_states = record(monkeypatch, gds, "_chunk_states_kernel")
    q = torch.zeros(T, H, K, dtype=torch.bfloat16)
    v = torch.zeros(T, HV, V, dtype=torch.bfloat16)
    g, beta = torch.zeros(T, HV), torch.zeros(T, HV, dtype=torch.bfloat16)
    states = torch.zeros(plan.num_segments, HV, K, V)
    gdr.recurrent_gated_delta_rule_triton(q, q, v, g, beta, K**-0.5, states, *levels[0])
    cu = torch.tensor([0, 64, T])
    gds.chunk_states_triton(q, q.repeat_interleave(2, dim=1), v, g, states, cu, torch.tensor([0, 1, 3]),
                            torch.tensor([-1, 0], dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32))
    assert _compiled(rec_conv, rec_rec, rec_states) == [len(levels), 1, 1]


def test_table_driven_kernels_compile_for_h200(monkeypatch):
    """The launches a CUDA graph replays: the tree-wide conv and its final-window
    kernel, and the inter-chunk kernel reading its level range from the tables."""
    from flide_ext.kernels.tables import TableCapacity, build_tables
    from flide_ext.runtime.round_buffers import RoundBuffers

    plan = keep_parent_states(_plan())
    cap = TableCapacity(tokens=512, segments=16, levels=4)
    tables = RoundBuffers("cpu").write(plan, build_tables(plan, cap, 4, (32,), level_programs=17)).tables
    T, H, HV, K, V = cap.tokens, 16, 32, 128, 128
    C = 2 * H * K + HV * V
    rec_conv = record(monkeypatch, conv, "_causal_conv1d_tree_kernel")
    rec_window = record(monkeypatch, conv, "_segment_edges_kernel")
    x = torch.zeros(T, C + 2 * HV, dtype=torch.bfloat16)[:, :C]  # the q/k/v columns of the stacked projection
    pool = torch.zeros(plan.num_segments, C, 3, dtype=torch.bfloat16)
    q, k, v = conv.causal_conv1d_tree_triton(x, torch.zeros(C, 4, dtype=torch.bfloat16), None, pool,
                                             tables.token_segment, tables.seg_start, tables.seg_len,
                                             tables.conv_history, tables.history_slot, tables.final_slot,
                                             split=[H * K, H * K, HV * V])
    assert q.is_contiguous() and v.shape == (T, HV * V)
    rec_states = record(monkeypatch, gds, "_chunk_states_kernel")
    k = torch.zeros(T, H, K, dtype=torch.bfloat16)
    w = torch.zeros(T, HV, K, dtype=torch.bfloat16)
    u = torch.zeros(T, HV, V, dtype=torch.bfloat16)
    h = torch.zeros(cap.chunks, HV, K, V, dtype=torch.bfloat16)
    states = torch.zeros(plan.num_segments, HV, K, V)
    gds.chunk_states_levels_triton(k, w, u, torch.zeros(T, HV), states, h, torch.empty_like(u), tables)
    assert _compiled(rec_conv, rec_window, rec_states) == [1, 1, cap.levels]


def test_norm_and_gate_kernels_compile_for_h200(monkeypatch):
    """Every RMSNorm variant a supported model launches (hidden rows, per-head q/k
    views, the gated GDN output norm) and the GDN gates."""
    import flide_ext.kernels.gdn_gate.kernel as gate
    import flide_ext.kernels.rms_norm.kernel as norm

    rec_norm = record(monkeypatch, norm, "_rms_norm_kernel")
    bf16 = dict(dtype=torch.bfloat16)
    norm.rms_norm_triton(torch.zeros(40, 2560, **bf16), torch.zeros(2560, **bf16), 1e-6, "offset")
    norm.rms_norm_triton(torch.zeros(40, 2048, **bf16), torch.zeros(2048, **bf16), 1e-6, "cast")
    q = torch.zeros(40, 16, 512, **bf16)[..., :256]  # a head-split view: rows at one stride
    norm.rms_norm_triton(q, torch.zeros(256, **bf16), 1e-6, "offset")
    norm.rms_norm_triton(torch.zeros(40, 32, 128, **bf16), torch.zeros(128, **bf16), 1e-6, "cast",
                         gate=torch.zeros(40, 32, 128, **bf16))
    norm.rms_norm_triton(torch.zeros(40, 32, 128, **bf16), torch.zeros(128), 1e-6, "cast",
                         gate=torch.zeros(40, 32, 128, **bf16))
    norm.rms_norm_triton(torch.zeros(40, 32, 128, **bf16), torch.zeros(128, **bf16), 1e-6, "cast",
                         gate=torch.zeros(40, 32, 128, **bf16), valid=torch.ones(40, dtype=torch.bool))  # a graph's
    hidden = torch.zeros(40, 2560, **bf16)
    norm.rms_norm_triton(hidden, torch.zeros(2560, **bf16), 1e-6, "offset", residual=hidden)  # the decoder's add
    norm.rms_norm_triton(hidden[:, :2048], torch.zeros(2048, **bf16), 1e-6, "cast", residual=hidden[:, :2048])
    stream = torch.zeros(40, 2560)  # a float32 residual stream (the default in a bf16 model)
    norm.rms_norm_triton(hidden, torch.zeros(2560, **bf16), 1e-6, "offset", residual=stream)
    norm.rms_norm_triton(hidden[:, :2048], torch.zeros(2048, **bf16), 1e-6, "cast", residual=stream[:, :2048])
    rec_gate = record(monkeypatch, gate, "_gdn_gate_kernel")
    ab = torch.zeros(40, 64, **bf16)[:, :32]
    gate.gdn_gate_triton(ab, ab, torch.zeros(32), torch.zeros(32, **bf16))
    assert _compiled(rec_norm, rec_gate) == [10, 1]


def test_silu_mul_compiles_for_h200(monkeypatch):
    """The gated MLP's fused product over the halves of one stacked projection."""
    import flide_ext.kernels.silu_mul.kernel as sm

    rec = record(monkeypatch, sm, "_silu_mul_kernel")
    gu = torch.zeros(40, 2 * 9216, dtype=torch.bfloat16)
    sm.silu_mul_triton(gu[:, :9216], gu[:, 9216:])
    assert _compiled(rec) == [1]


def test_sigmoid_mul_compiles_for_h200(monkeypatch):
    """Gated attention's output gate, read in place from the query projection's rows."""
    import flide_ext.kernels.sigmoid_mul.kernel as sg

    rec = record(monkeypatch, sg, "_sigmoid_mul_kernel")
    qg = torch.zeros(40, 16, 512, dtype=torch.bfloat16)
    sg.sigmoid_mul_triton(torch.zeros(40, 16, 256, dtype=torch.bfloat16), qg[..., 256:])
    assert _compiled(rec) == [1]


def test_label_logits_compile_for_h200(monkeypatch):
    """The label-only readout at a Qwen3.5-4B hidden size (2,560: three blocks, the last one masked)."""
    import flide_ext.kernels.label_logits.kernel as ll

    rec = record(monkeypatch, ll, "_label_logits_kernel")
    pairs = torch.tensor([0, 1, 1])
    ll.label_logits_triton(torch.zeros(2, 2560, dtype=torch.bfloat16), torch.zeros(64, 2560, dtype=torch.bfloat16),
                           pairs, pairs)
    assert _compiled(rec) == [1]


def test_rotary_compiles_for_h200(monkeypatch):
    """Qwen3.5's partial rotary (64 of 256 features, q as a head split of the gated
    q_proj) and a full rotary of 128-feature heads."""
    import flide_ext.kernels.rotary.kernel as rt

    rec = record(monkeypatch, rt, "_rotary_kernel")
    bf16 = dict(dtype=torch.bfloat16)
    q = torch.zeros(40, 16, 512, **bf16)[..., :256]
    rt.rotary_triton(q, torch.zeros(40, 64, **bf16), torch.zeros(40, 64, **bf16))
    rt.rotary_triton(torch.zeros(40, 8, 128, **bf16), torch.zeros(40, 128, **bf16), torch.zeros(40, 128, **bf16))
    assert _compiled(rec) == [2]

