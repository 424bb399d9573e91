"""summary.json of this record: python make_summary.py (reads the engines' folders, abprofile/, sweepconv/ and
gpu.txt; see README)."""
import glob
import json
import os
import re

ENGINES = ("flide", "flide_p32k", "sglang")

rows = []
for engine in ENGINES:
    for f in sorted(glob.glob(f"{engine}/*.jsonl")):
        for line in open(f):
            r = json.loads(line)
            rows.append({"engine": engine, "workload": os.path.basename(f)[:-6], "clients": r["max_concurrency"],
                         "requests": r["completed"], "failed": r["decision_failed"],
                         "p50_ms": round(r["median_e2e_latency_ms"], 2), "p99_ms": round(r["p99_e2e_latency_ms"], 2),
                         "questions_per_s": round(r["decision_questions_per_s"], 1)})
rows.sort(key=lambda r: (r["workload"].split("@")[0], r["clients"], ENGINES.index(r["engine"])))


def stats(path):
    lines = open(path).read().splitlines()
    return {"ready": next((line.split("] ", 1)[1] for line in lines if "Decision server ready" in line), None),
            "decision_stats": [line.split("Decision stats. ")[1] for line in lines if "Decision stats." in line]}


def rounds(path):
    # One line per workload of profile_round.py's log: "p50 of 30 (...): TOTAL ms = plan .. + forward .. (tables .., GPU ..)".
    out = []
    for line in open(path):
        m = re.search(r"\((\d+) stream tokens.*\): ([0-9.]+) ms = plan ([0-9.]+) \+ forward ([0-9.]+) "
                      r"\(tables ([0-9.]+), GPU ([0-9.]+)\) \+ finish ([0-9.]+)", line)
        if m:
            keys = ("stream_tokens", "round_ms", "plan_ms", "forward_ms", "tables_ms", "gpu_ms", "finish_ms")
            out.append(dict(zip(keys, [int(m.group(1))] + [float(g) for g in m.groups()[1:]])))
    return out


conv = json.load(open("sweepconv/sweep_conv_variants.json"))["rows"]
summary = {"gpu": open("gpu.txt").read().strip(), "commit": "7c89771 (+ the sweep's conv_variants step, uncommitted then)",
           "http": rows,
           "server_logs": {p: stats(p) for p in ("flide/server.log", "flide_p32k/server.log")},
           "abprofile": {"base_eef1662": rounds("abprofile/base_1.log"), "new_7c89771": rounds("abprofile/new_1.log")},
           "conv_variants_us": [{k: (round(v * 1e3, 1) if k == "device_ms" else v) for k, v in r.items()} for r in conv]}
with open("summary.json", "w") as out:
    json.dump(summary, out, indent=1)
for r in rows:
    print(f"{r['engine']:10s} {r['workload']:22s} {r['clients']:3d} {r['requests']:5d} {r['p50_ms']:9.2f} "
          f"{r['p99_ms']:9.2f} {r['questions_per_s']:9.1f}")
for name, rs in summary["abprofile"].items():
    print(name, rs)
