"""The fidelity benchmark's table (markdown, with the command that produced it)
and plot (mean TV to float32 and argmax agreement per engine and set)."""

from __future__ import annotations

from pathlib import Path


def markdown(results: dict) -> str:
    """One row per (set, engine): questions, mean / p99 / max TV to float32,
    argmax agreement; then, per set, how often Flide is at least as close to
    float32 as the plain transformers forward, question by question."""
    s = results["settings"]
    lines = [f"# Fidelity to float32: {s['model']} ({s['dtype']} on {s['gpu'] or s['device']})", "",
             "| set | engine | questions | mean TV | p99 TV | max TV | argmax agree |",
             "|---|---|---|---|---|---|---|"]
    for name, block in results["sets"].items():
        for engine, data in block["engines"].items():
            m = data["summary"]
            lines.append(f"| {name} | {engine} | {m['questions']} | {m['mean_tv']:.5f} | {m['p99_tv']:.5f} | "
                         f"{m['max_tv']:.5f} | {m['argmax_agree']}/{m['questions']} |")
    lines += ["", "| set | Flide at least as close as transformers, per question | strictly closer |", "|---|---|---|"]
    for name, block in results["sets"].items():
        key = next(k for k in block if k.startswith("flide_vs_"))
        h = block[key]
        lines.append(f"| {name} | {h['a_closer_or_equal']:.1%} | {h['a_closer']:.1%} |")
    if s.get("flide_seconds"):
        lines += ["", "Flide's wall time per set (seconds, the rounds run a second time; a diagnostic in process):", "",
                  "| engine | " + " | ".join(results["sets"]) + " |", "|---|" + "---|" * len(results["sets"])]
        for engine, per_set in s["flide_seconds"].items():
            lines.append(f"| {engine} | " + " | ".join(f"{per_set[n]:.3f}" for n in results["sets"]) + " |")
    if s.get("transformers_gdn"):
        lines += ["", f"transformers' GDN layers ran `{s['transformers_gdn']}` kernels (the float32 reference: its own "
                  "PyTorch recurrence)."]
    if s.get("fla_configs"):
        lines += ["", f"fla-core kernel configurations: {s['fla_configs']}."]
    for engine, error in (s.get("errors") or {}).items():
        lines += ["", f"{engine} failed, left out of the table: `{error}`"]
    lines += ["", "Command:", "", f"    {results.get('command', '')}", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> bool:
    """Bars of mean TV (left) and argmax agreement (right); False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets, engines = list(results["sets"]), results["engines"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        xs = [j + i * width for j in range(len(sets))]
        summaries = [results["sets"][s]["engines"][engine]["summary"] for s in sets]
        axes[0].bar(xs, [m["mean_tv"] for m in summaries], width, label=engine)
        axes[1].bar(xs, [m["argmax_agree_frac"] for m in summaries], width, label=engine)
    for ax, title in zip(axes, ("mean TV to float32 (lower is closer)", "argmax agreement with float32")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
        ax.set_title(title)
    axes[1].set_ylim(min(0.9, min(results["sets"][s]["engines"][e]["summary"]["argmax_agree_frac"]
                                  for s in sets for e in engines) - 0.02), 1.0)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{results['settings']['model']}, {results['settings']['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
