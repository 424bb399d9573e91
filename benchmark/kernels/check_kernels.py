"""Correctness of Flide's GPU kernels on a CUDA device.

Each check prints one line and lands in a JSON file:

* each kernel in bf16 (and ForkAttention also in float32) against its PyTorch
  reference run on float32 inputs (the references accumulate in float64), as
  ``|out - ref| / |ref|`` over the whole output;
* ForkAttention alone == forked, bitwise, in bf16 (and resumed == cold);
* ForkAttention reading K/V in place from shuffled, NaN-padded pools through
  ``kv_index`` == the contiguous key array, bitwise (bf16 and float32);
* a stream of more than 2048 segments with 32 value heads;
* 1-token and empty segments;
* whole Qwen3.5 forwards (tiny and 4B-shaped, random weights) on the GPU in bf16
  against the CPU float32 reference: total variation (TV) distance of the
  next-token distributions at the readout rows, next to the TV of the same GPU
  bf16 forward with every kernel forced to its PyTorch reference (the bf16
  tolerance this run measures).

Usage::

    python benchmark/kernels/check_kernels.py --out results.json [--skip-4b]

Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flide_ext.kernels.causal_conv1d import causal_conv1d_ref  # noqa: E402
from flide_ext.kernels.causal_conv1d.kernel import causal_conv1d_triton  # noqa: E402
from flide_ext.kernels.fork_attention import fork_attention_ref  # noqa: E402
from flide_ext.kernels.fork_attention.kernel import fork_attention_triton  # noqa: E402
from flide_ext.kernels.gated_delta_rule import chunk_gated_delta_rule_ref  # noqa: E402
from flide_ext.kernels.gated_delta_rule.fla_steps import chunk_gated_delta_rule_fla  # noqa: E402
from flide_ext.kernels.gated_delta_rule.tree_kernel import (  # noqa: E402
    chunk_gated_delta_rule_forked,
    gated_delta_rule_forked,
    gated_delta_rule_tree_triton,
)
from flide_ext.kernels.gated_delta_rule.fla_steps import fla_available  # noqa: E402
from flide_ext.kernels.gated_delta_rule.recurrent_kernel import recurrent_gated_delta_rule_triton  # noqa: E402
from flide_ext.plan.flat import Resume, plan_round  # noqa: E402
from workloads import attention_inputs, gdn_inputs, workload_prompts  # noqa: E402

DEV = "cuda"
BF16_TOL = 2e-2  # relative error of one bf16 kernel against its float32 reference
FP32_TOL = 1e-5
results: list[dict] = []


def record(name: str, value, tolerance, passed: bool, **extra) -> None:
    row = {"check": name, "value": value, "tolerance": tolerance, "pass": bool(passed), **extra}
    results.append(row)
    print(f"{'PASS' if passed else 'FAIL'}  {name}: {value} (tolerance {tolerance})", flush=True)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if got.isnan().any():
        return float("nan")
    return float((got - want).norm() / want.norm().clamp(min=1e-30))


def plan_args(plan):
    return (plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.kv_positions)


def check_attention_vs_reference(gen):
    owners, prompts = workload_prompts("race", requests=2)
    plan = plan_round(owners, prompts, DEV)
    for Hq, Hkv, D, window in [(16, 4, 256, None), (8, 2, 128, None), (8, 8, 64, None), (16, 4, 256, 128)]:
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v = attention_inputs(plan.num_tokens, Hq, Hkv, D, gen, dtype)
            args = (*plan_args(plan), D**-0.5, window)
            got = fork_attention_triton(q, k, v, *args)
            want = fork_attention_ref(q.float(), k.float(), v.float(), *args)
            tol = BF16_TOL if dtype == torch.bfloat16 else FP32_TOL
            err = rel_err(got, want)
            record(f"fork_attention {str(dtype)[6:]} Hq={Hq} Hkv={Hkv} D={D} window={window}", err, tol, err <= tol)


def id_tables(Hq, Hkv, D, gen, vocab=1024, max_pos=8192):
    """q/k/v as functions of (token id, position), as in a model's first layer."""
    tables = [torch.randn(vocab, h, D, generator=gen, device=DEV) for h in (Hq, Hkv, Hkv)]
    pos_tables = [torch.randn(max_pos, h, D, generator=gen, device=DEV) for h in (Hq, Hkv, Hkv)]

    def rows(ids, pos):
        return [(t[ids % vocab] + p[pos]).to(torch.bfloat16) for t, p in zip(tables, pos_tables)]

    return rows


