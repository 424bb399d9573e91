"""Two bench_serving runs of the same workload side by side (e.g. Flide and SGLang on
one machine): a markdown table with both engines' numbers and their ratios, and a plot.

Usage::

    python benchmark/serving/compare.py OUT/flide/agent_a8.json OUT/sglang/agent_a8.json --out OUT/compare/agent_a8

A run is benchmark/bench_serving.py's JSON or benchmark/bench_serving_sglang.py's
JSON-lines file (SGLang's bench_serving: one line per ``--max-concurrency``, its
``--tag`` the label; p50 is its median end-to-end latency).

Ratios: latency B/A (how many times longer B takes; > 1 means A is faster),
throughput A/B (> 1 means A answers more per second). Writes ``OUT.md`` and
``OUT.png``; exit status 2 with one line when a file cannot be read or the two runs
are of different workloads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Settings that may differ between the two runs without making them incomparable.
FREE = {"check_cold", "cold_limit", "warmup"}


def ratio(num, den):
    return None if num is None or den in (None, 0) else num / den


def fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def from_jsonl(text: str, path: str) -> dict:
    """A bench_serving_sglang.py JSON-lines file in bench_serving.py's result shape."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no JSON lines")
    first = lines[0]
    summary = [{"concurrency": line["max_concurrency"], "questions_per_s": line.get("decision_questions_per_s"),
                "latency": {"p50_ms": line["median_e2e_latency_ms"], "p90_ms": line["p90_e2e_latency_ms"],
                            "p99_ms": line["p99_e2e_latency_ms"]}} for line in lines]
    levels = " ".join(str(line["max_concurrency"]) for line in lines)
    return {"label": first.get("tag") or Path(path).parent.name, "url": "bench_serving JSON lines",
            "settings": {"workload": first["dataset_name"], "backend": first["backend"],
                         "requests": first["completed"] + first.get("decision_failed", 0)},
            "summary": summary, "cold_check": None,
            "command": f"bench_serving_sglang.py --backend {first['backend']} --dataset-name {first['dataset_name']}"
                       f" --max-concurrency {{{levels}}}"}


def load_run(path: str) -> dict:
    text = Path(path).read_text()
    return from_jsonl(text, path) if path.endswith(".jsonl") else json.loads(text)


def rows_of(a: dict, b: dict) -> list:
    """``(metric, A value, B value, ratio, kind)`` rows; kind is "latency" or "throughput"."""
    rows = []
    if a["settings"]["workload"] == "agent":
        sa, sb = a["summary"], b["summary"]
        for part, title in (("first_step", "first step"), ("later_steps", "later steps"), ("all_steps", "all steps")):
            for q in ("p50", "p90"):
                x, y = sa[part][f"{q}_ms"], sb[part][f"{q}_ms"]
                rows.append((f"{title} {q} ms", x, y, ratio(y, x), "latency"))
        rows.append(("decisions/s", sa["decisions_per_s"], sb["decisions_per_s"],
                     ratio(sa["decisions_per_s"], sb["decisions_per_s"]), "throughput"))
        x, y = (s.get("decisions_per_s_after_first_steps") for s in (sa, sb))  # absent in older results
        if x is not None and y is not None:
            rows.append(("decisions/s after first steps", x, y, ratio(x, y), "throughput"))
        rows.append(("wall s", sa["wall_s"], sb["wall_s"], ratio(sb["wall_s"], sa["wall_s"]), "latency"))
        return rows
    by_c = {r["concurrency"]: r for r in b["summary"]}
    for ra in a["summary"]:
        rb = by_c.get(ra["concurrency"])
        if rb is None:
            continue
        c = ra["concurrency"]
        for q in ("p50", "p90", "p99"):
            x, y = ra["latency"][f"{q}_ms"], rb["latency"][f"{q}_ms"]
            rows.append((f"{c} clients {q} ms", x, y, ratio(y, x), "latency"))
        rows.append((f"{c} clients questions/s", ra["questions_per_s"], rb["questions_per_s"],
                     ratio(ra["questions_per_s"], rb["questions_per_s"]), "throughput"))
    return rows


