"""bench_serving's numbers: latency percentiles, throughput, token counts, the
cold-resend comparison, and the markdown table and plot of a run."""

from __future__ import annotations

from typing import Optional

import numpy as np


def latency_stats(ms: list, quantiles=(50, 90, 99)) -> dict:
    """``n``, ``mean_ms`` and ``p{q}_ms`` of a list of latencies (``None`` when empty)."""
    out: dict = {"n": len(ms)}
    for q in quantiles:
        out[f"p{q}_ms"] = float(np.percentile(ms, q)) if ms else None
    out["mean_ms"] = float(np.mean(ms)) if ms else None
    return out


def _tokens(records: list) -> dict:
    """Sums of the usage's prompt and cached tokens, and prompt minus cached (the prompt
    tokens not served from a cache); ``None`` where a server does not report them."""
    prompt = [r["prompt_tokens"] for r in records if r.get("prompt_tokens") is not None]
    cached = [r["cached_tokens"] for r in records if r.get("cached_tokens") is not None]
    reported = bool(records) and len(cached) == len(records)
    return {"prompt_tokens": sum(prompt) if len(prompt) == len(records) else None,
            "cached_tokens": sum(cached) if reported else None,
            "computed_tokens": sum(prompt) - sum(cached) if reported and len(prompt) == len(records) else None}


def after_first_steps(records: list) -> Optional[float]:
    """Criteria answered per second once every agent's first step has been
    answered, from then to the run's last answer (the state cache's regime: a
    first step computes its whole history, a later one its new tokens); None
    when nothing was answered after that. ``records``: answered requests, with
    ``start_s`` (seconds from the run's start), ``latency_ms``, ``step``, ``items``."""
    ends = [(r["start_s"] + r["latency_ms"] / 1e3, r) for r in records]
    firsts = [end for end, r in ends if r["step"] == 0]
    if not firsts:
        return None
    t0, t1 = max(firsts), max(end for end, _ in ends)
    after = sum(r["items"] for end, r in ends if end > t0)
    return after / (t1 - t0) if after and t1 > t0 else None


def summarize_agent(records: list, wall_s: float) -> dict:
    """First step vs later steps (p50/p90), per-step percentiles, decisions/s
    (criteria answered per second of the whole run, and of the part after the
    first steps: :func:`after_first_steps`) and token counts."""
    ok = [r for r in records if r["status"] == 200]
    first = [r["latency_ms"] for r in ok if r["step"] == 0]
    later = [r["latency_ms"] for r in ok if r["step"] > 0]
    steps = sorted({r["step"] for r in records})
    per_step = [{"step": s, "history_tokens": next(r["query_tokens"] for r in records if r["step"] == s),
                 **latency_stats([r["latency_ms"] for r in ok if r["step"] == s], (50, 90))} for s in steps]
    decisions = sum(r["items"] for r in ok)
    return {"requests": len(records), "failed": len(records) - len(ok), "decisions": decisions,
            "wall_s": wall_s, "decisions_per_s": decisions / wall_s if wall_s > 0 else None,
            "decisions_per_s_after_first_steps": after_first_steps(ok),
            "first_step": latency_stats(first, (50, 90)), "later_steps": latency_stats(later, (50, 90)),
            "all_steps": latency_stats([r["latency_ms"] for r in ok]), "per_step": per_step, **_tokens(ok)}


def summarize_fresh(records: list, wall_s: float, concurrency: int) -> dict:
    """Per-request p50/p90/p99 and questions/s at one concurrency."""
    ok = [r for r in records if r["status"] == 200]
    questions = sum(r["items"] for r in ok)
    return {"concurrency": concurrency, "requests": len(records), "failed": len(records) - len(ok),
            "questions": questions, "wall_s": wall_s, "questions_per_s": questions / wall_s if wall_s > 0 else None,
            "latency": latency_stats([r["latency_ms"] for r in ok]), **_tokens(ok)}


