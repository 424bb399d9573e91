"""Draw this record's HTTP figures against issue 18's bars: python plot.py (reads summary.json, writes plot.png)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = json.load(open("summary.json"))["http"]


def pick(dataset, clients, keep_alive=False, file=None):
    return next(r for r in rows if r["dataset"] == dataset and r["clients"] == clients
                and r["keep_alive"] == keep_alive and (file is None or r["file"] == file))


fig, (lat, qps) = plt.subplots(1, 2, figsize=(11, 4))
single = [("RACE", pick("race_single", 1, file="sgl_race_single.jsonl"), 11),
          ("RACE kept alive", pick("race_single", 1, True), 11),
          ("MultiRC", pick("multirc", 1), 22), ("QuALITY", pick("quality", 1), 110)]
x = range(len(single))
lat.bar(x, [r["p50_ms"] for _, r, _ in single], color="tab:blue", label="Flide p50 (H100)")
lat.scatter(x, [bar for _, _, bar in single], color="tab:red", marker="_", s=900, label="issue 18 bar (H200)")
lat.set_xticks(list(x), [n for n, _, _ in single])
lat.set_ylabel("ms, one client")
lat.set_yscale("log")
lat.legend()
load = [("RACE 8", pick("race_single", 8), None), ("RACE 64", pick("race_single", 64), 140),
        ("MultiRC 8", pick("multirc", 8), None), ("MultiRC 64", pick("multirc", 64), 1800)]
x = range(len(load))
qps.bar(x, [r["questions_per_s"] for _, r, _ in load], color="tab:green", label="Flide questions/s (H100)")
qps.scatter([i for i, (_, _, b) in enumerate(load) if b], [b for _, _, b in load if b], color="tab:red",
            marker="_", s=900, label="issue 18 bar (H200)")
qps.set_xticks(list(x), [n for n, _, _ in load])
qps.set_yscale("log")
qps.set_ylabel("questions/s, 512 requests a level")
qps.legend()
fig.suptitle("Flide over HTTP, Qwen3.5-4B shape, H100, commit f5cc651 (2026-12-07)")
fig.tight_layout()
fig.savefig("plot.png", dpi=110)