def cold_line(run: dict) -> str:
    cold = run.get("cold_check")
    if not cold:
        return "not checked"
    how = "flushed before each" if cold["flushed"] else f"no flush (HTTP {cold['flush_status']})"
    return f"{cold['equal']}/{cold['total']} bitwise equal ({how}), {cold['argmax_flips']} argmax flips"


def markdown(a: dict, b: dict, rows: list, paths) -> str:
    la, lb = a["label"], b["label"]
    s = {k: v for k, v in a["settings"].items() if k not in FREE}
    lines = [f"# {la} vs {lb}: {a['settings']['workload']}", "",
             f"Settings: `{json.dumps(s)}`", "", f"- {la}: `{paths[0]}` ({a['url']})", f"- {lb}: `{paths[1]}` ({b['url']})",
             "", f"| metric | {la} | {lb} | ratio |", "|---|---|---|---|"]
    for name, x, y, r, kind in rows:
        meaning = f"{lb}/{la}" if kind == "latency" else f"{la}/{lb}"
        lines.append(f"| {name} | {fmt(x)} | {fmt(y)} | {fmt(r, 2)} ({meaning}) |")
    lines += ["", f"Cold resend: {la} {cold_line(a)}; {lb} {cold_line(b)}.", "",
              f"{la}: `{a['command']}`", "", f"{lb}: `{b['command']}`"]
    return "\n".join(lines) + "\n"


def plot(a: dict, b: dict, path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if a["settings"]["workload"] == "agent":
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for run in (a, b):
            rows = [r for r in run["summary"]["per_step"] if r["n"]]
            line = ax.plot([r["step"] for r in rows], [r["p50_ms"] for r in rows], "o-", label=f"{run['label']} p50")
            ax.plot([r["step"] for r in rows], [r["p90_ms"] for r in rows], "--", color=line[0].get_color(),
                    label=f"{run['label']} p90")
        ax.set_xlabel("step")
        ax.set_ylabel("latency (ms)")
        ax.legend(fontsize=8)
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
        levels = [r["concurrency"] for r in a["summary"]]
        width = 0.4
        for i, run in enumerate((a, b)):
            by_c = {r["concurrency"]: r for r in run["summary"]}
            xs = [k + i * width for k in range(len(levels))]
            left.bar(xs, [(by_c.get(c) or {}).get("latency", {}).get("p50_ms") or 0 for c in levels], width,
                     label=run["label"])
            right.bar(xs, [(by_c.get(c) or {}).get("questions_per_s") or 0 for c in levels], width, label=run["label"])
        for ax, title in ((left, "p50 latency (ms)"), (right, "questions/s")):
            ax.set_xticks([k + width / 2 for k in range(len(levels))], [str(c) for c in levels])
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(title)
            ax.legend(fontsize=8)
    fig.suptitle(f"{a['label']} vs {b['label']}: {a['settings']['workload']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.split("\n")[0])
    p.add_argument("a", help="the first run's JSON (e.g. flide)")
    p.add_argument("b", help="the second run's JSON (e.g. sglang)")
    p.add_argument("--out", required=True, help="output path without suffix (writes OUT.md and OUT.png)")
    args = p.parse_args(argv)
    runs = []
    for path in (args.a, args.b):
        try:
            runs.append(load_run(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"compare.py: cannot read {path}: {e}", file=sys.stderr)
            return 2
    a, b = runs
    if a["settings"]["workload"] != b["settings"]["workload"]:
        print(f"compare.py: different workloads ({a['settings']['workload']} vs {b['settings']['workload']})",
              file=sys.stderr)
        return 2
    rows = rows_of(a, b)
    text = markdown(a, b, rows, (args.a, args.b))
    differ = sorted(k for k in set(a["settings"]) | set(b["settings"])
                    if k not in FREE and a["settings"].get(k) != b["settings"].get(k))
    if differ:
        text += f"\nWarning: the runs' settings differ in {', '.join(differ)}.\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text(text)
    drawn = plot(a, b, Path(f"{out}.png"))
    print(text)
    print(f"wrote {out}.md" + (", .png" if drawn else " (no matplotlib: no plot)"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
