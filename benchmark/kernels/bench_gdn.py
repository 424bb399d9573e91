"""GDN state forking against fla-core's chunked kernel on the same tokens, at
Qwen3.5-4B GDN shapes (16 key / 32 value heads, head size 128, bf16), on
streams shaped like RACE, QuALITY and MultiRC.

* "Flide forked (tree)": what the models run (:func:`gated_delta_rule_tree_triton`):
  the state-free steps once over all segments, the inter-chunk kernel level by
  level, children reading their parent's state slot by index.
* "Flide forked (levels)": each tree level in turn through
  :func:`gated_delta_rule_forked` (the previous design, for comparison).
* "fla chunk, same tokens": fla's ``chunk_gated_delta_rule`` over the stream's
  segments as independent sequences (no initial states): the same tokens with
  no forking to do, the bar the issue sets (>= 90%).
* The question level alone, two ways: the own recurrent kernel reading parent
  states by index, against gathering the parent states and running fla's chunk
  kernel; over question lengths 8..256, to place ``RECURRENT_MAX_LEN``.
* The causal conv1d with slot windows, against the copy ceiling.

Usage::

    python benchmark/kernels/bench_gdn.py --out gdn.json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ceilings import copy_gbps, matmul_tflops  # noqa: E402
from timing import device_ms, median_ms  # noqa: E402
from workloads import WORKLOADS, gdn_inputs, workload_prompts  # noqa: E402

from flide_ext.kernels.causal_conv1d.kernel import causal_conv1d_triton  # noqa: E402
from flide_ext.kernels.gated_delta_rule.fla_steps import chunk_gated_delta_rule_fla  # noqa: E402
from flide_ext.kernels.gated_delta_rule.tree_kernel import (  # noqa: E402
    chunk_gated_delta_rule_forked,
    gated_delta_rule_forked,
    gated_delta_rule_tree_triton,
)
from flide_ext.kernels.gated_delta_rule.recurrent_kernel import recurrent_gated_delta_rule_triton  # noqa: E402
from flide_ext.plan.flat import plan_round  # noqa: E402

H, HV, K, V = 16, 32, 128, 128


def inputs(T, gen):
    return gdn_inputs(T, H, HV, K, V, gen)


def gdn_passes(name: str):
    """``(plan, tree, levels, fla_same_tokens)`` for a workload, each a function
    returning its ``[T, HV, V]`` output: ``tree()`` runs the whole tree through
    :func:`gated_delta_rule_tree_triton` (the models' path); ``levels()`` runs the
    tree's levels through :func:`gated_delta_rule_forked`; ``fla_same_tokens()``
    runs fla's chunk kernel over the same segments as independent sequences (no
    initial states)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    owners, prompts = workload_prompts(name)
    plan = plan_round(owners, prompts, "cuda")
    plan.assign_slots(list(range(plan.num_segments)))
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, g, beta = inputs(plan.num_tokens, gen)
    pool = torch.zeros(plan.num_segments, HV, K, V, device="cuda")
    out = torch.empty_like(v)
    tables = plan.level_tables()

    def tree():
        return gated_delta_rule_tree_triton(q, k, v, g, beta, K**-0.5, pool, tables)

    def levels():
        for level in tables:
            gated_delta_rule_forked(q, k, v, g, beta, K**-0.5, pool, *level, out=out)
        return out

    cu = torch.cat([plan.seg_start, plan.seg_start[-1:] + plan.seg_len[-1:]])
    from fla.ops.utils import prepare_chunk_indices

    ci = prepare_chunk_indices(cu, 64)  # given, so no call syncs with the device (CUDA graphs)

    def fla_same_tokens():
        return chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None], scale=K**-0.5,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                      chunk_indices=ci)[0][0]

    return plan, tree, levels, fla_same_tokens


