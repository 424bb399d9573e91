"""summary.json of this record: python make_summary.py (reads flide/, gpu.txt; see README)."""
import glob
import json
import os
import re

rows = []
for f in sorted(glob.glob("flide/*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        rows.append({"file": os.path.basename(f), "dataset": r["dataset_name"], "clients": r["max_concurrency"],
                     "keep_alive": r["decision_keep_alive"], "requests": r["completed"], "failed": r["decision_failed"],
                     "p50_ms": round(r["median_e2e_latency_ms"], 2), "p99_ms": round(r["p99_e2e_latency_ms"], 2),
                     "questions_per_s": round(r["decision_questions_per_s"], 1)})
# The 8-client MultiRC level: its JSON line was removed by the next call's rerun of the preset (README); from its log.
log = open("flide/sgl_multirc@load.log").read().split("Serving Benchmark Result")[1]


def field(name):
    return float(re.search(re.escape(name) + r":\s+([0-9.]+)", log).group(1))


rows.append({"file": "sgl_multirc@load.log", "dataset": "multirc", "clients": 8, "keep_alive": False,
             "requests": int(field("Successful requests")), "failed": 0, "p50_ms": field("Median E2E Latency (ms)"),
             "p99_ms": field("P99 E2E Latency (ms)"), "questions_per_s": field("Decision questions/s")})
log_lines = open("flide/server.log").read().splitlines()
summary = {"gpu": open("gpu.txt").read().strip().splitlines()[-1], "commit": "f5cc651",
           "server_ready_line": next(line.strip() for line in log_lines if "Decision server ready" in line),
           "http": rows,
           "decision_stats_lines": [line.split("Decision stats. ")[1].strip() for line in log_lines
                                    if "Decision stats." in line]}
with open("summary.json", "w") as out:
    json.dump(summary, out, indent=1)
