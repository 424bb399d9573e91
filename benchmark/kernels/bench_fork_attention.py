"""ForkAttention against the attention a server could run instead, on the same
visible-key work, at Qwen3.5-4B attention shapes (16 query / 4 KV heads, head
size 256, bf16) on streams shaped like RACE, QuALITY and MultiRC.

Compared, each timed with ``triton.testing.do_bench`` (median) in one run:

* ForkAttention (Triton, this repo), path tables already built for the round;
* PyTorch SDPA with a dense boolean mask of the fork visibility rule;
* PyTorch ``flex_attention`` (compiled) with a block mask from the same rule;
* FlashInfer shared-prefix (cascade) attention, when ``flashinfer`` imports.

Throughput counts only visible (query, key) pairs: ``4 * D * pairs * Hq``
FLOPs; bytes are q, k, v and the output once. The bf16 matmul rate and the copy
bandwidth are measured in the same run.

Usage::

    python benchmark/kernels/bench_fork_attention.py --out fork_attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ceilings import copy_gbps, matmul_tflops  # noqa: E402
from timing import median_ms  # noqa: E402
from workloads import WORKLOADS, attention_inputs, workload_prompts  # noqa: E402

from flide_ext.kernels.fork_attention.kernel import fork_attention_triton  # noqa: E402
from flide_ext.kernels.fork_attention.paths import path_tables  # noqa: E402
from flide_ext.plan.flat import plan_round  # noqa: E402

HQ, HKV, D = 16, 4, 256


def visible_pairs(plan) -> int:
    _, _, _, own = path_tables(plan.seg_parent, plan.seg_kv_start, plan.seg_kv_len)
    n = plan.seg_len.long()
    return int((n * own.long() + n * (n + 1) // 2).sum())


def visibility(plan):
    """``anc[s, a]``: segment a is on segment s's path; and per-token segment and position."""
    S = plan.seg_parent.numel()
    anc = torch.eye(S, dtype=torch.bool, device=plan.seg_parent.device)
    cur = torch.arange(S, device=anc.device)
    for _ in range(8):
        cur = torch.where(cur >= 0, plan.seg_parent[cur.clamp(min=0)], cur)
        ok = cur >= 0
        anc[torch.arange(S, device=anc.device)[ok], cur[ok]] = True
    return anc, plan.token_segment, plan.positions


def dense_mask(plan) -> torch.Tensor:
    anc, seg, pos = visibility(plan)
    return anc[seg[:, None], seg[None, :]] & (pos[None, :] <= pos[:, None])


def run_workload(name: str, rows: list, flex) -> None:
    owners, prompts = workload_prompts(name)
    plan = plan_round(owners, prompts, "cuda")
    T = plan.num_tokens
    q, k, v = attention_inputs(T, HQ, HKV, D, torch.Generator(device="cuda").manual_seed(0))
    pairs = visible_pairs(plan)
    flops = 4 * D * pairs * HQ
    nbytes = 2 * (2 * T * HQ * D + 2 * T * HKV * D)
    args = (plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len, plan.positions,
            plan.kv_positions, D**-0.5)
    base = {"workload": name, "tokens": T, "segments": plan.num_segments, "visible_pairs": pairs,
            "per_question_tokens": sum(map(len, prompts))}

    def add(method, ms, note=""):
        row = {**base, "method": method, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12 if ms else None,
               "gbps": nbytes / (ms * 1e-3) / 1e9 if ms else None, "note": note}
        rows.append(row)
        tqdm.write(f"{name:8s} {method:34s} {ms if ms else float('nan'):8.3f} ms  "
                   f"{row['tflops'] or 0:7.1f} TFLOP/s {note}")

    fork = fork_attention_triton(q, k, v, *args)
    add("ForkAttention (Triton)", median_ms(lambda: fork_attention_triton(q, k, v, *args)))
    qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))
    try:
        mask = dense_mask(plan)
        sdpa = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=D**-0.5, enable_gqa=True)
        err = float((sdpa[0].transpose(0, 1).float() - fork.float()).norm() / sdpa.float().norm())
        add("SDPA, dense mask", median_ms(lambda: F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=D**-0.5, enable_gqa=True)), f"rel diff vs fork {err:.1e}")
        del mask
    except Exception as e:  # an out-of-memory dense mask is a result too
        add("SDPA, dense mask", None, f"failed: {type(e).__name__}: {str(e)[:120]}")
    if flex is not None:
        try:
            from torch.nn.attention.flex_attention import create_block_mask

            anc, seg, pos = visibility(plan)

            def mask_mod(b, h, qi, ki):
                return anc[seg[qi], seg[ki]] & (pos[ki] <= pos[qi])

            block_mask = create_block_mask(mask_mod, None, None, T, T, device="cuda")
            out = flex(qh, kh, vh, block_mask=block_mask, scale=D**-0.5, enable_gqa=True)
            err = float((out[0].transpose(0, 1).float() - fork.float()).norm() / out.float().norm())
            add("flex_attention, block mask", median_ms(lambda: flex(qh, kh, vh, block_mask=block_mask, scale=D**-0.5,
                                                                 enable_gqa=True)), f"rel diff vs fork {err:.1e}")
        except Exception as e:
            traceback.print_exc()
            add("flex_attention, block mask", None, f"failed: {type(e).__name__}: {str(e)[:120]}")
    try:
        import flashinfer  # noqa: F401

        add("FlashInfer cascade", None, "installed but not wired in this run")
    except ImportError:
        add("FlashInfer cascade", None, "not installed on the device machine")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="fork_attention.json")
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--no-flex", action="store_true", help="skip flex_attention (its compile takes a while)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"{Path(__file__).name}: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    ceilings = {"matmul_tflops_bf16": matmul_tflops(), "copy_gbps": copy_gbps()}
    print(f"ceilings: {ceilings}", flush=True)
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
    rows: list = []
    for name in tqdm(args.workloads, desc="workloads"):
        try:
            run_workload(name, rows, flex)
        except Exception:
            traceback.print_exc()
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "ceilings": ceilings,
                                              "shape": {"Hq": HQ, "Hkv": HKV, "D": D, "dtype": "bf16"},
                                              "rows": rows}, indent=1))
    print(f"{'workload':9s} {'method':34s} {'ms':>8s} {'TFLOP/s':>8s} {'% best other':>12s}")
    for name in args.workloads:
        mine = [r for r in rows if r["workload"] == name and r["method"].startswith("ForkAttention")]
        others = [r["tflops"] for r in rows if r["workload"] == name and r["tflops"] and r not in mine]
        for r in mine:
            share = f"{100 * r['tflops'] / max(others):.0f}%" if others else "n/a"
            print(f"{name:9s} {r['method']:34s} {r['ms']:8.3f} {r['tflops']:8.1f} {share:>12s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
