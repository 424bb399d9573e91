"""Draw this record: python plot.py (reads summary.json, writes plot.png): overlap schedule on and off and
SGLang 0.5.17, questions/s by clients, against issue 18's bars."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = json.load(open("summary.json"))["http"]
NAMES = {"flide": "Flide, overlap schedule", "flide_seq": "Flide, --disable-overlap-schedule",
         "sglang": "SGLang 0.5.17"}
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, (dataset, title, bar) in zip(axes, [("sgl_race_single", "RACE-like, one question", 140),
                                            ("sgl_multirc", "MultiRC-like, 30 questions", 1800)]):
    for engine, label in NAMES.items():
        mine = sorted((r["clients"], r["questions_per_s"]) for r in rows
                      if r["engine"] == engine and r["workload"].split("@")[0] == dataset)
        if mine:
            ax.plot([c for c, _ in mine], [q for _, q in mine], marker="o", label=label)
    ax.axhline(bar, color="tab:red", linestyle=":", label=f"issue 18 bar at 64 clients ({bar}, H200)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("clients (1: 128 requests; 8, 64: 512)")
    ax.set_ylabel("questions/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
fig.suptitle("Over HTTP, Qwen3.5-4B shape, one H100, same client (2026-12-07, commit 9192fca)")
fig.tight_layout()
fig.savefig("plot.png", dpi=110)