def check_alone_equals_forked(gen):
    for workload in ("race", "multirc", "quality"):
        for Hq, Hkv, D in [(16, 4, 256), (8, 2, 128)]:
            rows = id_tables(Hq, Hkv, D, gen)
            owners, prompts = workload_prompts(workload, requests=3, seed=11)
            forked = plan_round(owners, prompts, DEV)
            q, k, v = rows(forked.token_ids, forked.positions)
            out = fork_attention_triton(q, k, v, *plan_args(forked), D**-0.5)
            mismatched, checked = 0, 0
            picks = [i for i in range(len(prompts)) if owners[i] == 1][:4]
            for i in picks:
                alone = plan_round([0], [prompts[i]], DEV)
                qa, ka, va = rows(alone.token_ids, alone.positions)
                got = fork_attention_triton(qa, ka, va, *plan_args(alone), D**-0.5)
                end = int(forked.readout_rows[forked.prompt_readout[i]]) + 1
                seg = int(forked.token_segment[end - 1])
                m = int(forked.seg_len[seg])
                checked += 1
                mismatched += int(not torch.equal(got[-m:], out[end - m : end]))
            record(f"alone == forked bitwise, bf16 {workload} Hq={Hq} D={D}", f"{checked - mismatched}/{checked} equal",
                   "all", mismatched == 0)
    # Resumed from a checkpoint of the state's first 200 tokens == cold.
    rows = id_tables(16, 4, 256, gen)
    owners, prompts = workload_prompts("race", requests=1, seed=12)
    cold = plan_round(owners, prompts, DEV)
    qc, kc, vc = rows(cold.token_ids, cold.positions)
    out_cold = fork_attention_triton(qc, kc, vc, *plan_args(cold), 256**-0.5)
    L = 200
    warm = plan_round(owners, prompts, DEV, resume={0: Resume(length=L, slot=-1, kv_start=0)})
    ids = torch.tensor(prompts[0][:L], device=DEV)
    _, kp, vp = rows(ids, torch.arange(L, device=DEV))
    qw, kw, vw = rows(warm.token_ids, warm.positions)
    out_warm = fork_attention_triton(qw, torch.cat([kp, kw]), torch.cat([vp, vw]), *plan_args(warm), 256**-0.5)
    same = torch.equal(out_warm, out_cold[L:])
    record("resumed (checkpoint 200 tokens) == cold bitwise, bf16 race D=256", same, True, same)


def check_kv_index():
    """K/V pools read through ``kv_index`` give the contiguous key array's bits."""
    gen = torch.Generator(device=DEV).manual_seed(17)  # its own: the other checks keep their inputs
    owners, prompts = workload_prompts("race", requests=2, seed=13)
    unused = 7  # key rows before the checkpoint belong to no segment: their index points at NaN rows
    plan = plan_round(owners, prompts, DEV, resume={0: Resume(length=200, slot=-1, kv_start=unused)})
    P, T = plan.num_prefix_rows, plan.num_tokens
    Tk, N = P + T, 2 * (P + T) + 17
    for Hq, Hkv, D, window in [(16, 4, 256, None), (8, 2, 128, None), (16, 4, 256, 128)]:
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v = attention_inputs(T, Hq, Hkv, D, gen, dtype, prefix=P)
            perm = torch.randperm(N, generator=gen, device=DEV)
            index = perm[:Tk].clone()
            k_pool = torch.full((N, Hkv, D), float("nan"), dtype=dtype, device=DEV)
            v_pool = torch.full((N, Hkv, D), float("nan"), dtype=dtype, device=DEV)
            k_pool[index], v_pool[index] = k, v
            index[:unused] = perm[Tk : Tk + unused]
            args = (*plan_args(plan), D**-0.5, window)
            want = fork_attention_triton(q, k, v, *args)
            got = fork_attention_triton(q, k_pool, v_pool, *args, None, index.int())
            same = torch.equal(got, want)
            err = rel_err(got, fork_attention_ref(q.float(), k.float(), v.float(), *args))
            tol = BF16_TOL if dtype == torch.bfloat16 else FP32_TOL
            record(f"fork_attention kv_index over a shuffled NaN-padded pool == contiguous bitwise, {str(dtype)[6:]} "
                   f"Hq={Hq} Hkv={Hkv} D={D} window={window}", {"bitwise": same, "rel_err": err}, tol,
                   same and err <= tol)