def compare_scores(warm: Optional[list], cold: Optional[list]) -> dict:
    """Bitwise equality of two score matrices, their largest difference and argmax flips."""
    if warm is None or cold is None:
        return {"equal": False, "max_abs_diff": None, "argmax_flips": None}
    if len(warm) != len(cold) or any(len(a) != len(b) for a, b in zip(warm, cold)):
        return {"equal": False, "max_abs_diff": None, "argmax_flips": None}
    diff = max((abs(x - y) for a, b in zip(warm, cold) for x, y in zip(a, b)), default=0.0)
    flips = sum(int(np.argmax(a) != np.argmax(b)) for a, b in zip(warm, cold) if a)
    return {"equal": warm == cold, "max_abs_diff": diff, "argmax_flips": flips}


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _num(x, digits=1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def stage_means(delta: Optional[dict]) -> dict:
    """Mean milliseconds per request of each server stage over the run, from the
    ``/metrics`` deltas of a ``*per_stage_req_latency_seconds`` histogram
    (Flide's ``flide_``, SGLang's ``sglang:``); empty when the server has none."""
    out = {}
    for key, total in (delta or {}).items():
        name, _, labels = key.partition("{")
        if "per_stage_req_latency_seconds_sum" not in name:
            continue
        count = delta.get(key.replace("_seconds_sum", "_seconds_count"), 0)
        stage = next((v.strip('"') for k, v in (p.split("=", 1) for p in labels.rstrip("}").split(",") if "=" in p)
                      if k == "stage"), None)
        if stage is not None and count:
            out[stage] = 1e3 * total / count
    return out


def server_latency(delta: Optional[dict]) -> Optional[float]:
    """Mean milliseconds per request the server itself measured over the run
    (Flide's ``flide_request_latency_seconds`` of ``/v1/score``, SGLang's
    ``sglang:e2e_request_latency_seconds``); None when it has neither."""
    for name in ('flide_request_latency_seconds_{}{{route="/v1/score"}}', "sglang:e2e_request_latency_seconds_{}"):
        total, count = (delta or {}).get(name.format("sum")), (delta or {}).get(name.format("count"))
        if total is not None and count:
            return 1e3 * total / count
    return None


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# bench_serving: {result['label']} {s['workload']}", "", f"Server: `{result['url']}`", "",
             "```", result["command"], "```", ""]
    if s["workload"] == "agent":
        a = result["summary"]
        lines += [f"{s['distinct_agents']} agents ({s['agents']} concurrent), {s['steps']} steps, history "
                  f"{s['start']} + {s['growth']} tokens a step, {s['criteria']} criteria x {s['criteria_tokens']} tokens, "
                  f"{s['labels']} labels", "",
                  "| first step p50 / p90 ms | later steps p50 / p90 ms | decisions/s | after first steps "
                  "| wall s | requests (failed) | prompt / cached / uncached tokens (usage) |",
                  "|---|---|---|---|---|---|---|",
                  f"| {_ms(a['first_step']['p50_ms'])} / {_ms(a['first_step']['p90_ms'])} "
                  f"| {_ms(a['later_steps']['p50_ms'])} / {_ms(a['later_steps']['p90_ms'])} "
                  f"| {_num(a['decisions_per_s'])} | {_num(a.get('decisions_per_s_after_first_steps'))} "
                  f"| {a['wall_s']:.2f} | {a['requests']} ({a['failed']}) "
                  f"| {_num(a['prompt_tokens'], 0)} / {_num(a['cached_tokens'], 0)} / {_num(a['computed_tokens'], 0)} |"]
    else:
        lines += [f"{s['requests']} fresh-state requests per concurrency (scale {s['scale']}, vary {s['vary']})", "",
                  "| clients | p50 ms | p90 ms | p99 ms | questions/s | requests (failed) |", "|---|---|---|---|---|---|"]
        for row in result["summary"]:
            lat = row["latency"]
            lines.append(f"| {row['concurrency']} | {_ms(lat['p50_ms'])} | {_ms(lat['p90_ms'])} | {_ms(lat['p99_ms'])} "
                         f"| {_num(row['questions_per_s'])} | {row['requests']} ({row['failed']}) |")
    delta = (result.get("metrics") or {}).get("delta")
    stages, served = stage_means(delta), server_latency(delta)
    if stages or served is not None:
        lines += ["", "Server side, mean ms per request (`/metrics`): "
                  + (f"end to end {served:.2f}" if served is not None else "")
                  + ("; " if stages and served is not None else "")
                  + (", ".join(f"{k} {v:.2f}" for k, v in stages.items()) + " (`per_stage_req_latency_seconds`)"
                     if stages else "") + "."]
    cold = result.get("cold_check")
    if cold:
        state = "each resent after a cache flush" if cold["flushed"] else \
            f"/flush_cache answered HTTP {cold['flush_status']}: resent alone, not flushed"
        lines += ["", f"Cold check ({state}): {cold['equal']}/{cold['total']} bitwise equal to the warm answers, "
                  f"max |diff| {cold['max_abs_diff']}, {cold['argmax_flips']} argmax flips."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path) -> bool:
    """Per-step latency vs step (agent runs) or per-request latency by concurrency;
    False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    records = [r for r in result["records"] if r["status"] == 200]
    if result["settings"]["workload"] == "agent":
        ax.scatter([r["step"] for r in records], [r["latency_ms"] for r in records], s=6, alpha=0.25, label="requests")
        rows = [r for r in result["summary"]["per_step"] if r["n"]]
        ax.plot([r["step"] for r in rows], [r["p50_ms"] for r in rows], "o-", label="p50")
        ax.plot([r["step"] for r in rows], [r["p90_ms"] for r in rows], "--", label="p90")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    else:
        levels = [row["concurrency"] for row in result["summary"]]
        data = [[r["latency_ms"] for r in records if r["concurrency"] == c] or [0.0] for c in levels]
        ax.boxplot(data)
        ax.set_xticks(range(1, len(levels) + 1), [str(c) for c in levels])
        ax.set_xlabel("concurrent clients")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{result['label']}: {result['settings']['workload']}")
    if result["settings"]["workload"] == "agent":
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
