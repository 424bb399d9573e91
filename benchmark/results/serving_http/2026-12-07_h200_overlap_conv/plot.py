"""Draw this record: python plot.py (reads summary.json, writes plot.png): Flide and SGLang 0.5.17 over HTTP on
the H200, questions/s by clients against issue 18's bars, and the tree conv beside its variants."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

summary = json.load(open("summary.json"))
rows = summary["http"]
NAMES = {"flide": "Flide", "flide_p32k": "Flide, --max-prefill-tokens 32768", "sglang": "SGLang 0.5.17"}
COLORS = {"flide": "tab:blue", "flide_p32k": "tab:cyan", "sglang": "tab:green"}
fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
for ax, (dataset, title, bar) in zip(axes, [("sgl_race_single", "RACE-like, one question", 140),
                                            ("sgl_multirc", "MultiRC-like, 30 questions", 1800)]):
    for engine, label in NAMES.items():
        mine = sorted((r["clients"], r["questions_per_s"]) for r in rows
                      if r["engine"] == engine and r["workload"].split("@")[0] == dataset)
        if mine:
            ax.plot([c for c, _ in mine], [q for _, q in mine], marker="o", label=label, color=COLORS[engine])
    ax.axhline(bar, color="tab:red", linestyle=":", label=f"issue 18 bar at 64 clients ({bar})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("clients (1: 128 requests; 8, 64: 512)")
    ax.set_ylabel("questions/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
ax = axes[2]
conv = [r for r in summary["conv_variants_us"] if r["config"] in ([32, 128, 4], None)]
labels = [f"{r['workload']} x{r['requests']}" for r in conv if r["kernel"] == "conv_tree"]
for i, kind in enumerate(("conv_tree", "conv_sources", "conv_sources_nowin", "copy_tiles")):
    ys = [r["device_ms"] for r in conv if r["kernel"] == kind]
    ax.bar([j + 0.2 * i for j in range(len(ys))], ys, width=0.2, label=kind)
ax.set_xticks([j + 0.3 for j in range(len(labels))], labels, rotation=20, fontsize=7)
ax.set_yscale("log")
ax.set_ylabel("us per layer (GPU kernel time)")
ax.set_title("tree conv (eef1662) and variants, tile 32x128, 4 warps")
ax.legend(fontsize=7)
fig.suptitle("Over HTTP, Qwen3.5-4B shape, one H200, same client (2026-12-07, commit 7c89771)")
fig.tight_layout()
fig.savefig("plot.png", dpi=110)
