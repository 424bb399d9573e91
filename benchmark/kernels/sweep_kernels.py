"""Tile and launch settings of Flide's kernels, timed side by side on the GPU:
the data behind ``fork_attention_triton.TILE_OVERRIDE``'s defaults and
``gated_delta_rule_triton.RECURRENT_CONFIG``.

* ForkAttention (BLOCK_M, BLOCK_N, warps, stages, packed GQA) at Qwen3.5-4B
  (16/4 heads, 256) and 8/2 heads of 128, on the RACE, MultiRC and QuALITY
  streams; each setting's output is compared with the default setting's.
* ForkAttention on agent steps resumed from the state cache (few rows over a
  long key prefix), by tile setting.
* The recurrent GDN kernel's (BLOCK_V, warps) on a level of 32 questions x 90.
* A profile of the gather + fla chunk path on a level of 32 questions x 25.
* The own inter-chunk kernel against fla's on the same WY factors.
* The inter-chunk kernel's (BLOCK_V, warps, stages), timed as the whole-tree GDN pass (GPU kernel time) beside fla's chunk kernel
  on the same tokens, with a per-kernel profile of both.
* The whole-tree causal conv's (BLOCK_T, BLOCK_C, warps) at Qwen3.5-4B's 8,192 channels, its input the
  q/k/v columns of the stacked projection, on the graph tables of a single RACE
  question, one and eight MultiRC requests and one QuALITY request; each
  setting's output is compared with the default's (the same taps in the same
  order: bitwise). ``conv_variants``: the same beside a sources-table variant
  and a plain tile copy, with registers and spills.

Usage::

    python benchmark/kernels/sweep_kernels.py --out sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import device_ms, median_ms  # noqa: E402
from workloads import WORKLOADS, attention_inputs, gdn_inputs, workload_prompts  # noqa: E402

import flide_ext.kernels.fork_attention.kernel as fat  # noqa: E402
import flide_ext.kernels.gated_delta_rule.fla_steps as gdf  # noqa: E402
import flide_ext.kernels.gated_delta_rule.levels as gdl  # noqa: E402
import flide_ext.kernels.gated_delta_rule.recurrent_kernel as gdr  # noqa: E402
import flide_ext.kernels.gated_delta_rule.states_kernel as gds  # noqa: E402
import flide_ext.kernels.gated_delta_rule.tree_kernel as gdt  # noqa: E402
from flide_ext.plan.flat import plan_round  # noqa: E402

ATTENTION_CONFIGS = {
    256: [(64, 32, 8, 2, False), (64, 64, 8, 2, False), (128, 32, 8, 2, False), (64, 32, 4, 2, True),
          (64, 64, 4, 2, True), (64, 64, 8, 2, True), (128, 64, 8, 2, True), (128, 32, 8, 2, True),
          (64, 64, 8, 3, True), (128, 64, 8, 3, True)],
    128: [(64, 64, 4, 2, False), (128, 64, 8, 2, False), (64, 64, 4, 2, True), (128, 64, 8, 2, True),
          (128, 32, 4, 2, True), (64, 64, 4, 3, True)],
}
RECURRENT_CONFIGS = [(16, 1), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4), (128, 4), (128, 8)]
STATES_CONFIGS = [(32, 4, 3), (32, 2, 2), (32, 4, 2), (64, 2, 2), (64, 2, 3), (64, 4, 1), (64, 4, 2), (64, 4, 3),
                  (64, 4, 4), (64, 8, 2), (64, 8, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3)]
# Settings timed as the whole tree pass.
TREE_STATES_CONFIGS = [(32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 8, 2)]
CONV_CONFIGS = [(32, 128, 4), (16, 256, 4), (32, 256, 4), (64, 128, 4), (64, 256, 8), (16, 512, 4), (32, 512, 8),
                (8, 1024, 4), (16, 1024, 8), (64, 64, 4), (128, 64, 4)]


def bench(fn) -> float:
    return median_ms(fn, rep=150)


def tile_timings(args, settings):
    """ForkAttention on ``args`` under each tile setting: ``(setting, ms, relative
    difference from the default tiles' output)``, ms None and the error's repr
    where a setting does not run."""
    fat.TILE_OVERRIDE = None
    base = fat.fork_attention_triton(*args).float()
    for cfg in settings:
        fat.TILE_OVERRIDE = cfg
        try:
            out = fat.fork_attention_triton(*args).float()
            err = float((out - base).norm() / base.norm())
            ms = bench(lambda: fat.fork_attention_triton(*args))
        except Exception as e:
            err, ms = repr(e)[:200], None
        yield cfg, ms, err
    fat.TILE_OVERRIDE = None


def sweep_attention(rows):
    for (Hq, Hkv, D) in [(16, 4, 256), (8, 2, 128)]:
        for name in WORKLOADS:
            owners, prompts = workload_prompts(name)
            plan = plan_round(owners, prompts, "cuda")
            T = plan.num_tokens
            q, k, v = attention_inputs(T, Hq, Hkv, D, torch.Generator(device="cuda").manual_seed(0))
            args = (q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
                    plan.positions, plan.kv_positions, D**-0.5)
            for cfg, ms, err in tile_timings(args, ATTENTION_CONFIGS[D]):
                rows.append({"kernel": "fork_attention", "Hq": Hq, "Hkv": Hkv, "D": D, "workload": name,
                             "config": cfg, "ms": ms, "rel_diff_vs_default": err})
                print(f"attn D={D} {name:8s} {str(cfg):28s} {ms if ms else float('nan'):8.3f} ms  diff {err}",
                      flush=True)


AGENT_TILES = [(128, 64, 8, 2, True), (128, 32, 8, 3, True), (64, 64, 4, 2, True), (64, 64, 8, 3, True),
               (128, 64, 4, 2, True), (64, 32, 4, 2, True)]


def sweep_agent_attention(rows):
    """ForkAttention on agent steps resumed from the state cache (few rows over a
    long key prefix), a four-agent round and a RACE question, Qwen3.5-4B's
    attention shape, by tile setting."""
    from flide_ext.plan.flat import Resume

    Hq, Hkv, D = 16, 4, 256
    g = torch.Generator().manual_seed(9)
    shapes = []
    for name, state, new, agents in [("agent8000 warm", 8384, 416, 1), ("agent1500 warm", 1664, 236, 1),
                                     ("agent8000 x4 warm", 8384, 416, 4)]:
        owners, prompts, resume = [], [], {}
        for a in range(agents):
            hist = torch.randint(0, 32000, (state + new,), generator=g).tolist()
            for c in range(10):
                prompts.append(hist + [c] + torch.randint(0, 32000, (29,), generator=g).tolist())
                owners.append(a)
            resume[a] = Resume(length=state, slot=-1, kv_start=a * state)
        shapes.append((name, owners, prompts, resume, agents * state))
    owners, prompts = workload_prompts("race_single", requests=1)
    shapes.append(("race_single", owners, prompts, {}, 0))
    for name, owners, prompts, resume, prefix in shapes:
        plan = plan_round(owners, prompts, "cuda", resume=resume)
        q, k, v = attention_inputs(plan.num_tokens, Hq, Hkv, D, torch.Generator(device="cuda").manual_seed(0),
                                   prefix=prefix)
        args = (q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
                plan.positions, plan.kv_positions, D**-0.5)
        for tiles, ms, err in tile_timings(args, AGENT_TILES):
            rows.append({"kernel": "fork_attention_agent", "workload": name, "rows": plan.num_tokens,
                         "keys": prefix + plan.num_tokens, "tiles": tiles, "ms": ms, "rel_diff_vs_default": err})
            print(f"agent attn {name:18s} {plan.num_tokens:5d} rows {str(tiles):24s} "
                  f"{ms if ms else float('nan'):8.3f} ms  diff {err}", flush=True)
    fat.TILE_OVERRIDE = None


def sweep_recurrent(rows, questions=32, n=90):
    H, HV, K, V = 16, 32, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(2)
    T = questions * n
    q, k, v, g, beta = gdn_inputs(T, H, HV, K, V, gen)
    pool = torch.randn(4 + questions, HV, K, V, device="cuda", generator=gen)
    start = torch.arange(questions, device="cuda") * n
    length = torch.full((questions,), n, device="cuda")
    first = torch.arange(questions, device="cuda") % 4
    last = 4 + torch.arange(questions, device="cuda")
    args = (q, k, v, g, beta, K**-0.5, pool, start, length, first, last)
    base = gdr.recurrent_gated_delta_rule_triton(*args).float()
    default = gdr.RECURRENT_CONFIG
    for cfg in RECURRENT_CONFIGS:
        gdr.RECURRENT_CONFIG = cfg
        out = gdr.recurrent_gated_delta_rule_triton(*args).float()
        err = float((out - base).norm() / base.norm())
        ms = bench(lambda: gdr.recurrent_gated_delta_rule_triton(*args))
        rows.append({"kernel": "recurrent_gdn", "questions": questions, "tokens": n, "config": cfg, "ms": ms,
                     "rel_diff_vs_default": err})
        print(f"recurrent {questions}x{n} {cfg} {ms:.3f} ms diff {err:.1e}", flush=True)
    gdr.RECURRENT_CONFIG = default
    # Where does the gather + fla path spend its time?
    short = (q[: questions * 25], k[: questions * 25], v[: questions * 25], g[: questions * 25],
             beta[: questions * 25], K**-0.5, pool, start // n * 25, torch.full_like(length, 25), first, last)
    for _ in range(3):
        gdf.chunk_gated_delta_rule_fla(*short)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            gdf.chunk_gated_delta_rule_fla(*short)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=18)
    print(table, flush=True)
    rows.append({"kernel": "gather_fla_profile", "table": table})


def sweep_states(rows):
    from bench_gdn import gdn_passes

    default_states, default_max = gds.STATES_CONFIG, gdt.RECURRENT_MAX_LEN
    for name in ("race", "quality", "multirc"):
        _, forked, _, fla_same_tokens = gdn_passes(name)
        d_fla = device_ms(fla_same_tokens)
        base = forked().float().clone()
        variants = [(cfg, default_max) for cfg in TREE_STATES_CONFIGS]
        for cfg, max_len in variants:
            gds.STATES_CONFIG, gdt.RECURRENT_MAX_LEN = cfg, max_len
            try:
                err = float((forked().float() - base).norm() / base.norm())
                d = device_ms(forked)
            except Exception as e:
                err, d = repr(e)[:200], None
            rows.append({"kernel": "gdn_tree", "workload": name, "states_config": cfg, "recurrent_max_len": max_len,
                         "device_ms": d, "fla_same_tokens_device_ms": d_fla,
                         "share_of_fla": d_fla / d if d else None, "rel_diff_vs_default": err})
            print(f"gdn tree {name:8s} states {cfg} recurrent<= {max_len:3d}: {d if d else float('nan'):.3f} ms "
                  f"kernels, fla {d_fla:.3f}: {100 * d_fla / d if d else 0:.0f}%  diff {err}", flush=True)
        gds.STATES_CONFIG, gdt.RECURRENT_MAX_LEN = default_states, default_max
        for label, fn in (("forked", forked), ("fla same tokens", fla_same_tokens)):
            try:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn()
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14)
            except Exception as e:
                table = f"profile failed: {e!r}"
            print(f"--- {name} {label}\n{table}", flush=True)
            rows.append({"kernel": "gdn_profile", "workload": name, "path": label, "table": table})


def states_vs_fla(rows):
    """The own inter-chunk kernel against fla's ``chunk_gated_delta_rule_fwd_h`` on
    the same WY factors (no forking: initial states zero), per workload and
    states setting: the one kernel the forked chunked path swaps in."""
    from bench_gdn import HV, K, V, inputs
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    default = gds.STATES_CONFIG
    for name in WORKLOADS:
        owners, prompts = workload_prompts(name)
        plan = plan_round(owners, prompts, "cuda")
        T = plan.num_tokens
        gen = torch.Generator(device="cuda").manual_seed(3)
        q, k, v, g, beta = inputs(T, gen)
        k = gdf._l2norm(k)
        meta = gdl._level_meta(plan.seg_start, plan.seg_len, torch.full_like(plan.seg_start, -1),
                               torch.arange(plan.num_segments, device="cuda"))
        cu, ci = meta.cu_seqlens, meta.chunk_indices
        g_cum = chunk_local_cumsum(g[None], chunk_size=64, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci)
        w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k[None], v=v[None], g=g_cum, beta=beta[None], cu_seqlens=cu,
                                                   chunk_size=64, chunk_indices=ci)
        pool = torch.zeros(plan.num_segments, HV, K, V, device="cuda")

        def fla_h():
            return chunk_gated_delta_rule_fwd_h(k=k[None], w=w, u=u, g=g_cum, output_final_state=True, cu_seqlens=cu,
                                                chunk_indices=ci)

        _, v_ref, _ = fla_h()
        d_fla = device_ms(fla_h)
        for cfg in STATES_CONFIGS:
            gds.STATES_CONFIG = cfg

            def own():
                return gds.chunk_states_triton(k, w[0], u[0], g_cum[0], pool, cu, meta.chunk_offsets, meta.initial,
                                               meta.final, 64, meta.num_chunks)

            _, v_new = own()
            err = float((v_new.float() - v_ref[0].float()).norm() / v_ref.float().norm())
            d = device_ms(own)
            rows.append({"kernel": "states_vs_fla_h", "workload": name, "config": cfg, "device_ms": d,
                         "fla_device_ms": d_fla, "v_new_rel_diff": err})
            print(f"states {name:8s} {cfg}: own {d:.3f} ms, fla fwd_h {d_fla:.3f} ms ({100 * d_fla / d:.0f}%), "
                  f"v_new diff {err:.1e}", flush=True)
        gds.STATES_CONFIG = default


def conv_rounds(cases):
    """For each ``(workload, requests, GraphCapacity)``: ``(case, tables, x, w,
    pool)``, the round's graph tables on the GPU and random conv inputs at
    Qwen3.5-4B's shape: ``x`` the 8,192 q/k/v columns of the stacked projection
    (bf16 ``[tokens, 8256]`` sliced), ``w`` ``[8192, 4]``, a one-slot pool."""
    from flide_ext.runtime.graph_runner import TableSpec
    from flide_ext.runtime.round_buffers import device_round

    C, stacked = 8192, 8256  # q/k/v channels of the qkv + b + a projection
    for name, requests, capacity in cases:
        owners, prompts = workload_prompts(name, requests)
        plan = plan_round(owners, prompts, "cpu")
        plan.assign_slots([-1] * plan.num_segments)
        t = device_round(plan, TableSpec(4, (64,)), "cuda", capacity.tables, capacity.segments).tables
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(capacity.tokens, stacked, generator=gen, device="cuda").to(torch.bfloat16)[:, :C]
        w = torch.randn(C, 4, generator=gen, device="cuda").to(torch.bfloat16)
        yield (name, requests, capacity), t, x, w, torch.zeros(1, C, 3, dtype=torch.bfloat16, device="cuda")


def sweep_conv(rows):
    import flide_ext.kernels.causal_conv1d.kernel as cct
    from flide_ext.runtime.graph_capacities import GraphCapacity

    default = cct.TREE_CONFIG
    for (name, _, capacity), t, x, w, pool in conv_rounds([("race_single", 1, GraphCapacity(480, 4, 3)),
                                                          ("multirc", 1, GraphCapacity(1152, 36)),
                                                          ("multirc", 8, GraphCapacity(9024, 282)),
                                                          ("quality", 1, GraphCapacity(6336, 198))]):
        def run():
            return cct.causal_conv1d_tree_triton(x, w, None, pool, t.token_segment, t.seg_start, t.seg_len,
                                                 t.conv_history, t.history_slot, t.final_slot)

        want = run()
        for cfg in CONV_CONFIGS:
            cct.TREE_CONFIG = cfg
            try:
                same = bool(torch.equal(run(), want))
                d = device_ms(run)
            finally:
                cct.TREE_CONFIG = default
            rows.append({"kernel": "conv_tree", "workload": name, "tokens": capacity.tokens, "config": cfg,
                         "device_ms": d, "equal_to_default": same})
            print(f"conv {name:11s} T={capacity.tokens} {cfg}: {1e3 * d:.1f} us, equal {same}", flush=True)


def _regs(fn) -> dict:
    """``n_regs`` and ``n_spills`` of the kernels ``fn`` (a Triton JIT function) compiled so far."""
    out = []
    try:
        for cache in fn.device_caches.values():
            for compiled in cache[0].values():
                out.append((compiled.n_regs, compiled.n_spills))
    except Exception as exc:  # the cache's layout differs between Triton versions
        return {"error": repr(exc)}
    return {"n_regs_spills": sorted(set(out))}


def sweep_conv_variants(rows):
    """The tree conv beside a per-row sources table variant and a plain tile copy
    (``conv_variants.py``), with each kernel's registers and spills."""
    import conv_variants as cv

    import flide_ext.kernels.causal_conv1d.kernel as cct
    from flide_ext.runtime.graph_capacities import GraphCapacity

    default = cct.TREE_CONFIG
    for (name, requests, capacity), t, x, w, pool in conv_rounds([("race_single", 1, GraphCapacity(480, 4, 3)),
                                                                 ("multirc", 1, GraphCapacity(1152, 36)),
                                                                 ("multirc", 8, GraphCapacity(9024, 282)),
                                                                 ("race_single", 35, GraphCapacity(16384, 512)),
                                                                 ("quality", 1, GraphCapacity(6336, 198))]):
        tabs = (t.token_segment, t.seg_start, t.seg_len, t.conv_history, t.history_slot)

        def tree():
            return cct.causal_conv1d_tree_triton(x, w, None, pool, *tabs, t.final_slot)

        want = tree()
        src = cv.conv_sources(*tabs, 4)
        base = {"workload": name, "requests": requests, "tokens": capacity.tokens}

        def record(kind, cfg, fn, same, extra=None):
            d = device_ms(fn)
            rows.append({"kernel": kind, **base, "config": cfg, "device_ms": d, "equal_to_tree": same, **(extra or {})})
            print(f"{kind:14s} {name:11s} x{requests:<3d} T={capacity.tokens:5d} {cfg}: {1e3 * d:7.1f} us, "
                  f"equal {same} {extra or ''}", flush=True)

        for cfg in [default, (32, 128, 8), (16, 128, 4), (16, 128, 2), (64, 128, 8)]:
            cct.TREE_CONFIG = cfg
            try:
                same = bool(torch.equal(tree(), want))
                record("conv_tree", cfg, tree, same, _regs(cct._causal_conv1d_tree_kernel))
            finally:
                cct.TREE_CONFIG = default
        record("conv_sources_table", None, lambda: cv.conv_sources(*tabs, 4), None)
        for windows in (True, False):
            for cfg in [(32, 128, 4), (32, 128, 8), (64, 128, 4), (16, 128, 4), (64, 128, 8)]:
                got, kernel = cv.conv_sources_triton(x, w, pool, src, windows, cfg)
                record("conv_sources" + ("" if windows else "_nowin"), cfg,
                       lambda: cv.conv_sources_triton(x, w, pool, src, windows, cfg), bool(torch.equal(got, want)),
                       {"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None)})
        for cfg in [(32, 128, 4), (64, 128, 4)]:
            record("copy_tiles", cfg, lambda: cv.copy_tiles_triton(x, cfg), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="sweep.json")
    parser.add_argument("--only", nargs="*", choices=["recurrent", "attention", "agent_attention", "states", "states_vs_fla", "conv",
                                                "conv_variants"],
                        help="run only these sweeps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"{Path(__file__).name}: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    rows: list = []
    steps = {"recurrent": sweep_recurrent, "attention": sweep_attention, "agent_attention": sweep_agent_attention, "states": sweep_states,
             "states_vs_fla": states_vs_fla, "conv": sweep_conv,
             "conv_variants": sweep_conv_variants}
    for key, step in steps.items():
        if args.only and key not in args.only:
            continue
        try:
            step(rows)
        except Exception:
            traceback.print_exc()
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
