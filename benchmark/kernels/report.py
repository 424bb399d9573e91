"""Tables and a plot from the kernel runs' JSON files (``check_kernels.py``,
``bench_fork_attention.py``, ``bench_gdn.py``) in one results folder; when
present, also ``check_4b.json`` (the 4B whole-model check run as its own step),
``states_vs_fla.json`` and ``sweep_tree.json`` (``sweep_kernels.py``).

Usage::

    python benchmark/kernels/report.py benchmark/results/kernels

Writes ``tables.md`` and ``kernels.png`` into that folder.

Exit status 2 with one line when a JSON file is missing or unreadable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(folder: Path, name: str) -> dict:
    try:
        return json.loads((folder / name).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"report: cannot read {folder / name}: {e}")


def load_optional(folder: Path, name: str):
    return load(folder, name) if (folder / name).exists() else None


def sweep_tables(states: dict | None, tree: dict | None) -> list[str]:
    lines = []
    if states:
        lines += ["Inter-chunk kernel alone, own (forked-state) against fla's `chunk_gated_delta_rule_fwd_h` on the "
                  "same WY factors (GPU kernel ms):", "",
                  "| (BLOCK_V, warps, stages) | " + " | ".join(dict.fromkeys(r["workload"] for r in states["rows"])) + " |"]
        workloads = list(dict.fromkeys(r["workload"] for r in states["rows"]))
        lines.append("|---|" + "---|" * len(workloads))
        fla = {r["workload"]: r["fla_device_ms"] for r in states["rows"]}
        for cfg in dict.fromkeys(tuple(r["config"]) for r in states["rows"]):
            cells = [next((f"{r['device_ms']:.3f} ({100 * fla[w] / r['device_ms']:.0f}% of fla)"
                           for r in states["rows"] if r["workload"] == w and tuple(r["config"]) == cfg), "-")
                     for w in workloads]
            lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
        lines.append("| fla fwd_h | " + " | ".join(f"{fla[w]:.3f}" for w in workloads) + " |")
        lines.append("")
    rows = [r for r in (tree or {}).get("rows", []) if r.get("kernel") in ("gdn_tree", "gdn_forked")]
    if rows:
        lines += ["Whole GDN pass by inter-chunk setting and `RECURRENT_MAX_LEN` (GPU kernel ms; share of fla's "
                  "chunk kernel on the same tokens):", "",
                  "| workload | (BLOCK_V, warps, stages) | recurrent max len | ms | share of fla |", "|---|---|---|---|---|"]
        for r in rows:
            d = f"{r['device_ms']:.3f}" if r.get("device_ms") else "-"
            share = f"{100 * r['share_of_fla']:.0f}%" if r.get("share_of_fla") else "-"
            lines.append(f"| {r['workload']} | {tuple(r['states_config'])} | {r['recurrent_max_len']} | {d} | {share} |")
        lines.append("")
    return lines


def attention_table(fa: dict) -> list[str]:
    lines = ["| workload | tokens | segments | method | ms | TFLOP/s (visible pairs) | note |",
             "|---|---|---|---|---|---|---|"]
    for r in fa["rows"]:
        ms = f"{r['ms']:.3f}" if r["ms"] else "-"
        tf = f"{r['tflops']:.1f}" if r["tflops"] else "-"
        lines.append(f"| {r['workload']} | {r['tokens']} | {r['segments']} | {r['method']} | {ms} | {tf} | {r['note']} |")
    lines += ["", "| workload | ForkAttention share of the best other method |", "|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in fa["rows"]):
        rows = [r for r in fa["rows"] if r["workload"] == w and r["tflops"]]
        mine = [r for r in rows if r["method"].startswith("ForkAttention")]
        others = [r for r in rows if not r["method"].startswith("ForkAttention")]
        if mine and others:
            best = max(others, key=lambda r: r["tflops"])
            lines.append(f"| {w} | {100 * mine[0]['tflops'] / best['tflops']:.0f}% of {best['method']} |")
    return lines


def gdn_table(gdn: dict) -> list[str]:
    lines = ["| workload | tokens | segments | method | ms (wall) | ms (GPU kernels) | ms (CUDA graph replay) | "
             "share of fla, wall | share of fla, kernels | share of fla, graphs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in gdn["rows"]:
        dev = f"{r['device_ms']:.3f}" if r.get("device_ms") else "-"
        graph = f"{r['graph_ms']:.3f}" if r.get("graph_ms") else "-"
        share = f"{100 * r['share_of_fla']:.0f}%" if "share_of_fla" in r else ""
        dshare = f"{100 * r['device_share_of_fla']:.0f}%" if "device_share_of_fla" in r else ""
        gshare = f"{100 * r['graph_share_of_fla']:.0f}%" if r.get("graph_share_of_fla") else ""
        lines.append(f"| {r['workload']} | {r['tokens']} | {r['segments']} | {r['method']} | {r['ms']:.3f} | {dev} | "
                     f"{graph} | {share} | {dshare} | {gshare} |")
    lines += ["", "Question level alone (32 questions, each forked from one of 4 parent states):", "",
              "| question tokens | recurrent ms (kernels) | chunk, forked states ms (kernels) | gather + fla ms (kernels) |",
              "|---|---|---|---|"]
    for r in gdn["question_level"]:
        cells = [f"{r[k + '_ms']:.3f} ({r[k + '_device_ms']:.3f})" for k in ("recurrent", "chunk_forked", "gather_fla")]
        lines.append(f"| {r['question_tokens']} | " + " | ".join(cells) + " |")
    return lines


def check_table(checks: dict) -> list[str]:
    lines = ["| check | value | tolerance | pass |", "|---|---|---|---|"]
    for r in checks["checks"]:
        value = r["value"]
        if isinstance(value, float):
            value = f"{value:.3g}"
        elif isinstance(value, dict):
            value = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
        extra = ""
        if "argmax_agreement" in r:
            extra = (f" (mean TV {r['mean_tv']:.3g}; same model with reference kernels in bf16: max TV "
                     f"{r['bf16_reference_kernels_max_tv']:.3g}; argmax agreement {r['argmax_agreement']:.2f})")
        tol = f"{r['tolerance']:.3g}" if isinstance(r["tolerance"], float) else r["tolerance"]
        lines.append(f"| {r['check']} | {value}{extra} | {tol} | {'yes' if r['pass'] else 'NO'} |")
    return lines


def plot(fa: dict, gdn: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    workloads = list(dict.fromkeys(r["workload"] for r in fa["rows"]))
    methods = [m for m in dict.fromkeys(r["method"] for r in fa["rows"])
               if any(r["method"] == m and r["tflops"] for r in fa["rows"])]
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        vals = [next((r["tflops"] or 0 for r in fa["rows"] if r["workload"] == w and r["method"] == m), 0)
                for w in workloads]
        ax1.bar([x + i * width for x in range(len(workloads))], vals, width, label=m)
    ax1.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(workloads))], workloads)
    ax1.set_ylabel("TFLOP/s on visible (query, key) pairs")
    ax1.set_title("Attention, Qwen3.5-4B shape (16/4 heads x 256), bf16, H200")
    ax1.legend(fontsize=8)
    gworkloads = list(dict.fromkeys(r["workload"] for r in gdn["rows"]))
    gmethods = list(dict.fromkeys(r["method"] for r in gdn["rows"] if not r["method"].startswith("causal conv1d")))
    bars = [(m, key) for key in ("device_ms", "ms") for m in gmethods]
    width = 0.8 / len(bars)
    for i, (m, key) in enumerate(bars):
        vals = [next((r.get(key) or 0 for r in gdn["rows"] if r["workload"] == w and r["method"] == m), 0)
                for w in gworkloads]
        label = f"{m}: {'GPU kernels' if key == 'device_ms' else 'wall'}"
        ax2.bar([x + i * width for x in range(len(gworkloads))], vals, width, label=label)
    ax2.set_xticks([x + width * (len(bars) - 1) / 2 for x in range(len(gworkloads))], gworkloads)
    ax2.set_ylabel("ms per GDN layer (lower is better)")
    ax2.set_title("Gated delta rule, Qwen3.5-4B GDN shape (16/32 heads x 128)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    fa, gdn, checks = (load(args.folder, n) for n in ("fork_attention.json", "gdn.json", "check_kernels.json"))
    extra = load_optional(args.folder, "check_4b.json")
    if extra:
        checks["checks"] += extra["checks"]
    sweeps = sweep_tables(load_optional(args.folder, "states_vs_fla.json"), load_optional(args.folder, "sweep_tree.json"))
    lines = ["Made by `python benchmark/kernels/report.py` from the JSON files in this folder.", "",
             f"Device: {checks['info']['device']}, torch {checks['info']['torch']}, triton "
             f"{checks['info'].get('triton')}; fla-core installed: {checks['info']['fla']}. "
             f"Ceilings measured in the attention run: bf16 matmul {fa['ceilings']['matmul_tflops_bf16']:.0f} TFLOP/s, "
             f"copy {fa['ceilings']['copy_gbps']:.0f} GB/s.", "", "## Correctness", "", *check_table(checks),
             "", "## ForkAttention", "", *attention_table(fa), "", "## GDN state forking", "", *gdn_table(gdn), "", *sweeps]
    (args.folder / "tables.md").write_text("\n".join(lines))
    plot(fa, gdn, args.folder / "kernels.png")
    print(f"wrote {args.folder / 'tables.md'} and {args.folder / 'kernels.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
