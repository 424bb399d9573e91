"""The flat CUDA graphs on a CUDA device: capture time, and answers under graphs
against the same engine without graphs.

Checks, each one line and one JSON entry:

* capture of every default capacity, with its wall time (goal: <= 60 s for a
  4B-sized model);
* per workload (RACE, MultiRC, QuALITY shapes; fixed and varied request mixes;
  1, 8 and 64 requests per call): label probabilities under flat graphs,
  per-shape graphs and no graphs; max |p_graph - p_eager|, argmax changes, and
  that every answer is finite;
* padding: the same rounds replayed in the *largest* graph only (many padding
  rows, spare segments, levels and readout rows), right after a larger round in
  that graph, with the graph's output buffer filled with NaN before each replay:
  answers equal to eager within tolerance, no NaN.

Usage::

    python benchmark/check_graphs.py --model qwen3.5-4b --out graphs.json

Exit status 1 when a check fails; 2 with one line on bad arguments or without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decision import model_config, requests_for  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model  # noqa: E402

# Largest label-probability change a bf16 replay may show against eager (GEMM
# tilings differ with the padded row count; the answers' argmax may not change).
PROB_TOL = 2e-2
results: list[dict] = []


def record(name: str, ok: bool, **facts) -> None:
    results.append({"check": name, "ok": ok, **facts})
    detail = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in facts.items())
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def probabilities(answers) -> list[torch.Tensor]:
    return [torch.softmax(torch.tensor(q), -1) for request in answers for q in request]


def compare(name: str, got, want, **facts) -> None:
    p, q = probabilities(got), probabilities(want)
    finite = all(bool(torch.isfinite(x).all()) for x in p)
    diff = max(float((a - b).abs().max()) for a, b in zip(p, q))
    flips = sum(int(a.argmax() != b.argmax()) for a, b in zip(p, q))
    record(name, finite and diff <= PROB_TOL and flips == 0, questions=len(p), max_prob_diff=diff,
           argmax_changes=flips, finite=finite, **facts)


def answers(engine, groups, mode: str):
    engine.graphs.mode = mode
    return engine.run_round(groups)  # a RoundResult


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--workloads", nargs="+", default=["race", "multirc", "quality"])
    parser.add_argument("--out", default="graphs.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_graphs.py: needs a CUDA device", file=sys.stderr)
        return 2
    try:
        config = model_config(args.model)
    except KeyError:
        print(f"check_graphs.py: unknown model {args.model!r}", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    model = random_model(config, torch.bfloat16, device, seed=0)
    t0 = time.perf_counter()
    engine = Engine(args.model, dtype=torch.bfloat16, device=device, model=model)
    runner = engine.graphs
    record("capture", runner.capture_seconds <= 60, graphs=len(runner.capacities), capture_s=runner.capture_seconds,
           engine_start_s=time.perf_counter() - t0, peak_gpu_gb=torch.cuda.max_memory_allocated() / 2**30,
           capacities=[[c.tokens, c.segments, c.levels] for c in runner.capacities])
    # Again with every kernel compiled and tuned (as at any start after the first
    # on a machine, which finds them in Triton's cache).
    runner._graphs.clear()
    with torch.inference_mode():
        again = runner.capture()
    record("capture, kernels compiled", again <= 60, capture_s=again,
           per_graph_s=[round(s, 2) for s in runner.capture_log])
    largest = runner.capacities[-1]
    # Where a single request's time goes: host tables and copy, then the replay.
    for workload in args.workloads:
        groups = requests_for(workload, 12, config.vocab_size, 1.0, seed=7)
        runner.mode = "flat"
        totals, hosts = [], []
        for g in groups:
            by_cost = runner.eager_by_cost  # before this round: the last round's choice below
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            result = engine.run_round([g])
            totals.append(1e3 * (time.perf_counter() - t1))
            hosts.append(runner.last_host_ms)
        used = result.graph
        # A graph, unless the runner's cost model sent the round eagerly because
        # its own estimate beat the padded graph's measured replay (large rounds).
        eager_chosen = used is None and runner.eager_by_cost > by_cost
        record(f"{workload} single request, flat graph (or eager by the cost model)", used is not None or eager_chosen,
               eager_by_cost_model=eager_chosen, p50_ms=sorted(totals)[6],
               host_tables_ms=sorted(hosts)[6], graph=[used.tokens, used.segments] if used else None,
               graph_replay_ms=runner._graphs[used].replay_ms if used else None,
               stream_tokens=result.stats.stream_tokens, launch_ms=runner.launch_ms)
    for workload in args.workloads:
        for vary in (False, True):
            for count in (1, 8) if workload == "quality" else (1, 8, 64):
                groups = requests_for(workload, count, config.vocab_size, 1.0, seed=count, vary=vary)
                eager = answers(engine, groups, "off")
                flat = answers(engine, groups, "flat")
                used = flat.graph
                compare(f"{workload}{' varied' if vary else ''} x{count} flat graphs vs eager", flat.answers, eager.answers,
                        graph=[used.tokens, used.segments] if used else None)
                shaped = answers(engine, groups, "per_shape")
                compare(f"{workload}{' varied' if vary else ''} x{count} per-shape graphs vs eager", shaped.answers,
                        eager.answers)
                runner._shaped.clear()  # each holds its own output buffer
                torch.cuda.empty_cache()
                if count == 64:
                    continue
                # Padding: only the largest graph, a larger round replayed in it
                # first, its output poisoned before each replay.
                saved = runner.capacities
                runner.capacities = [largest]
                runner.mode = "flat"
                try:
                    with torch.inference_mode():
                        runner._graphs[largest].output.fill_(float("nan"))
                    engine.run_round(requests_for(workload, 2 * count, config.vocab_size, 1.0, seed=99, vary=True))
                    with torch.inference_mode():
                        runner._graphs[largest].output.fill_(float("nan"))
                    padded = engine.run_round(groups)
                finally:
                    runner.capacities = saved
                stream = padded.stats.stream_tokens
                compare(f"{workload}{' varied' if vary else ''} x{count} in the largest graph vs eager", padded.answers,
                        eager.answers,
                        stream_tokens=stream, padding_rows=largest.tokens - stream)
    record("rounds", True, replays=runner.replays, eager_rounds=runner.eager_rounds,
           eager_by_cost=runner.eager_by_cost, captures=runner.captures)
    Path(args.out).write_text(json.dumps(results, indent=1))
    failed = [r["check"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} checks pass" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