def run_levels(fn, plan, tensors, out):
    for level in plan.level_tables():
        fn(*tensors, *level, out=out)
    return out


def run_tree(plan, tensors, out):
    # The whole tree at once (the models' path), copied into out's rows.
    got = gated_delta_rule_tree_triton(*tensors, plan.level_tables())
    out.copy_(got)
    return out


def gdn_reference_levels(plan, q, k, v, g, beta, scale, pool):
    out = torch.zeros(v.shape, dtype=torch.float32, device=DEV)
    return run_levels(chunk_gated_delta_rule_ref, plan, (q.float(), k.float(), v.float(), g, beta.float(), scale, pool),
                      out)


def check_gdn(gen, workload, requests, label, H=16, HV=32, K=128, V=128, C=None):
    owners, prompts = workload_prompts(workload, requests=requests, seed=3)
    plan = plan_round(owners, prompts, DEV)
    plan.assign_slots(list(range(plan.num_segments)))
    T, S = plan.num_tokens, plan.num_segments
    q, k, v, g, beta = gdn_inputs(T, H, HV, K, V, gen)
    scale = K**-0.5
    want_pool = torch.zeros(S, HV, K, V, dtype=torch.float64, device=DEV)
    want = gdn_reference_levels(plan, q, k, v, g, beta, scale, want_pool)
    paths = [("dispatch (gated_delta_rule_forked)", gated_delta_rule_forked),
             ("own recurrent kernel", recurrent_gated_delta_rule_triton)]
    if fla_available():
        paths.append(("fla WY + own forked-state chunk kernel", chunk_gated_delta_rule_forked))
        paths.append(("fla chunk with gathered states", chunk_gated_delta_rule_fla))
    paths.append(("whole tree (gated_delta_rule_tree_triton, the models' path)", None))
    for name, fn in paths:
        pool = torch.full((S, HV, K, V), float("nan"), device=DEV)
        out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=DEV)
        if fn is None:
            run_tree(plan, (q, k, v, g, beta, scale, pool), out)
        else:
            run_levels(fn, plan, (q, k, v, g, beta, scale, pool), out)
        err = rel_err(out, want)
        kept = plan.seg_slot[plan.seg_len > 0]
        state_err = rel_err(pool[kept], want_pool[kept])
        ok = err <= BF16_TOL and state_err <= BF16_TOL
        record(f"gated delta rule bf16 {label}: {name}", {"out": err, "final_states": state_err}, BF16_TOL, ok,
               segments=S, tokens=T, value_heads=HV)
    # Causal conv1d over the same levels, 4B channel count.
    C = C or 2 * H * K + HV * V
    x = torch.randn(T, C, generator=gen, device=DEV).to(torch.bfloat16)
    w = (torch.randn(C, 4, generator=gen, device=DEV) * 0.5).to(torch.bfloat16)
    ref_pool = torch.zeros(S, C, 3, device=DEV)
    ref = torch.zeros(T, C, device=DEV)
    for level in plan.level_tables():
        causal_conv1d_ref(x.float(), w.float(), None, ref_pool, *level, "silu", out=ref)
    pool = torch.full((S, C, 3), float("nan"), device=DEV, dtype=torch.bfloat16)
    out = torch.full((T, C), float("nan"), device=DEV, dtype=torch.bfloat16)
    for level in plan.level_tables():
        causal_conv1d_triton(x, w, None, pool, *level, "silu", out=out)
    err = rel_err(out, ref)
    kept = plan.seg_slot
    win_err = rel_err(pool[kept].float(), ref_pool[kept])
    record(f"causal conv1d bf16 {label}", {"out": err, "final_windows": win_err}, BF16_TOL,
           err <= BF16_TOL and win_err <= BF16_TOL, segments=S, tokens=T, channels=C)