def graph_ms(fn):
    """Median ms of ``fn`` captured once in a CUDA graph and replayed: the time
    without Python launch overhead (how issue 6's flat graphs run a round);
    None with the reason printed when the pass cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return median_ms(graph.replay)
    except Exception as e:
        tqdm.write(f"CUDA graph capture failed: {e!r}"[:300])
        return None


def run_workload(name, rows):
    plan, tree, per_level, fla_same_tokens = gdn_passes(name)
    T, S = plan.num_tokens, plan.num_segments
    levels = plan.level_tables()
    gen = torch.Generator(device="cuda").manual_seed(4)

    # Bytes every version must move: inputs and outputs once, each segment's final state written.
    nbytes = 2 * T * (2 * H * K + 2 * HV * V + HV) + 4 * T * HV + 4 * S * HV * K * V
    base = {"workload": name, "tokens": T, "segments": S, "levels": len(levels), "min_bytes": nbytes}
    levels_out = per_level().float()
    diff = float((tree().float() - levels_out).norm() / levels_out.norm())
    t_fla, d_fla, g_fla = median_ms(fla_same_tokens), device_ms(fla_same_tokens), graph_ms(fla_same_tokens)
    rows.append({**base, "method": "fla chunk, same tokens, no forks", "ms": t_fla, "device_ms": d_fla,
                 "graph_ms": g_fla, "gbps": nbytes / (t_fla * 1e-3) / 1e9})
    for method, fn in (("Flide forked (tree)", tree), ("Flide forked (levels)", per_level)):
        ms, dms, gms = median_ms(fn), device_ms(fn), graph_ms(fn)
        graph_share = g_fla / gms if g_fla and gms else None
        rows.append({**base, "method": method, "ms": ms, "device_ms": dms, "graph_ms": gms,
                     "gbps": nbytes / (ms * 1e-3) / 1e9, "share_of_fla": t_fla / ms, "device_share_of_fla": d_fla / dms,
                     "graph_share_of_fla": graph_share, "rel_diff_tree_vs_levels": diff})
        tqdm.write(f"{name:8s} {method:22s} {ms:.3f} ms (kernels {dms:.3f}), fla same tokens {t_fla:.3f} ms "
                   f"(kernels {d_fla:.3f}): {100 * t_fla / ms:.0f}% of fla wall, {100 * d_fla / dms:.0f}% kernels"
                   + (f", {100 * graph_share:.0f}% as CUDA graphs ({gms:.3f} vs {g_fla:.3f} ms)" if graph_share else ""))
    C = 2 * H * K + HV * V
    x = torch.randn(T, C, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.randn(C, 4, device="cuda", generator=gen, dtype=torch.bfloat16)
    cpool = torch.zeros(S, C, 3, device="cuda", dtype=torch.bfloat16)
    cout = torch.empty_like(x)

    def conv():
        for start, n, first, last in levels:
            causal_conv1d_triton(x, w, None, cpool, start, n, first, last, "silu", out=cout)

    ms, dms = median_ms(conv), device_ms(conv)
    conv_bytes = 2 * 2 * T * C
    rows.append({**base, "method": "causal conv1d (Triton, levels)", "ms": ms, "device_ms": dms,
                 "gbps": conv_bytes / (ms * 1e-3) / 1e9, "device_gbps": conv_bytes / (dms * 1e-3) / 1e9})
    tqdm.write(f"{name:8s} conv1d {ms:.3f} ms, {conv_bytes / (ms * 1e-3) / 1e9:.0f} GB/s "
               f"(kernels {dms:.3f} ms, {conv_bytes / (dms * 1e-3) / 1e9:.0f} GB/s)")


def run_question_level(rows, questions=32):
    """One level of ``questions`` children of length n, each reading one of 4 parent slots."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    for n in (8, 25, 40, 64, 90, 128, 192, 256):
        T = questions * n
        q, k, v, g, beta = inputs(T, gen)
        pool = torch.randn(4 + questions, HV, K, V, device="cuda", generator=gen)
        start = torch.arange(questions, device="cuda") * n
        length = torch.full((questions,), n, device="cuda")
        first = torch.arange(questions, device="cuda") % 4
        last = 4 + torch.arange(questions, device="cuda")
        out = torch.empty_like(v)
        args = (q, k, v, g, beta, K**-0.5, pool, start, length, first, last)
        row = {"question_tokens": n, "questions": questions}
        for key, fn in (("recurrent", recurrent_gated_delta_rule_triton), ("chunk_forked", chunk_gated_delta_rule_forked),
                        ("gather_fla", chunk_gated_delta_rule_fla)):
            row[f"{key}_ms"] = median_ms(lambda: fn(*args, out=out))
            row[f"{key}_device_ms"] = device_ms(lambda: fn(*args, out=out))
        rows.append(row)
        tqdm.write(f"question level {questions} x {n:3d}: " + ", ".join(
            f"{key} {row[key + '_ms']:.3f} ms ({row[key + '_device_ms']:.3f} kernels)"
            for key in ("recurrent", "chunk_forked", "gather_fla")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="gdn.json")
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"{Path(__file__).name}: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    ceilings = {"matmul_tflops_bf16": matmul_tflops(), "copy_gbps": copy_gbps()}
    print(f"ceilings: {ceilings}", flush=True)
    rows, level_rows = [], []

    def save():
        # After every step, so a run stopped by its time limit keeps what it measured.
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "ceilings": ceilings,
                                              "shape": {"H": H, "HV": HV, "K": K, "V": V, "dtype": "bf16"},
                                              "rows": rows, "question_level": level_rows}, indent=1))

    for name in tqdm(args.workloads, desc="workloads"):
        try:
            run_workload(name, rows)
        except Exception:
            traceback.print_exc()
        save()
    try:
        run_question_level(level_rows)
    except Exception:
        traceback.print_exc()
    save()
    print(f"{'workload':9s} {'method':22s} {'ms':>7s} {'fla ms':>7s} {'% of fla':>9s} {'kernels: % of fla':>18s} "
          f"{'graphs: % of fla':>17s}")
    for r in rows:
        if "share_of_fla" in r:
            fla = r["ms"] * r["share_of_fla"]
            graphs = f"{100 * r['graph_share_of_fla']:16.0f}%" if r.get("graph_share_of_fla") else f"{'-':>17s}"
            print(f"{r['workload']:9s} {r['method']:22s} {r['ms']:7.3f} {fla:7.3f} {100 * r['share_of_fla']:8.0f}% "
                  f"{100 * r['device_share_of_fla']:17.0f}% {graphs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
