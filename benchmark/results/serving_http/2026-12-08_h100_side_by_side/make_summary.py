"""summary.json and plot.png of this record: python make_summary.py (reads flide/, sglang/ and gpu.txt; see README)."""
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ENGINES = ("flide", "sglang")
rows = []
for engine in ENGINES:
    for f in sorted(glob.glob(f"{engine}/*.jsonl")):
        for line in open(f):
            r = json.loads(line)
            rows.append({"engine": engine, "workload": os.path.basename(f)[:-6], "clients": r["max_concurrency"],
                         "requests": r["completed"], "failed": r["decision_failed"],
                         "in_flight": round(r["concurrency"], 1),
                         "p50_ms": round(r["median_e2e_latency_ms"], 2), "p99_ms": round(r["p99_e2e_latency_ms"], 2),
                         "questions_per_s": round(r["decision_questions_per_s"], 1)})
rows.sort(key=lambda r: (r["workload"].split("@")[0], r["clients"], ENGINES.index(r["engine"])))
ratios = []
for r in rows:
    if r["engine"] != "flide":
        continue
    s = next(x for x in rows if x["engine"] == "sglang" and x["workload"] == r["workload"]
             and x["clients"] == r["clients"])
    ratios.append({"workload": r["workload"].split("@")[0], "clients": r["clients"],
                   "p50_sglang_over_flide": round(s["p50_ms"] / r["p50_ms"], 2),
                   "questions_per_s_flide_over_sglang": round(r["questions_per_s"] / s["questions_per_s"], 2)})
lines = open("flide/server.log").read().splitlines()
summary = {"gpu": open("gpu.txt").read().strip(), "commit": "6c71f62", "http": rows, "ratios": ratios,
           "flide_ready": next(x.split("] ", 1)[1] for x in lines if "Decision server ready" in x),
           "flide_decision_stats": [x.split("Decision stats. ")[1] for x in lines if "Decision stats." in x],
           "flide_http_floor": json.load(open("flide/http_floor.json"))["rows"]}
with open("summary.json", "w") as out:
    json.dump(summary, out, indent=1)
for r in rows:
    print(f"{r['engine']:7s} {r['workload']:22s} {r['clients']:3d} {r['requests']:5d} {r['in_flight']:5.1f} "
          f"{r['p50_ms']:9.2f} {r['p99_ms']:9.2f} {r['questions_per_s']:9.1f}")
for r in ratios:
    print(r)

NAMES = {"flide": "Flide (--decision-mode)", "sglang": "SGLang 0.5.17 (/v1/score)"}
fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for ax, (dataset, title) in zip(axes[:2], [("sgl_race_single", "RACE-like, one question"),
                                          ("sgl_multirc", "MultiRC-like, 30 questions")]):
    for engine, label in NAMES.items():
        mine = sorted((r["clients"], r["questions_per_s"]) for r in rows
                      if r["engine"] == engine and r["workload"].split("@")[0] == dataset)
        ax.plot([c for c, _ in mine], [q for _, q in mine], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("clients")
    ax.set_ylabel("questions/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
one = [r for r in rows if r["clients"] == 1]
names = ["sgl_race_single", "sgl_multirc", "sgl_quality"]
for i, (engine, label) in enumerate(NAMES.items()):
    p50 = [next(r["p50_ms"] for r in one if r["engine"] == engine and r["workload"] == w) for w in names]
    axes[2].bar([j + 0.4 * i for j in range(3)], p50, width=0.4, label=label)
axes[2].set_xticks([j + 0.2 for j in range(3)], ["RACE", "MultiRC", "QuALITY"])
axes[2].set_yscale("log")
axes[2].set_ylabel("p50 ms, one client")
axes[2].set_title("Latency, one client")
axes[2].legend(fontsize=8)
fig.suptitle("Over HTTP, Qwen3.5-4B shape, one H100, same client and requests (2026-12-08, commit 6c71f62)")
fig.tight_layout()
fig.savefig("plot.png", dpi=110)
