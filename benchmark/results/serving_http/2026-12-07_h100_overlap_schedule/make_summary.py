"""summary.json of this record: python make_summary.py (reads the engines' folders and gpu.txt; see README)."""
import glob
import json
import os
import re

ENGINES = ("flide", "flide_seq", "flide08", "sglang")


def from_log(path, block):
    # One level's result from a bench_serving log (its BLOCK-th "Serving Benchmark Result", 0 first).
    text = open(path).read().split("Serving Benchmark Result")[block + 1]

    def field(name):
        return float(re.search(re.escape(name) + r":\s+([0-9.]+)", text).group(1))

    return {"clients": int(field("Max request concurrency")), "requests": int(field("Successful requests")),
            "failed": 0, "p50_ms": field("Median E2E Latency (ms)"), "p99_ms": field("P99 E2E Latency (ms)"),
            "questions_per_s": field("Decision questions/s"), "from": os.path.basename(path)}


rows = []
for engine in ENGINES:
    for f in sorted(glob.glob(f"{engine}/*.jsonl")):
        for line in open(f):
            r = json.loads(line)
            rows.append({"engine": engine, "workload": os.path.basename(f)[:-6], "clients": r["max_concurrency"],
                         "requests": r["completed"], "failed": r["decision_failed"],
                         "p50_ms": round(r["median_e2e_latency_ms"], 2), "p99_ms": round(r["p99_e2e_latency_ms"], 2),
                         "questions_per_s": round(r["decision_questions_per_s"], 1)})
# flide_seq's 8-client RACE level: the next call's rerun of the preset (64 clients) removed its JSON line; from its log.
rows.append({"engine": "flide_seq", "workload": "sgl_race_single@load", **from_log("flide_seq/sgl_race_single@load.log", 0)})
rows.sort(key=lambda r: (r["workload"].split("@")[0], r["clients"], ENGINES.index(r["engine"])))


def stats(path):
    lines = open(path).read().splitlines()
    return {"ready": next(line.split("] ", 1)[1] for line in lines if "Decision server ready" in line),
            "decision_stats": [line.split("Decision stats. ")[1] for line in lines if "Decision stats." in line]}


summary = {"gpu": open("gpu.txt").read().strip(), "commit": "9192fca", "http": rows,
           "server_logs": {p: stats(p) for p in ("flide/server.log", "flide_seq/server_first.log",
                                                 "flide_seq/server.log", "flide08/server.log")}}
with open("summary.json", "w") as out:
    json.dump(summary, out, indent=1)
for r in rows:
    print(f"{r['engine']:10s} {r['workload']:22s} {r['clients']:3d} {r['requests']:5d} {r['p50_ms']:9.2f} "
          f"{r['p99_ms']:9.2f} {r['questions_per_s']:9.1f}")
