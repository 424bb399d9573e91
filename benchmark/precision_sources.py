"""Where Flide's bf16 answers lose to float32: each step swapped in turn for a
float32 version (``fidelity/swaps.py``), the same questions answered each time.

For one checkpoint and question set, the float32 reference is transformers' float32
forward of each full prompt (as ``bench_fidelity.py``). Flide's engine (``--dtype``,
eager: swaps are Python, which a CUDA graph would not see) answers the questions
as it is, then once per swap, then with all kernel swaps, all storage swaps and
all swaps at once. Per run: mean / p99 TV to float32, argmax agreement, and the
swap's **share**: the fraction of the as-is mean TV it removes. Beside them, as
lines to read the shares against: transformers in ``--dtype`` on the same prompts
(the GDN kernels it picks, and its own PyTorch GDN recurrence when those differ).
``--residual-dtype model`` and ``--gdn-rule-dtype float32`` configure the engine
diagnosed (here they are not extra engines, as in ``bench_fidelity.py``).

Usage::

    python benchmark/precision_sources.py --model qwen3.5-4b --device cuda --sets multirc \\
        --requests 16 --out benchmark/results/fidelity/sources_4b

``--out DIR`` writes ``sources.json`` (every run's per-question TV and summary),
``sources.md`` (the table and the command) and ``sources.png``. Exit status 0; 2
with one line on bad arguments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_fidelity  # noqa: E402
from fidelity import metrics  # noqa: E402
from fidelity.swaps import SWAPS, swapped  # noqa: E402


def runs(names: list) -> list:
    """``(label, swaps)``: as is, each swap, then the kernel, storage and all groups."""
    kernel = [n for n in names if SWAPS[n][0] == "kernel"]
    storage = [n for n in names if SWAPS[n][0] == "storage"]
    out = [("as is", [])] + [(n, [n]) for n in names]
    if len(kernel) > 1:
        out.append(("all kernel swaps", kernel))
    if len(storage) > 1:
        out.append(("all storage swaps", storage))
    if kernel and storage:
        out.append(("all swaps", names))
    return out


def evaluate(args) -> dict:
    from flide_ext import Engine

    device = torch.device(args.device)
    fla_configs = bench_fidelity.shipped_fla_configs(device)
    path = bench_fidelity.checkpoint(args)
    sets = bench_fidelity.question_sets(args, path)
    reference = dict(bench_fidelity.run_transformers(path, sets, torch.float32, device, True, "float32 reference"))
    ref = [metrics.label_distribution(lp) for s in sets for lp in reference[s]]
    engine = Engine(str(path), dtype=bench_fidelity.DTYPES[args.dtype], device=device, radix_cache=False,
                    cuda_graphs="off" if device.type == "cuda" else None, gdn_rule_dtype=args.gdn_rule_dtype,
                    residual_dtype=args.residual_dtype)
    model = engine.runner.model
    groups = [g for s in sets for g in sets[s]]
    names = args.swaps or list(SWAPS)
    table = []
    for label, swaps in tqdm(runs(names), desc="swaps", unit="run"):
        try:
            with swapped(model, swaps):
                result = engine.run_rounds(groups)
        except Exception as e:  # noqa: BLE001 - a swap the kernels cannot take is recorded, the rest run
            table.append({"run": label, "swaps": swaps, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        answers = [metrics.label_distribution(lp) for a in result.answers for lp in a]
        cmp = metrics.compare(answers, ref)
        table.append({"run": label, "swaps": swaps, **metrics.summarize(cmp["tv"], cmp["argmax_equal"]),
                      "mean_sq_error": float(np.mean(cmp["sq_error"])), "tv": cmp["tv"]})
    for _, label, torch_gdn in bench_fidelity.transformers_baselines(path, args.dtype):
        answers = dict(bench_fidelity.run_transformers(path, sets, bench_fidelity.DTYPES[args.dtype], device, torch_gdn,
                                                       label))
        cmp = metrics.compare([metrics.label_distribution(lp) for s in sets for lp in answers[s]], ref)
        table.append({"run": label, "swaps": None, **metrics.summarize(cmp["tv"], cmp["argmax_equal"]),
                      "mean_sq_error": float(np.mean(cmp["sq_error"])), "tv": cmp["tv"]})
    base, base_sq = table[0]["mean_tv"], table[0]["mean_sq_error"]
    for row in table:
        if "mean_tv" in row:
            row["share"] = (base - row["mean_tv"]) / base if base > 0 else 0.0
            row["share_sq"] = (base_sq - row["mean_sq_error"]) / base_sq if base_sq > 0 else 0.0
    settings = {"model": args.model, "checkpoint": str(path), "dtype": args.dtype, "device": str(device),
                "sets": args.sets, "requests": args.requests, "scale": args.scale, "seed": args.seed,
                "head_scale": args.head_scale, "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                "kernel_backend": model.kernel_backend or ("triton" if device.type == "cuda" else "reference"),
                "fla_configs": fla_configs, "gdn_rule_dtype": args.gdn_rule_dtype,
                "residual_dtype": args.residual_dtype}
    return {"settings": settings, "runs": table, "swaps": {n: SWAPS[n] for n in names}}


def markdown(results: dict) -> str:
    s = results["settings"]
    lines = [f"# Error sources of Flide {s['dtype']} vs float32: {s['model']} ({s['gpu'] or s['device']}, "
             f"sets {', '.join(s['sets'])})", "",
             "| run | kind | float32 there | mean TV | p99 TV | argmax agree | share of as-is TV | "
             "share of squared error |", "|---|---|---|---|---|---|---|---|"]
    for row in results["runs"]:
        kind, what = results["swaps"].get(row["run"], ("", ""))
        if row.get("swaps") is None:
            kind, what = "baseline", "one prompt per forward"
        if "error" in row:
            lines.append(f"| {row['run']} | {kind} | {what} | error: {row['error']} | | | | |")
            continue
        lines.append(f"| {row['run']} | {kind} | {what} | {row['mean_tv']:.5f} | {row['p99_tv']:.5f} | "
                     f"{row['argmax_agree']}/{row['questions']} | {row['share']:+.1%} | {row['share_sq']:+.1%} |")
    lines += ["", "Command:", "", f"    {results.get('command', '')}", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["runs"] if "mean_tv" in r]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    ax.barh([r["run"] for r in rows][::-1], [r["mean_tv"] for r in rows][::-1])
    ax.axvline(rows[0]["mean_tv"], color="k", lw=0.8, ls="--")
    ax.set_xlabel("mean TV to float32 (dashed: Flide as is)")
    ax.set_title(f"{results['settings']['model']}: one step in float32 at a time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = bench_fidelity.build_parser()
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("--swaps", nargs="+", choices=list(SWAPS), help="the swaps to run (default: all)")
    args = parser.parse_args(argv)
    try:
        if args.requests < 1:
            raise bench_fidelity.BadArguments(f"--requests {args.requests} must be at least 1")
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise bench_fidelity.BadArguments(f"--device {args.device}: no CUDA device here")
        if args.out and not Path(args.out).parent.is_dir():
            raise bench_fidelity.BadArguments(f"--out {args.out}: its parent directory does not exist")
        if args.server:
            raise bench_fidelity.BadArguments("--server: the diagnostic swaps Flide's own steps; use bench_fidelity.py")
        results = evaluate(args)
    except bench_fidelity.BadArguments as e:
        print(f"precision_sources: error: {e}", file=sys.stderr)
        return 2
    results["command"] = "python benchmark/precision_sources.py " + " ".join(argv if argv is not None else sys.argv[1:])
    table = markdown(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(exist_ok=True)
        (out / "sources.json").write_text(json.dumps(results, indent=1))
        (out / "sources.md").write_text(table)
        plot(results, out / "sources.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
