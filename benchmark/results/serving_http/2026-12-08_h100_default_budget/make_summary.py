"""summary.json and plot.png of this record: python make_summary.py (reads flide/, inprofile/, gpu.txt; see README)."""
import glob
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = []
for f in sorted(glob.glob("flide/*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        rows.append({"workload": os.path.basename(f)[:-6], "clients": r["max_concurrency"], "requests": r["completed"],
                     "failed": r["decision_failed"], "in_flight_mean": round(r["concurrency"], 1),
                     "p50_ms": round(r["median_e2e_latency_ms"], 2), "questions_per_s": round(r["decision_questions_per_s"], 1)})
rounds = []
for line in open("inprofile/profile.log"):
    m = re.search(r"^(\S+?)(?: after load)?: p50 of 30 .*?: ([0-9.]+) ms = plan ([0-9.]+) \+ forward [0-9.]+ \(tables ([0-9.]+), "
                  r"GPU ([0-9.]+)\) \+ finish ([0-9.]+)", line)
    m = m or re.search(r"(\d+) question\(s\) .*?: ([0-9.]+) ms = plan ([0-9.]+) \+ forward [0-9.]+ \(tables ([0-9.]+), "
                       r"GPU ([0-9.]+)\) \+ finish ([0-9.]+)", line)
    if m:
        rounds.append({"line": line.split(":")[0], "round_ms": float(m.group(2)), "plan_ms": float(m.group(3)),
                       "tables_ms": float(m.group(4)), "gpu_ms": float(m.group(5)), "finish_ms": float(m.group(6))})
ready = next(line.split("] ", 1)[1].strip() for line in open("flide/server.log") if "Decision server ready" in line)
summary = {"gpu": open("gpu.txt").read().strip(), "commit": "e007766", "http": rows, "inprocess_rounds": rounds,
           "inprocess_state_cache_bytes": json.load(open("inprofile/profile.json"))["state_cache_bytes"],
           "ready_line": ready, "http_floor": json.load(open("flide/http_floor.json"))["rows"]}
json.dump(summary, open("summary.json", "w"), indent=1)
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, (name, bar) in zip(axes, [("sgl_race_single", 140), ("sgl_multirc", 1800)]):
    pts = sorted((r["clients"], r["questions_per_s"]) for r in rows if r["workload"].split("@")[0] == name)
    ax.plot([c for c, _ in pts], [q for _, q in pts], marker="o", label="Flide (this H100)")
    ax.axhline(bar, color="tab:red", linestyle=":", label=f"issue 18 bar at 64 clients ({bar})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("clients (1: 128 requests; 8: 256; 64: 2,048)")
    ax.set_ylabel("questions/s")
    ax.set_title(name)
    ax.legend(fontsize=8)
fig.suptitle("Flide over HTTP, Qwen3.5-4B shape, H100 80GB, SGLang's bench_serving (2026-12-08, e007766)")
fig.tight_layout()
fig.savefig("plot.png", dpi=100)
for r in rows:
    print(r)
for r in rounds:
    print(r)
