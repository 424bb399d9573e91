"""Decision serving over HTTP in the manner of SGLang's bench_serving: one client for
any server of SGLang's ``/v1/score`` API (token-id query + items + label_token_ids,
``apply_softmax``), so Flide and SGLang are measured the same way.

Workloads:

* ``agent``: agent trajectories. Each agent's history starts at ``--start`` tokens and
  grows by ``--growth`` a step for ``--steps`` steps; each step is ONE request: query =
  the whole history so far, items = ``--criteria`` fresh criteria of
  ``--criteria-tokens`` tokens, scored over ``--labels`` label ids. ``--agents N``
  agents step concurrently, each waiting for its answer before its next step;
  ``--distinct-agents M`` (M > N) cycles M agents round-robin over the N clients
  (cache eviction). Reports per-step latency p50/p90 of the first step and of the
  later ones, decisions/s (criteria answered per second), wall time, and cached vs
  computed prompt tokens when the server's usage reports them.
* ``race``, ``race_single``, ``multirc``, ``quality``: every request a fresh state
  (bench_decision's generators, same shapes), ``--concurrency`` closed-loop clients
  (one level after the other, each with requests of its own); per-request latency
  p50/p90/p99 and questions/s.

``--check-cold`` then ``POST /flush_cache``s (SGLang's route; a 404 is reported) and
resends every recorded request alone, flushing before each, and compares the scores
with the warm answers bitwise. ``/metrics`` is scraped before and after (cache and
token counters; absence tolerated); ``--gpu-memory`` records ``nvidia-smi``'s memory.

Usage::

    python benchmark/bench_serving.py --url http://127.0.0.1:30000 --label flide --workload agent \\
        --agents 8 --start 1500 --growth 200 --steps 12 --criteria 10 --criteria-tokens 30 --out results/flide
    python benchmark/bench_serving.py --label sglang --workload multirc --concurrency 8 64 --requests 128 --out results/sglang
    python benchmark/serving/compare.py results/flide/multirc.json results/sglang/multirc.json --out results/compare

``--out DIR`` writes ``NAME.json`` (settings, every request's latency and scores, the
summary), ``NAME.md`` (a table and the exact command line) and ``NAME.png``. Exit
status 0; 1 when some requests failed (the files are still written); 2 with one line
when the arguments are bad or no server answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import report  # noqa: E402
from serving.client import (ScoreClient, ServerUnreachable, cached_tokens, check_against_sglang,  # noqa: E402
                            check_health, flush_cache, gpu_memory_mib, metric_deltas, scrape_metrics)
from serving.traffic import WARMUP_AGENT, AgentPlan, default_vocab, fresh_requests, schedule, workload_names  # noqa: E402

PROG = "bench_serving.py"


def record(answer, t0: float, body: dict, **identity) -> dict:
    usage = answer.usage or {}
    return {**identity, "query_tokens": len(body["query"]), "items": len(body["items"]),
            "item_tokens": sum(len(i) for i in body["items"]), "start_s": answer.start_s - t0,
            "latency_ms": 1e3 * answer.latency_s, "status": answer.status, "error": answer.error,
            "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached_tokens(usage),
            "scores": answer.scores}


async def run_agents(args, headers, plan: AgentPlan):
    agents = args.distinct_agents or args.agents
    plans = schedule(args.agents, agents, plan.steps)
    records: list = []
    async with ScoreClient(args.url, headers, args.timeout) as client:
        warm = [plan.body(WARMUP_AGENT + i, 0) for i in range(args.warmup * args.agents)]
        check = await warm_up(client, warm, args.agents)
        before = snapshot(args, headers)
        bar = tqdm(total=sum(map(len, plans)), desc=f"{args.label} agent", unit="step", file=sys.stderr)

        async def worker(sequence):
            for agent, step in sequence:
                body = plan.body(agent, step)
                answer = await client.score(body)
                records.append(record(answer, t0, body, agent=agent, step=step))
                bar.update()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(seq) for seq in plans))
        wall = time.perf_counter() - t0
        bar.close()
    records.sort(key=lambda r: (r["step"], r["agent"]))
    return records, report.summarize_agent(records, wall), check, before


async def run_fresh(args, headers, bodies: list, warmup: list):
    records: list = []
    summary = []
    async with ScoreClient(args.url, headers, args.timeout) as client:
        check = await warm_up(client, warmup, max(args.concurrency))
        before = snapshot(args, headers)
        for level, concurrency in enumerate(args.concurrency):
            first = level * args.requests
            todo = iter(range(first, first + args.requests))
            mine: list = []
            bar = tqdm(total=args.requests, desc=f"{args.label} {args.workload} c{concurrency}", unit="req",
                       file=sys.stderr)

            async def worker():
                for i in todo:  # a shared iterator: each client takes the next request
                    answer = await client.score(bodies[i])
                    mine.append(record(answer, t0, bodies[i], request=i, concurrency=concurrency))
                    bar.update()

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall = time.perf_counter() - t0
            bar.close()
            mine.sort(key=lambda r: r["request"])
            records += mine
            summary.append(report.summarize_fresh(mine, wall, concurrency))
    return records, summary, check, before


def snapshot(args, headers) -> dict:
    """/metrics (and nvidia-smi's memory with --gpu-memory), taken after the warm-up
    and again after the run."""
    return {"metrics": scrape_metrics(args.url, headers), "gpu": gpu_memory_mib() if args.gpu_memory else None}


async def warm_up(client, bodies: list, clients: int) -> dict:
    """Send the warm-up bodies (untimed) in waves of ``clients`` at once, so the
    server has also seen batches as large as the run's before the clock starts;
    the first exchange is kept to be checked against SGLang's ScoringRequest /
    ScoringResponse models (--check-protocol)."""
    answers = []
    for i in range(0, len(bodies), clients):
        answers += await asyncio.gather(*(client.score(b) for b in bodies[i:i + clients]))
    if not answers:
        return {"checked": False}
    bad = [a for a in answers if not a.ok]
    if bad:
        raise ServerUnreachable(f"warm-up request failed: HTTP {bad[0].status}: {(bad[0].error or '')[:300]}")
    return {"checked": True, "body": bodies[0], "answer": answers[0].raw}  # checked after the run


async def cold_check(args, headers, records: list, rebuild) -> dict:
    """Flush, then resend each answered request alone (flushing before each when the
    server has the route) and compare its scores with the warm ones bitwise."""
    status = flush_cache(args.url, headers)
    flushed = status == 200
    answered = [r for r in records if r["status"] == 200]
    if args.cold_limit and len(answered) > args.cold_limit:  # evenly spread over the run
        step = len(answered) / args.cold_limit
        answered = [answered[int(k * step)] for k in range(args.cold_limit)]
    equal = failed = flips = 0
    worst = 0.0
    async with ScoreClient(args.url, headers, args.timeout) as client:
        for r in tqdm(answered, desc=f"{args.label} cold", unit="req", file=sys.stderr):
            if flushed:
                flush_cache(args.url, headers)
            answer = await client.score(rebuild(r))
            if not answer.ok:
                failed += 1
                r["cold_equal"] = None
                continue
            same = report.compare_scores(r["scores"], answer.scores)
            r["cold_equal"] = same["equal"]
            equal += same["equal"]
            if same["max_abs_diff"] is not None:
                worst = max(worst, same["max_abs_diff"])
                flips += same["argmax_flips"]
    return {"flush_status": status, "flushed": flushed, "total": len(answered), "equal": equal, "failed": failed,
            "max_abs_diff": worst, "argmax_flips": flips}


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--label", default="server", help="the engine's name in the outputs (flide, sglang)")
    p.add_argument("--workload", required=True, choices=["agent", *workload_names()])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=None, help="token ids drawn from [0, VOCAB) (default: Qwen3.5-4B's)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per client first, "
                   "sent as many at once as the run's clients (default 2)")
    p.add_argument("--out", default=None, help="directory for NAME.json, NAME.md and NAME.png")
    p.add_argument("--name", default=None, help="file stem in --out (default: from the workload)")
    p.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    p.add_argument("--header", nargs="*", default=[], help="extra request headers KEY=VALUE")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--wait-health", type=float, default=0.0, help="seconds to wait for /health first")
    p.add_argument("--check-cold", action="store_true", help="resend every request alone after a cache flush")
    p.add_argument("--cold-limit", type=int, default=0, help="resend at most this many (evenly spread; 0: all)")
    p.add_argument("--gpu-memory", action="store_true", help="record nvidia-smi memory.used before and after")
    p.add_argument("--check-protocol", action="store_true",
                   help="validate the first exchange with SGLang's ScoringRequest/ScoringResponse models")
    a = p.add_argument_group("agent workload")
    a.add_argument("--agents", type=int, default=1, help="concurrent agents (clients)")
    a.add_argument("--distinct-agents", type=int, default=None, help="agents cycled round-robin (default: --agents)")
    a.add_argument("--start", type=int, default=1500, help="history tokens at the first step")
    a.add_argument("--growth", type=int, default=200, help="history tokens added per step")
    a.add_argument("--steps", type=int, default=12)
    a.add_argument("--criteria", type=int, default=10, help="criteria (items) per step")
    a.add_argument("--criteria-tokens", type=int, default=30)
    a.add_argument("--labels", type=int, default=2, help="label ids 0..N-1 per criterion")
    f = p.add_argument_group("fresh-state workloads")
    f.add_argument("--concurrency", type=int, nargs="+", default=[8], help="client counts, one level after another")
    f.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    f.add_argument("--scale", type=float, default=1.0, help="shrink state and question lengths (smoke runs)")
    f.add_argument("--vary", action="store_true", help="vary state, question count and length per request")
    args = p.parse_args(argv)
    positive = {"--agents": args.agents, "--steps": args.steps, "--criteria": args.criteria,
                "--criteria-tokens": args.criteria_tokens, "--labels": args.labels, "--start": args.start,
                "--requests": args.requests, "--concurrency": min(args.concurrency), "--timeout": args.timeout}
    bad = [k for k, v in positive.items() if v < 1]
    if bad:
        p.exit(2, f"{PROG}: {', '.join(bad)} must be at least 1\n")
    if args.growth < 0 or args.warmup < 0 or args.cold_limit < 0 or not 0 < args.scale <= 1:
        p.exit(2, f"{PROG}: --growth, --warmup and --cold-limit must be >= 0, --scale in (0, 1]\n")
    if args.distinct_agents is not None and args.distinct_agents < args.agents:
        p.exit(2, f"{PROG}: --distinct-agents must be at least --agents\n")
    if args.vocab is not None and args.vocab <= args.labels:
        p.exit(2, f"{PROG}: --vocab must exceed --labels\n")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        p.exit(2, f"{PROG}: --out {args.out!r} is not a directory\n")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.header or max(args.agents, *args.concurrency) > 256:
        from sglang.benchmark.utils import parse_custom_headers, set_ulimit  # bench_serving's own helpers

        headers.update(parse_custom_headers(args.header))
        set_ulimit()
    try:
        check_health(args.url, headers, args.wait_health)
    except ServerUnreachable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    vocab = args.vocab or default_vocab()
    agent = args.workload == "agent"
    settings = {k: getattr(args, k) for k in ("workload", "seed", "warmup", "check_cold", "cold_limit")}
    settings["vocab"] = vocab
    if agent:
        plan = AgentPlan(args.start, args.growth, args.steps, args.criteria, args.criteria_tokens, args.labels, vocab,
                         args.seed)
        settings.update(agents=args.agents, distinct_agents=args.distinct_agents or args.agents, start=args.start,
                        growth=args.growth, steps=args.steps, criteria=args.criteria,
                        criteria_tokens=args.criteria_tokens, labels=args.labels)

        def rebuild(r):
            return plan.body(r["agent"], r["step"])
    else:
        bodies = fresh_requests(args.workload, args.requests * len(args.concurrency), vocab, args.scale, args.seed,
                                args.vary)
        warm = fresh_requests(args.workload, args.warmup * max(args.concurrency), vocab, args.scale,
                              args.seed + 10**4, args.vary) if args.warmup else []
        settings.update(concurrency=args.concurrency, requests=args.requests, scale=args.scale, vary=args.vary,
                        labels=len(bodies[0]["label_token_ids"]))

        def rebuild(r):
            return bodies[r["request"]]
    try:
        if agent:
            records, summary, protocol, before = asyncio.run(run_agents(args, headers, plan))
        else:
            records, summary, protocol, before = asyncio.run(run_fresh(args, headers, bodies, warm))
    except ServerUnreachable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    after = snapshot(args, headers)
    if args.check_protocol and protocol["checked"]:  # SGLang's own models accept the wire format
        protocol = {"checked": True, "problems": check_against_sglang(protocol["body"], protocol["answer"])}
    else:
        protocol = {"checked": False}
    result = {"label": args.label, "url": args.url, "command": shlex.join(["python", sys.argv[0], *argv]),
              "settings": settings, "protocol_check": protocol, "summary": summary,
              "metrics": {"before": before["metrics"], "after": after["metrics"],
                          "delta": metric_deltas(before["metrics"], after["metrics"])},
              "gpu_memory_mib": {"before": before["gpu"], "after": after["gpu"]} if args.gpu_memory else None,
              "cold_check": None, "records": records}
    if args.check_cold:
        result["cold_check"] = asyncio.run(cold_check(args, headers, records, rebuild))
    text = report.markdown(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = args.name or (f"agent_a{args.agents}" + (f"_m{args.distinct_agents}" if args.distinct_agents else "")
                             if agent else args.workload)
        (out / f"{name}.json").write_text(json.dumps(result))
        (out / f"{name}.md").write_text(text)
        drawn = report.plot(result, out / f"{name}.png")
        print(f"wrote {out / name}.json, .md" + (", .png" if drawn else " (no matplotlib: no plot)"), file=sys.stderr)
    failed = [r for r in records if r["status"] != 200]
    if failed:
        print(f"{PROG}: {len(failed)} of {len(records)} requests failed (first: HTTP {failed[0]['status']}: "
              f"{(failed[0]['error'] or '').splitlines()[0][:200] if failed[0]['error'] else ''})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