def many_segments_prompts(requests=300, questions=7, seed=5):
    gen = torch.Generator().manual_seed(seed)
    owners, prompts = [], []
    for r in range(requests):
        state = torch.randint(0, 30000, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist()
        for i in range(questions):
            n = int(torch.randint(1, 5, (1,), generator=gen))
            owners.append(r)
            prompts.append(state + [30000 + i] + torch.randint(0, 30000, (n - 1,), generator=gen).tolist())
    return owners, prompts


def check_many_segments(gen):
    owners, prompts = many_segments_prompts()
    plan = plan_round(owners, prompts, DEV)
    plan.assign_slots(list(range(plan.num_segments)))
    S, T = plan.num_segments, plan.num_tokens
    q, k, v = attention_inputs(plan.num_tokens, 16, 4, 256, gen)
    got = fork_attention_triton(q, k, v, *plan_args(plan), 256**-0.5)
    want = fork_attention_ref(q.float(), k.float(), v.float(), *plan_args(plan), 256**-0.5)
    err = rel_err(got, want)
    record(f"fork_attention bf16, {S} segments, {T} tokens, 1-token questions", err, BF16_TOL, err <= BF16_TOL,
           segments=S)
    q, k, v, g, beta = gdn_inputs(T, 16, 32, 128, 128, gen)
    want_pool = torch.zeros(S, 32, 128, 128, dtype=torch.float64, device=DEV)
    want = gdn_reference_levels(plan, q, k, v, g, beta, 128**-0.5, want_pool)
    for name, run in (("levels", lambda t, o: run_levels(gated_delta_rule_forked, plan, t, o)),
                      ("whole tree", lambda t, o: run_tree(plan, t, o))):
        pool = torch.full((S, 32, 128, 128), float("nan"), device=DEV)
        out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=DEV)
        run((q, k, v, g, beta, 128**-0.5, pool), out)
        err = rel_err(out, want)
        record(f"gated delta rule bf16, {S} segments, 32 value heads: {name}", err, BF16_TOL, err <= BF16_TOL,
               segments=S)


def check_empty_segments(gen):
    seg_parent = torch.tensor([-1, 0, 1, -1, 3], device=DEV)
    seg_start = torch.tensor([0, 5, 5, 6, 7], device=DEV)
    seg_len = torch.tensor([5, 0, 1, 1, 0], device=DEV)
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 0], device=DEV)
    q, k, v = (torch.randn(7, h, 128, generator=gen, device=DEV).to(torch.bfloat16) for h in (8, 2, 2))
    args = (seg_parent, seg_start, seg_len, seg_start, seg_len, positions, positions, 128**-0.5)
    got = fork_attention_triton(q, k, v, *args)
    err = rel_err(got, fork_attention_ref(q.float(), k.float(), v.float(), *args))
    own = torch.equal(got[6], v[6].repeat_interleave(4, dim=0))
    record("fork_attention bf16, empty and 1-token segments", {"rel_err": err, "1-token root == own value": own},
           BF16_TOL, err <= BF16_TOL and own)
    # GDN and conv: levels with empty and 1-token segments, slots chained.
    starts = torch.tensor([0, 9, 11, 12, 12, 19], device=DEV)
    lens = torch.tensor([9, 2, 1, 0, 7, 1], device=DEV)
    initial = torch.tensor([-1, -1, -1, 0, 1, 2], device=DEV)
    final = torch.tensor([0, 1, 2, 3, -1, 4], device=DEV)
    T = 20
    q, k, v, g, beta = gdn_inputs(T, 2, 4, 128, 128, gen)
    want_pool = torch.zeros(6, 4, 128, 128, dtype=torch.float64, device=DEV)
    want = torch.zeros(T, 4, 128, device=DEV)
    fns = [("recurrent", recurrent_gated_delta_rule_triton), ("dispatch", gated_delta_rule_forked)]
    if fla_available():
        fns.append(("fla", chunk_gated_delta_rule_fla))
        fns.append(("chunk forked", chunk_gated_delta_rule_forked))
    for level in (slice(0, 3), slice(3, 6)):
        chunk_gated_delta_rule_ref(q.float(), k.float(), v.float(), g, beta.float(), 128**-0.5, want_pool,
                                   starts[level], lens[level], initial[level], final[level], out=want)
    for name, fn in fns:
        pool = torch.full((6, 4, 128, 128), float("nan"), device=DEV)
        out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=DEV)
        for level in (slice(0, 3), slice(3, 6)):
            fn(q, k, v, g, beta, 128**-0.5, pool, starts[level], lens[level], initial[level], final[level], out=out)
        err = rel_err(out, want)
        passthrough = torch.equal(pool[3], pool[0])
        record(f"gated delta rule bf16, empty and 1-token segments: {name}",
               {"rel_err": err, "empty segment passes state": passthrough}, BF16_TOL, err <= BF16_TOL and passthrough)
    pool = torch.full((6, 4, 128, 128), float("nan"), device=DEV)
    levels = [tuple(t[level] for t in (starts, lens, initial, final)) for level in (slice(0, 3), slice(3, 6))]
    out = gated_delta_rule_tree_triton(q, k, v, g, beta, 128**-0.5, pool, levels)
    err = rel_err(out, want)
    passthrough = torch.equal(pool[3], pool[0])
    record("gated delta rule bf16, empty and 1-token segments: whole tree",
           {"rel_err": err, "empty segment passes state": passthrough}, BF16_TOL, err <= BF16_TOL and passthrough)


