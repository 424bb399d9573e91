"""Where one request's time goes: the kernels of a round, by total device time.

Runs one request of a workload through the engine (flat CUDA graphs, or eager
with ``--graphs off``), its prompts int64 arrays with its state beside them, as the
server's scheduler passes them, under ``torch.profiler`` and prints, per kernel name, the
calls and total time, largest first; with ``--out`` also writes them as JSON.
On CUDA the times are the GPU's (kernels inside a replayed graph included); on
the CPU they are the operators' own CPU times (a smoke run).

Usage::

    python benchmark/profile_round.py --model qwen3.5-4b --workload race --out profile_race.json
    python benchmark/profile_round.py --model tiny-qwen3.5 --device cpu --dtype float32 --scale 0.1  # smoke
    python benchmark/profile_round.py --model qwen3.5-4b --agent 8000:400   # a step resumed from the state cache
    python benchmark/profile_round.py --workload race_single multirc quality --load-rounds 20 --out p.json
    python benchmark/profile_round.py --workload race_single multirc --requests 16   # a loaded round

Several ``--workload`` names are profiled one after the other on one engine (one
start, one capture). ``--load-rounds N`` then runs N rounds of 64 requests of the
last workload and times each workload's request again: a request's time before
and after load, in process (no server, no HTTP).

``--requests N`` profiles a round of N requests of each workload instead of one
(fresh states, one flat stream, as a served round under load is): its kernels and
questions/s show where a loaded server's time goes.

``--agent START:GROWTH`` profiles an agent's third step instead (10 criteria of 30
tokens): its first two steps leave the history in the state cache, so the
profiled round resumes from it and computes only the new tokens and criteria.

Exit status 2 with one line on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decision import WORKLOADS, model_config, requests_for  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model  # noqa: E402
from flide_ext.protocol.errors import FlideError  # noqa: E402
from flide_ext.runtime.graph_capacities import parse_capacities  # noqa: E402
from flide_ext.server.cache_args import cache_settings  # noqa: E402


def kernel_table(prof, cuda: bool) -> list[dict]:
    """Per event name: calls and total microseconds (device time on CUDA,
    self CPU time otherwise), largest first."""
    totals: dict = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        else:
            us = event.self_cpu_time_total
        totals[event.name][0] += 1
        totals[event.name][1] += us
    rows = [{"kernel": name, "calls": calls, "total_us": us} for name, (calls, us) in totals.items()]
    return sorted(rows, key=lambda r: -r["total_us"])


def wall_breakdown(engine, group, runs: int = 30, setup=None) -> dict:
    """p50 of one round of ``group``'s requests through the engine (ms), with its
    requests, questions and questions/s at that p50: the whole
    ``run_round`` and its stages from the round's own
    :class:`~flide_ext.runtime.round_result.RoundStats`: plan (cache match,
    plan, pool rows), tables (padding, kernel tables and their copy), gpu (the
    replay's span on the GPU, CUDA events), forward (tables, gpu and the
    readout's gather and copy back), finish (checkpoints kept, which overlaps
    the GPU, and eviction). ``setup()`` runs before each timed round, untimed
    (an agent step's previous step, so that the round resumes from what a real
    step does, not from its own state cached by the run before)."""
    import statistics

    rows = []
    for _ in range(runs):
        if setup is not None:
            setup()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = engine.run_round(group)
        wall = time.perf_counter() - t0
        st = result.stats
        rows.append((wall, st.plan_seconds, st.tables_seconds, st.gpu_seconds, st.forward_seconds,
                     st.finish_seconds))
    keys = ("request_ms", "plan_ms", "tables_ms", "gpu_ms", "forward_ms", "finish_ms")
    out = {"runs": runs, "stream_tokens": result.stats.stream_tokens, "graph": str(result.graph),
           **{k: 1e3 * statistics.median(r[i] for r in rows) for i, k in enumerate(keys)}}
    questions = sum(len(prompts) for prompts, *_ in group)
    return {**out, "requests": len(group), "questions": questions,
            "questions_per_s": questions / out["request_ms"] * 1e3}


def op_table(prof) -> list[dict]:
    """Per PyTorch operator (eager runs on CUDA): calls and the device time of the
    kernels it launched itself, largest first."""
    rows = [{"op": e.key, "calls": e.count, "device_us": e.self_device_time_total}
            for e in prof.key_averages() if e.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r["device_us"])


BREAKDOWN = ("p50 of {runs} ({stream_tokens} stream tokens, graph {graph}): {request_ms:.2f} ms = plan {plan_ms:.2f}"
             " + forward {forward_ms:.2f} (tables {tables_ms:.2f}, GPU {gpu_ms:.2f}) + finish {finish_ms:.2f}")


def as_served(groups: list) -> list:
    """Requests as the server's scheduler hands them to ``Engine.run_round``: each
    prompt an ``[n]`` int64 array, the request's state beside them (its
    ``ScoreWork``), so an in-process round plans what a served one does (Python
    lists would add their conversion to the plan)."""
    from flide_ext.runtime.checkpoints import state_of

    out = []
    for prompts, labels, *_ in groups:
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        out.append((arrays, labels, state_of(arrays)))
    return out


def round_unfit(capacity, groups: list) -> str:
    """Why ``groups`` cannot be one round of an engine of this
    :class:`~flide_ext.runtime.capacity.RoundCapacity` (as a server would never run
    it), or '' when they can."""
    from flide_ext.runtime.rounds import request_size

    sizes = [request_size(prompts) for prompts, *_ in groups]
    tokens, segments = sum(s.tokens for s in sizes), sum(s.segments for s in sizes)
    if len(groups) > capacity.requests or tokens > capacity.tokens or segments > capacity.segments:
        return (f"of {len(groups)} requests, {tokens} tokens and {segments} segments does not fit one round "
                f"({capacity.requests} requests, {capacity.tokens} tokens, {capacity.segments} segments)")
    return ""


def profile_case(engine, name: str, groups: list, setup, cuda: bool, model: str, top: int, fresh: bool,
                 size: int = 1) -> dict:
    """One round of ``size`` requests of a workload (``groups`` holds at least
    ``2 * size``): a warm-up round, one profiled round (kernels by device time),
    then :func:`wall_breakdown` with ``setup`` (CUDA only); printed and returned.
    ``fresh``: the cache is flushed before the warm-up and the profiled round (each
    computes its whole state)."""
    if fresh:
        engine.flush_cache()
    engine.run_round(groups[:size])  # warm-up: kernels compiled, the graph's first replay done
    if fresh:
        engine.flush_cache()
    profiled_groups = groups[size:2 * size]
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        profiled = engine.run_round(profiled_groups)
        if cuda:
            torch.cuda.synchronize()
    rows = kernel_table(prof, cuda)
    total = sum(r["total_us"] for r in rows)
    graph = profiled.graph
    print(f"{model} {name} x {size}: {profiled.stats.stream_tokens} stream tokens "
          f"({profiled.stats.resumed_tokens} resumed from the state cache), "
          f"graph {[graph.tokens, graph.segments] if graph else None}, {len(rows)} kernel names, "
          f"{sum(r['calls'] for r in rows)} calls, {total / 1e3:.2f} ms in all")
    for r in rows[:top]:
        print(f"{r['total_us'] / 1e3:9.3f} ms {r['calls']:6d}x  {r['kernel'][:100]}")
    breakdown = wall_breakdown(engine, profiled_groups, setup=setup) if cuda else None
    if breakdown:
        print("{questions} question(s) of {requests} request(s) ({questions_per_s:.1f}/s) in one round, ".format(
            **breakdown) + BREAKDOWN.format(**breakdown))
    ops = op_table(prof) if cuda and graph is None else []
    if ops:
        print("by operator (eager):")
        for r in ops[:top]:
            print(f"{r['device_us'] / 1e3:9.3f} ms {r['calls']:6d}x  {r['op'][:100]}")
    return {"model": model, "workload": name, "requests": size, "stream_tokens": profiled.stats.stream_tokens, "kernels": rows,
            "operators": ops, "wall_breakdown": breakdown}


def host_profile(engine, groups: list, setup, rounds: int, top: int) -> list[dict]:
    """Python's cProfile over ``rounds`` rounds of ``groups`` (``setup()`` before
    each, outside the profile): the ``top`` functions by their own time, in ms
    and calls per round, with their cumulative time. On CUDA a round's wait for
    the GPU shows as the own time of the call that waits."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for _ in range(rounds):
        if setup is not None:
            setup()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof.enable()
        engine.run_round(groups)
        prof.disable()
    rows = [{"function": f"{Path(file).name}:{line}({name})", "calls": calls / rounds, "own_ms": 1e3 * own / rounds,
             "cumulative_ms": 1e3 * cumulative / rounds}
            for (file, line, name), (_, calls, own, cumulative, _) in pstats.Stats(prof).stats.items()]
    return sorted(rows, key=lambda r: -r["own_ms"])[:top]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--workload", nargs="+", default=["race"], choices=list(WORKLOADS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--graphs", default="flat", choices=["flat", "off"])
    parser.add_argument("--graph-capacities", default=None,
                        help="flat graphs to capture, tokens:segments[:levels],... (default: the engine's set)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--agent", default=None, metavar="START:GROWTH",
                        help="profile an agent step resumed from the state cache (history START + GROWTH a step)")
    parser.add_argument("--requests", type=int, default=1,
                        help="requests in the profiled round (fresh states, one flat stream)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--load-rounds", type=int, default=0,
                        help="after the profiles, run this many rounds of 64 requests, then time each workload again")
    parser.add_argument("--readout", default="labels", choices=["labels", "vocabulary"],
                        help="answers normalised over each question's labels (the served /v1/score with "
                             "apply_softmax, as the HTTP benchmarks send) or over the vocabulary")
    parser.add_argument("--host-profile", type=int, default=0, metavar="ROUNDS",
                        help="after the profiles, cProfile this many rounds of each workload: the host's functions "
                             "by their own time per round")
    parser.add_argument("--state-cache-gb", default=None,
                        help="the state cache's budget in GiB, as the server's flag (default: the engine's own)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--dump-fla-configs", default=None, metavar="DIR",
                        help="after the run, write the configurations fla-core's autotuners chose (GPU only)")
    args = parser.parse_args(argv)
    try:
        config = model_config(args.model)
    except KeyError:
        print(f"profile_round.py: unknown model {args.model!r}", file=sys.stderr)
        return 2
    if args.requests < 1 or (args.agent and args.requests != 1):
        print("profile_round.py: --requests must be >= 1 (and 1 with --agent)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("profile_round.py: no CUDA device here", file=sys.stderr)
        return 2
    if device.type != "cuda" and args.graphs != "off":
        args.graphs = "off"  # CUDA graphs need a CUDA device; the CPU run profiles the eager forward
    capacities = None
    if args.graph_capacities and args.graphs == "flat":
        try:
            capacities = parse_capacities(args.graph_capacities)
        except ValueError as err:
            print(f"profile_round.py: --graph-capacities: {err}", file=sys.stderr)
            return 2
    try:
        cache, _ = cache_settings(False, args.state_cache_gb, None, args.device)
    except FlideError as err:
        print(f"profile_round.py: {err}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    model = random_model(config, dtype, device, seed=0)
    engine = Engine(args.model, dtype=dtype, device=device, model=model, cuda_graphs=args.graphs,
                    graph_capacities=capacities, **cache)
    if args.readout == "labels":
        # Every round's requests normalised over their labels, as the server runs them.
        run_round, run_rounds = engine.run_round, engine.run_rounds
        # A caller's own flags stand (run_rounds passes each round's to run_round).
        engine.run_round = lambda groups, **kw: run_round(groups, **{"over_labels": [True] * len(groups), **kw})
        engine.run_rounds = lambda groups: run_rounds(groups, over_labels=[True] * len(groups))
    if engine.graphs is not None:
        print(f"{len(engine.graphs.capacities)} CUDA graphs captured in {engine.graphs.capture_seconds:.1f} s")
    cuda = device.type == "cuda"
    if args.agent:
        from agent_trajectories import AgentShape, agent_steps, label_ids, step_groups

        try:
            start, growth = (int(x) for x in args.agent.split(":"))
            shape = AgentShape(start=start, growth=growth, steps=3)
            trajectory = [agent_steps(shape, config.vocab_size)]
        except ValueError as err:
            print(f"profile_round.py: --agent {args.agent!r}: {err} (want START:GROWTH)", file=sys.stderr)
            return 2
        groups = [step_groups(trajectory, step, label_ids(shape))[0] for step in range(3)]
        engine.run_round(groups[:1])  # the first step: the history's checkpoint is left in the cache

        def setup():  # the step before, cold: it leaves the checkpoint the profiled step resumes from
            engine.flush_cache()
            engine.run_round(groups[:1])

        cases = [(f"agent {start}+{growth}", groups[1:], setup)]
    else:
        # Each timed request's state is fresh, as a server's new requests are: the
        # cache is flushed first (else a repeat resumes from the run before).
        cases = [(name, as_served(requests_for(name, 2 * args.requests + 1, config.vocab_size, args.scale)),
                  engine.flush_cache) for name in args.workload]
        for name, groups, _ in cases:
            unfit = round_unfit(engine.round_capacity, groups[args.requests:2 * args.requests])
            if unfit:
                print(f"profile_round.py: --requests {args.requests}: {name}'s round {unfit}", file=sys.stderr)
                return 2
    results = [profile_case(engine, name, groups, setup, cuda, args.model, args.top, not args.agent,
                            1 if args.agent else args.requests) for name, groups, setup in cases]
    if args.load_rounds and not args.agent:
        name = args.workload[-1]
        load = requests_for(name, 64, config.vocab_size, args.scale, seed=1)
        t0 = time.perf_counter()
        for _ in tqdm(range(args.load_rounds), desc=f"load: rounds of 64 {name} requests"):
            engine.flush_cache()
            engine.run_rounds(load)
        print(f"load: {args.load_rounds} x 64 {name} requests in {time.perf_counter() - t0:.1f} s")
        for entry, (case, groups, setup) in zip(results, cases):
            size = entry["requests"]
            entry["after_load"] = wall_breakdown(engine, groups[size:2 * size], setup=setup) if cuda else None
            if entry["after_load"]:
                print(f"{case} after load: " + BREAKDOWN.format(**entry["after_load"]))
    for entry, (case, groups, setup) in zip(results, cases) if args.host_profile > 0 else ():
        size = entry["requests"]
        entry["host_profile"] = host_profile(engine, groups[size:2 * size], setup, args.host_profile, args.top)
        print(f"{case}: host functions by own time per round ({args.host_profile} rounds, cProfile)")
        for r in entry["host_profile"]:
            print(f"{r['own_ms']:8.3f} ms own {r['cumulative_ms']:8.3f} ms cumulative {r['calls']:7.1f}x  {r['function']}")
    if args.dump_fla_configs and cuda:
        from flide_ext.kernels.fla_configs import dump

        print(f"fla configurations of {dump(args.dump_fla_configs)} kernels written to {args.dump_fla_configs}")
    if args.out:
        out = results[0] if len(results) == 1 else {"model": args.model, "graphs": args.graphs, "workloads": results}
        out = {**out, "state_cache_bytes": engine.state_cache_bytes}
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
