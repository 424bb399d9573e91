"""Rounds back to back in process, one at a time against overlapped (the
scheduler's overlap schedule: the next round launched before the one in flight
is completed, :mod:`flide_ext.runtime.launched_round`): questions/s of each and
the bits of every answer compared. A diagnostic of the host time the overlap
hides; served figures come from the HTTP benchmarks.

Each pass runs ``ROUNDS`` rounds of ``REQUESTS`` fresh requests of a workload
(new states each round, as a loaded server's rounds are), first one at a time
(``Engine.run_round``) and then overlapped, ``--passes`` times in turn, for each
workload given, on one engine; prints the median questions/s of each and writes
them with ``--out``.

Usage::

    python benchmark/bench_overlap.py --workload multirc:15:12 race_single:23:12 race_single:1:40
    python benchmark/bench_overlap.py --model tiny-qwen3.5 --device cpu --dtype float32 --rounds 3  # smoke

Exit status 2 with one line on bad arguments; 1 when an overlapped answer
differs from the same round's one-at-a-time answer.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decision import WORKLOADS, model_config, requests_for  # noqa: E402
from profile_round import as_served  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model  # noqa: E402


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def one_at_a_time(engine, rounds: list) -> tuple[float, list]:
    """Seconds for ``rounds`` run by ``run_round`` in turn, and their answers."""
    _sync(engine)
    start = time.perf_counter()
    answers = [engine.run_round(groups, over_labels=[True] * len(groups)).answers for groups in rounds]
    return time.perf_counter() - start, answers


def overlapped(engine, rounds: list) -> tuple[float, list]:
    """Seconds for ``rounds`` each launched before the one before it is
    completed, and their answers."""
    _sync(engine)
    start = time.perf_counter()
    answers, flight = [], None
    for groups in rounds:
        launched = engine.launch_round(groups, over_labels=[True] * len(groups))
        if flight is not None:
            answers.append(engine.complete_round(flight).answers)
        flight = launched
    answers.append(engine.complete_round(flight).answers)
    return time.perf_counter() - start, answers


def _spec(text: str, requests: int, rounds: int) -> tuple[str, int, int]:
    # "WORKLOAD[:REQUESTS[:ROUNDS]]" -> (workload, requests, rounds).
    parts = text.split(":")
    if parts[0] not in WORKLOADS or len(parts) > 3:
        raise ValueError(f"--workload {text!r}: want one of {', '.join(WORKLOADS)}[:REQUESTS[:ROUNDS]]")
    try:
        values = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"--workload {text!r}: REQUESTS and ROUNDS are integers") from None
    values += [requests, rounds][len(values):]
    if min(values) < 1:
        raise ValueError(f"--workload {text!r}: REQUESTS and ROUNDS must be at least 1")
    return parts[0], values[0], values[1]


def measure(engine, vocab: int, workload: str, requests: int, rounds: int, passes: int) -> dict:
    """The two rates of one workload's rounds (median over ``passes``) and how
    many overlapped rounds' answers differ from the same rounds run one at a time."""
    per_pass = requests * rounds
    total = per_pass * (2 * passes + 1)
    groups = as_served(requests_for(workload, total, vocab, 1.0, seed=7))
    chunks = [groups[i:i + requests] for i in range(0, total, requests)]
    questions = sum(len(g[0]) for g in groups[:per_pass])
    engine.flush_cache()
    one_at_a_time(engine, chunks[:rounds])  # warm-up: kernels compiled, graphs replayed once
    rates = {"one_at_a_time": [], "overlapped": []}
    differ = 0
    for p in tqdm(range(passes), desc=f"{workload} x {requests}", file=sys.stderr):
        batch = chunks[(p + 1) * rounds:(p + 2) * rounds]
        engine.flush_cache()
        seconds, want = one_at_a_time(engine, batch)
        rates["one_at_a_time"].append(questions / seconds)
        # The same rounds again, overlapped: with the cache flushed, each computes what it did.
        engine.flush_cache()
        seconds, got = overlapped(engine, batch)
        rates["overlapped"].append(questions / seconds)
        differ += sum(g != w for g, w in zip(got, want))
    q = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{workload}: {rounds} rounds of {requests} requests: one at a time {q['one_at_a_time']:.1f} q/s, "
          f"overlapped {q['overlapped']:.1f} q/s ({q['overlapped'] / q['one_at_a_time']:.3f}x); "
          f"rounds whose answers differ: {differ}", flush=True)
    return {"workload": workload, "requests": requests, "rounds": rounds, "passes": passes, "questions_per_s": q,
            "all": rates, "rounds_differing": differ}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--workload", nargs="+", default=["multirc"], metavar="WORKLOAD[:REQUESTS[:ROUNDS]]",
                        help=f"workloads ({', '.join(WORKLOADS)}), each with its own requests per round and "
                             "rounds per pass if given")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--requests", type=int, default=15, help="requests per round")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per pass")
    parser.add_argument("--passes", type=int, default=3, help="passes of each kind, in turn")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        if args.passes < 1:
            raise ValueError("--passes must be at least 1")
        specs = [_spec(w, args.requests, args.rounds) for w in args.workload]
        config = model_config(args.model)
    except (ValueError, KeyError) as e:
        message = f"unknown model {args.model!r}" if isinstance(e, KeyError) else str(e)
        print(f"bench_overlap.py: {message}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    engine = Engine(args.model, dtype=dtype, device=device, model=random_model(config, dtype, device, seed=0))
    runs = [measure(engine, config.vocab_size, *spec, args.passes) for spec in specs]
    result = {"model": args.model, "dtype": args.dtype,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if any(r["rounds_differing"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