def check_norms_and_gates(gen):
    """The fused RMSNorm (every mode, at the Qwen3.5-4B widths) and GDN gates in
    bf16 against their references on the same GPU inputs: within two bf16 ulps
    (the reduction order moves rstd by an ulp, and a path rounds twice)."""
    from flide_ext.kernels.gdn_gate import gdn_gate_ref
    from flide_ext.kernels.gdn_gate.kernel import gdn_gate_triton
    from flide_ext.kernels.rms_norm import rms_norm_ref
    from flide_ext.kernels.rms_norm.kernel import rms_norm_triton

    T, bf16 = 735, torch.bfloat16
    cases = [("hidden offset", (T, 2560), "offset", False), ("q/k head offset", (T, 16, 256), "offset", False),
             ("hidden cast", (T, 2048), "cast", False), ("GDN gated", (T, 32, 128), "cast", True)]
    for label, shape, mode, gated in cases:
        x = (2 * torch.randn(*shape, generator=gen, device=DEV)).to(bf16)
        z = torch.randn(*shape, generator=gen, device=DEV).to(bf16) if gated else None
        w = (0.1 * torch.randn(shape[-1], generator=gen, device=DEV) + (mode == "cast")).to(bf16)
        got, want = rms_norm_triton(x, w, 1e-6, mode, z).float(), rms_norm_ref(x, w, 1e-6, mode, z).float()
        worst = float(((got - want).abs() / want.abs().clamp(min=2 ** -10)).max())
        record(f"rms_norm {label} {list(shape)}, Triton vs reference (bf16): max relative difference", worst,
               2 ** -6, worst <= 2 ** -6 and not got.isnan().any(), differing=float((got != want).double().mean()))
        if gated or len(shape) != 2:
            continue
        res = (2 * torch.randn(*shape, generator=gen, device=DEV)).to(bf16)
        (got, got_sum), (want, want_sum) = rms_norm_triton(x, w, 1e-6, mode, residual=res), \
            rms_norm_ref(x, w, 1e-6, mode, residual=res)
        worst = float(((got.float() - want.float()).abs() / want.float().abs().clamp(min=2 ** -10)).max())
        record(f"rms_norm {label} {list(shape)} with the residual add, Triton vs reference (bf16): max relative "
               "difference (sums equal)", worst, 2 ** -6, worst <= 2 ** -6 and bool(torch.equal(got_sum, want_sum)),
               differing=float((got != want).double().mean()))
    a = (4 * torch.randn(T, 32, generator=gen, device=DEV)).to(bf16)
    b = torch.randn(T, 32, generator=gen, device=DEV).to(bf16)
    A_log, dt_bias = torch.randn(32, generator=gen, device=DEV), torch.randn(32, generator=gen, device=DEV).to(bf16)
    (g, beta), (g_ref, beta_ref) = gdn_gate_triton(a, b, A_log, dt_bias), gdn_gate_ref(a, b, A_log, dt_bias)
    worst = float(((g - g_ref).abs() / (1e-6 + 2e-6 * g_ref.abs())).max())
    beta_worst = float((beta.float() - beta_ref.float()).abs().max())
    record("gdn_gate g, Triton (float32) vs reference (float64): max |difference| / (1e-6 + 2e-6 |g|)", worst, 1.0,
           worst <= 1.0 and beta_worst <= 2 ** -8, beta_max_difference=beta_worst,
           beta_differing=float((beta != beta_ref).double().mean()))
    from flide_ext.kernels.silu_mul import silu_mul_ref
    from flide_ext.kernels.silu_mul.kernel import silu_mul_triton

    gu = (4 * torch.randn(T, 2 * 9216, generator=gen, device=DEV)).to(bf16)
    got, want = silu_mul_triton(gu[:, :9216], gu[:, 9216:]).float(), silu_mul_ref(gu[:, :9216], gu[:, 9216:]).float()
    worst = float(((got - want).abs() / want.abs().clamp(min=2 ** -10)).max())
    record(f"silu_mul [{T}, 9216] halves of one projection, Triton vs reference (bf16): max relative difference",
           worst, 2 ** -6, worst <= 2 ** -6 and not got.isnan().any(), differing=float((got != want).double().mean()))
    from flide_ext.kernels.sigmoid_mul import sigmoid_mul_ref
    from flide_ext.kernels.sigmoid_mul.kernel import sigmoid_mul_triton

    o = (2 * torch.randn(T, 16, 256, generator=gen, device=DEV)).to(bf16)
    gate = (4 * torch.randn(T, 16, 512, generator=gen, device=DEV)).to(bf16)[..., 256:]  # the query projection's
    got, want = sigmoid_mul_triton(o, gate).float(), sigmoid_mul_ref(o, gate).float()
    worst = float(((got - want).abs() / want.abs().clamp(min=2 ** -10)).max())
    record(f"sigmoid_mul [{T}, 16, 256] attention gate, Triton vs reference (bf16): max relative difference",
           worst, 2 ** -6, worst <= 2 ** -6 and not got.isnan().any(), differing=float((got != want).double().mean()))
    from flide_ext.kernels.rotary import rotary_ref
    from flide_ext.kernels.rotary.kernel import rotary_triton
    from flide_ext.layers.rotary import RotaryEmbedding
    from flide_ext.assets.random_checkpoints import qwen35_config

    rope = RotaryEmbedding(qwen35_config("qwen3.5-4b"), 256, DEV)
    positions = torch.randint(0, 4000, (T,), generator=gen, device=DEV)
    cos, sin = rope.cos_sin(positions, bf16)
    q = (3 * torch.randn(T, 16, 512, generator=gen, device=DEV)).to(bf16)[..., :256]
    got, want = rotary_triton(q, cos, sin).float(), rotary_ref(q, cos, sin).float()
    worst = float(((got - want).abs() / want.abs().clamp(min=2 ** -10)).max())
    record(f"rotary [{T}, 16, 256] (64 rotated, 4B's partial rotary), Triton vs reference (bf16): max relative "
           "difference", worst, 2 ** -6, worst <= 2 ** -6 and not got.isnan().any(),
           differing=float((got != want).double().mean()))


