"""The state cache in process (a diagnostic; results are measured over HTTP by
``benchmark/bench_serving.py``): agent trajectories stepped alone and
concurrently, per-step latency, graph replays of resumed rounds, every step's
answers against the same request sent cold after a flush, and fresh-state
workloads with the cache on and off.

Usage::

    python benchmark/check_state_cache.py --model qwen3.5-4b --out state_cache.json
    python benchmark/check_state_cache.py --model tiny-qwen3.5 --device cpu --dtype float32 --small  # smoke

Exit status 1 when a warm answer differs from its cold one, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_trajectories import AgentShape, run_agents  # noqa: E402
from bench_decision import model_config, requests_for, sync  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model  # noqa: E402


def run_fresh(engine, workload: str, count: int, vocab: int, device) -> dict:
    groups = requests_for(workload, count + 1, vocab, 1.0, seed=7)
    engine.run_round(groups[:1])
    times = []
    for g in groups[1:]:
        sync(device)
        t0 = time.perf_counter()
        engine.run_round([g])
        sync(device)
        times.append(time.perf_counter() - t0)
    batch = groups[1:9]
    sync(device)
    t0 = time.perf_counter()
    engine.run_round(batch)
    sync(device)
    c8 = sum(len(p) for p, _ in batch) / (time.perf_counter() - t0)
    return {"workload": workload, "p50_ms": 1e3 * statistics.median(times), "qps_c8": c8}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--small", action="store_true", help="short histories (CPU smoke)")
    parser.add_argument("--fresh", nargs="*", default=["race", "multirc", "quality"])
    parser.add_argument("--fresh-count", type=int, default=12)
    parser.add_argument("--no-off", action="store_true", help="skip the cache-off engine")
    parser.add_argument("--out", default="state_cache.json")
    args = parser.parse_args(argv)
    try:
        config = model_config(args.model)
    except KeyError:
        print(f"check_state_cache.py: unknown model {args.model!r}", file=sys.stderr)
        return 2
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.small:
        shapes = [("long", AgentShape(150, 40, 4, 3, 6), [1, 2]), ("short", AgentShape(70, 20, 4, 3, 6), [1])]
    else:
        shapes = [("long", AgentShape(8000, 400, 8, 10, 30), [1, 8]), ("short", AgentShape(1500, 200, 12, 10, 30), [1, 8])]
    report = {"model": args.model, "device": str(device), "dtype": args.dtype, "agents": [], "fresh": {}}
    model = random_model(config, dtype, device, seed=0)
    engine = Engine(args.model, dtype=dtype, device=device, model=model)
    for name, shape, counts in shapes:
        for agents in counts:
            row = run_agents(engine, shape, agents, config.vocab_size, device, seed=len(report["agents"]), cold=True)
            row["name"] = name
            report["agents"].append(row)
            tqdm.write(f"{name} x{agents}: first {row['first_step_ms']:.1f} ms, later p50 {row['later_p50_ms']:.1f} ms, "
                       f"{row['decisions_per_s']:.0f} decisions/s, cold equal {row['cold_equal']}/{row['cold_total']}, "
                       f"graphs {[s['graph'] for s in row['steps']]}")
    report["fresh"]["cache_on"] = [run_fresh(engine, w, args.fresh_count, config.vocab_size, device) for w in args.fresh]
    if engine.graphs is not None:
        report["graph_replays"], report["eager_rounds"] = engine.graphs.replays, engine.graphs.eager_rounds
    del engine
    if not args.no_off:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        engine = Engine(args.model, dtype=dtype, device=device, model=model, radix_cache=False)
        report["fresh"]["cache_off"] = [run_fresh(engine, w, args.fresh_count, config.vocab_size, device)
                                        for w in args.fresh]
    for on, off in zip(report["fresh"]["cache_on"], report["fresh"].get("cache_off", [])):
        tqdm.write(f"{on['workload']}: p50 on {on['p50_ms']:.2f} ms, off {off['p50_ms']:.2f} ms; "
                   f"c8 on {on['qps_c8']:.0f} q/s, off {off['qps_c8']:.0f} q/s")
    Path(args.out).write_text(json.dumps(report, indent=1))
    bad = sum(r["cold_total"] - r["cold_equal"] for r in report["agents"])
    print(f"warm == cold: {'all' if not bad else f'{bad} differ'}; written {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