def tiny_qwen35_config():
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=1024, hidden_size=128, num_hidden_layers=4, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    return config


def model_logprobs(model, config, owners, prompts, device):
    from flide_ext.runtime.state_pool import StatePool

    plan = plan_round(owners, prompts, device)
    pool = None
    if model.num_gdn_layers:  # attention-only models (Gemma 4) have no GDN states
        recurrent_shape, conv_shape = model.gdn_state_shapes()
        exact = device == "cpu"
        dtype = model.model.embed_tokens.weight.dtype
        pool = StatePool(recurrent_shape, conv_shape, model.num_gdn_layers, dtype, device,
                         recurrent_dtype=torch.float64 if exact else torch.float32)
        plan.assign_slots(pool.allocate(plan.num_segments))
    with torch.inference_mode():
        out = model(plan, pool)
    return out[plan.prompt_readout].float().cpu()


def tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Total variation distance per row between two log-probability tables."""
    return 0.5 * (a.double().exp() - b.double().exp()).abs().sum(-1)


def check_model(name, config, owners, prompts, seed=0):
    from flide_ext.models import MODEL_CLASSES
    from flide_ext.assets.random_checkpoints import random_model

    t0 = time.time()
    gpu = random_model(config, torch.bfloat16, DEV, seed=seed)

    with torch.device("meta"):
        cpu = MODEL_CLASSES[config.architectures[0]](config)
    cpu = cpu.to_empty(device="cpu").float().eval()
    cpu.load_state_dict({k: t.float().cpu() for k, t in gpu.state_dict().items()})
    fast = model_logprobs(gpu, config, owners, prompts, DEV)
    gpu.set_kernel_backend("reference")
    slow = model_logprobs(gpu, config, owners, prompts, DEV)
    gpu.set_kernel_backend(None)
    ref = model_logprobs(cpu, config, owners, prompts, "cpu")
    tv_fast, tv_slow = tv(fast, ref), tv(slow, ref)
    agree = float((fast.argmax(-1) == ref.argmax(-1)).double().mean())
    tol = float(2 * tv_slow.max() + 1e-3)
    ok = bool(tv_fast.max() <= tol) and not fast.isnan().any()
    record(f"{name} forward, GPU bf16 Triton vs CPU float32 reference: max TV", float(tv_fast.max()), tol, ok,
           mean_tv=float(tv_fast.mean()), bf16_reference_kernels_max_tv=float(tv_slow.max()),
           bf16_reference_kernels_mean_tv=float(tv_slow.mean()), argmax_agreement=agree,
           questions=len(prompts), seconds=round(time.time() - t0, 1))
    del gpu, cpu
    torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="check_kernels.json")
    parser.add_argument("--skip-4b", action="store_true", help="skip the 4B-shaped whole-model check")
    parser.add_argument("--only", nargs="*", help="run only the steps whose label contains one of these words")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (smoke test)")
    args = parser.parse_args()
    global DEV
    DEV = args.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("check_kernels.py: needs a CUDA GPU (torch sees none); --device cpu runs the kernels interpreted "
              "(set TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    gen = torch.Generator(device=DEV).manual_seed(0)
    info = {"device": torch.cuda.get_device_name() if DEV == "cuda" else DEV, "torch": torch.__version__, "fla": fla_available()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    print(info, flush=True)
    steps = [
        ("attention vs reference", lambda: check_attention_vs_reference(gen)),
        ("alone == forked", lambda: check_alone_equals_forked(gen)),
        ("kv index", check_kv_index),
        ("gdn race", lambda: check_gdn(gen, "race", 2, "race-shaped, Qwen3.5-4B GDN heads")),
        ("gdn multirc", lambda: check_gdn(gen, "multirc", 2, "multirc-shaped, Qwen3.5-4B GDN heads")),
        ("many segments", lambda: check_many_segments(gen)),
        ("empty segments", lambda: check_empty_segments(gen)),
        ("norms and gates", lambda: check_norms_and_gates(gen)),
        ("tiny model", lambda: check_model("tiny Qwen3.5", tiny_qwen35_config(), *workload_prompts("race", 2, vocab=1024))),
    ]
    if not args.skip_4b:
        from flide_ext.assets.random_checkpoints import qwen35_config

        owners, prompts = workload_prompts("race", 1, vocab=248320)
        prompts = [p[:160] + p[375:391] for p in prompts]  # 160-token state, 16-token questions: CPU time
        steps.append(("4B model", lambda: check_model("Qwen3.5-4B-shaped", qwen35_config("qwen3.5-4b"), owners, prompts)))
    return run_steps(steps, args.out, info, args.only)


def run_steps(steps, out: str, info: dict, only=None) -> int:
    """Run ``(label, step)`` pairs in turn (those whose label holds a word of
    ``only``, when given), a step that raises recorded as failed; the results
    rewritten to ``out`` after each. Returns the exit status: 1 when a check failed."""
    for label, step in steps:
        if only and not any(word in label for word in only):
            continue
        t0 = time.time()
        try:
            step()
        except Exception as e:
            traceback.print_exc()
            record(f"{label}: raised", repr(e)[:300], None, False)
        print(f"step {label}: {time.time() - t0:.0f} s", flush=True)
        Path(out).write_text(json.dumps({"info": info, "checks": results}, indent=1))
    failed = [r["check"] for r in results if not r["pass"]]
    print(f"{len(results) - len(failed)}/{len(results)} checks passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
