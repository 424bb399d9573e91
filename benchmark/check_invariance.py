"""Bit invariance: the same questions alone and in every kind of round, compared
bitwise (a diagnostic in process; under concurrent HTTP clients it is
``bench_serving.py --check-cold``).

Each probe request (RACE-, MultiRC- and QuALITY-like, varied sizes) is answered
first alone, cold (the state cache flushed) and eagerly: the reference. Then
again, each condition compared with it bit for bit:

* ``graph T:S:L``: alone, cold, replayed in each captured graph that holds its
  round (the cost model's eager choice overridden), every capacity in turn;
* ``with K others``: in one round with K other requests of mixed sizes (fresh
  fillers each time), under flat graphs as the runner picks them and eagerly;
* ``resumed``: alone, from the checkpoints its own cold run kept; and resumed
  inside a round with others.

Per condition: questions compared, how many are bitwise equal, the largest
label log-probability difference and argmax changes. ``--deterministic`` runs
the engine in deterministic mode (:mod:`flide_ext.runtime.determinism`); the
run records which it was, and the rounds' wall time, so two runs (with and
without) show what the mode costs in process.

Usage::

    python benchmark/check_invariance.py --model qwen3.5-4b --out invariance.json
    python benchmark/check_invariance.py --model qwen3.5-4b --deterministic --out invariance_det.json
    python benchmark/check_invariance.py --model tiny-qwen3.5 --device cpu --others 1 3 --probes 3 --scale 0.1  # smoke

Exit status 0 (1 with ``--strict`` when any answer differs); 2 with one line on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decision import model_config, requests_for  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model, with_head_scale  # noqa: E402
from flide_ext.protocol.errors import FlideError, ModelLoadError  # noqa: E402
from flide_ext.runtime.capacity import RoundCapacity  # noqa: E402
from flide_ext.runtime.graph_capacities import default_capacities  # noqa: E402
from flide_ext.runtime.model_runner import check_device  # noqa: E402
from flide_ext.runtime.rounds import request_size  # noqa: E402
from flide_ext.server.cache_args import cache_settings  # noqa: E402

WORKLOADS = ("race", "multirc", "quality")
FILLERS = ("race_single", "race", "multirc")  # small enough for 200 in a round


SCALE = [1.0]  # --scale: the workloads' state and question lengths times this


def mixed(count: int, vocab: int, seed: int, kinds=WORKLOADS) -> list:
    """``count`` varied requests, the workloads in turn."""
    out = []
    for i, kind in enumerate(kinds):
        n = count // len(kinds) + (i < count % len(kinds))
        if n:
            out += requests_for(kind, n, vocab, SCALE[0], seed=seed + i, vary=True)
    random.Random(seed).shuffle(out)
    return out


def round_with_others(probe, i: int, k: int, vocab: int):
    """Probe ``i`` among ``k`` mixed others -> (the round's requests, the probe's place)."""
    fillers = mixed(k, vocab, seed=1000 * k + i, kinds=FILLERS)
    at = random.Random(i).randrange(k + 1)
    return fillers[:at] + [probe] + fillers[at:], at


def largest_round(probes, counts, vocab: int) -> tuple[int, int]:
    """The most stream tokens and segments of the rounds :meth:`Checker.with_others` runs."""
    most = [0, 0]
    for k in counts:
        for i, probe in enumerate(probes):
            sizes = [request_size(r[0], "prompts") for r in round_with_others(probe, i, k, vocab)[0]]
            most = [max(most[0], sum(s.tokens for s in sizes)), max(most[1], sum(s.segments for s in sizes))]
    return most[0], most[1]


class Checker:
    """Runs the conditions on one engine and tallies them against the references."""

    def __init__(self, engine, probes: list):
        self.engine, self.probes = engine, probes
        self.graphs = engine.graphs
        self.rows: list = []
        self.reference = [self.alone(p, "off") for p in probes]

    def alone(self, probe, mode: str, resumed: bool = False):
        if not resumed:
            self.engine.flush_cache()
        if self.graphs is not None:
            self.graphs.mode = mode
        return self.engine.run_round([probe])

    def tally(self, name: str, results: list, indices: list, seconds: float, **facts) -> None:
        """``results[j]`` answers probe ``indices[j]`` (a list of per-question label log-probabilities)."""
        questions = equal = flips = 0
        worst = 0.0
        if len(results) != len(indices):
            raise RuntimeError(f"{name}: {len(results)} answers for {len(indices)} probes")
        for got, i in zip(results, indices):
            want = self.reference[i].answers[0]
            if len(got) != len(want):
                raise RuntimeError(f"{name}: probe {i} answered {len(got)} of its {len(want)} questions")
            for a, b in zip(got, want):
                if len(a) != len(b):
                    raise RuntimeError(f"{name}: probe {i} answered {len(a)} labels of a question with {len(b)}")
                questions += 1
                equal += a == b
                # Equal values (-inf included) differ by 0; a NaN on either side is the
                # largest difference (max() would skip it).
                worst = max(worst, max(0.0 if x == y else abs(x - y) if x == x and y == y else math.inf
                                       for x, y in zip(a, b)))
                flips += a.index(max(a)) != b.index(max(b))
        self.rows.append({"condition": name, "questions": questions, "bitwise_equal": equal,
                          "max_abs_diff": worst, "argmax_changes": flips, "seconds": seconds, **facts})

    def each_graph(self) -> None:
        runner = self.graphs
        saved_caps = runner.capacities
        runner._eager_ms = lambda tokens: math.inf  # replay whatever graph holds the round
        try:
            for capacity in tqdm(saved_caps, desc="graphs", unit="graph", leave=False):
                runner.capacities = [capacity]
                got, idx, t0 = [], [], time.perf_counter()
                for i, probe in enumerate(self.probes):
                    result = self.alone(probe, "flat")
                    if result.graph == capacity:
                        got.append(result.answers[0])
                        idx.append(i)
                if idx:
                    self.tally(f"graph {capacity.tokens}:{capacity.segments}:{capacity.levels}", got, idx,
                               time.perf_counter() - t0, probes=len(idx))
        finally:
            runner.capacities = saved_caps
            del runner._eager_ms  # the class's cost model again

    def with_others(self, counts: list, vocab: int) -> None:  # its rounds: round_with_others
        modes = ("flat", "off") if self.graphs is not None else ("off",)
        for k in tqdm(counts, desc="rounds", unit="size", leave=False):
            for mode in modes:
                got, t0, graphs = [], time.perf_counter(), set()
                for i, probe in enumerate(self.probes):
                    round_, at = round_with_others(probe, i, k, vocab)
                    self.engine.flush_cache()
                    if self.graphs is not None:
                        self.graphs.mode = mode
                    result = self.engine.run_round(round_)
                    got.append(result.answers[at])
                    graphs.add(None if result.graph is None else result.graph.tokens)
                self.tally(f"with {k} others, {'eager' if mode == 'off' else 'flat graphs'}", got,
                           list(range(len(self.probes))), time.perf_counter() - t0,
                           graph_tokens=sorted(graphs, key=lambda g: -1 if g is None else g))

    def resumed(self, vocab: int) -> None:
        if self.engine.cache is None:
            return
        for others in (0, 8):
            got, t0, resumed_tokens = [], time.perf_counter(), 0
            for i, probe in enumerate(self.probes):
                self.alone(probe, "flat")  # cold: keeps its checkpoints
                fillers = mixed(others, vocab, seed=77 + i, kinds=FILLERS) if others else []
                if self.graphs is not None:
                    self.graphs.mode = "flat"
                result = self.engine.run_round([probe] + fillers)
                got.append(result.answers[0])
                resumed_tokens += result.resumed_tokens[0]
            self.tally(f"resumed{f' with {others} others' if others else ''}", got, list(range(len(self.probes))),
                       time.perf_counter() - t0, resumed_tokens=resumed_tokens)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--model", default="qwen3.5-4b", help="a model shape of bench_decision.py")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--probes", type=int, default=12, help="probe requests (the workloads in turn)")
    parser.add_argument("--others", type=int, nargs="+", default=[1, 5, 20, 50, 100, 200])
    parser.add_argument("--scale", type=float, default=1.0, help="state and question lengths times this (smoke)")
    parser.add_argument("--head-scale", type=float, default=1.0, help="LM head init scale (not 1: peaked answers, the head untied)")
    parser.add_argument("--deterministic", action="store_true", help="the engine in deterministic mode")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any answer differs")
    parser.add_argument("--state-cache-gb", default=None,
                        help="the state cache's budget in GiB, as the server's flag (default: the engine's own)")
    parser.add_argument("--out", help="JSON file of every condition")
    args = parser.parse_args(argv)
    try:
        config = model_config(args.model)
    except KeyError:
        print(f"check_invariance.py: unknown model {args.model!r}", file=sys.stderr)
        return 2
    if args.probes < 1 or min(args.others) < 1:
        print("check_invariance.py: --probes and --others must be at least 1", file=sys.stderr)
        return 2
    try:
        device = check_device(args.device)
    except ModelLoadError as e:
        print(f"check_invariance.py: --device: {e}", file=sys.stderr)
        return 2
    if not 0 < args.scale <= 1:
        print(f"check_invariance.py: --scale {args.scale} must be in (0, 1]", file=sys.stderr)
        return 2
    try:
        cache, _ = cache_settings(False, args.state_cache_gb, None, str(device))
    except FlideError as e:
        print(f"check_invariance.py: {e}", file=sys.stderr)
        return 2
    try:
        with_head_scale(config, args.head_scale)
    except ValueError as e:
        print(f"check_invariance.py: --head-scale: {e}", file=sys.stderr)
        return 2
    if args.out:
        # Opened once now (and left empty) so that a path that cannot be written fails before the sweep.
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).open("a").close()
        except OSError as e:
            print(f"check_invariance.py: --out {args.out}: cannot write there ({e.strerror})", file=sys.stderr)
            return 2
    SCALE[0] = args.scale
    dtype = getattr(torch, args.dtype)
    model = random_model(config, dtype, device, seed=0, head_scale=args.head_scale)
    t0 = time.perf_counter()
    # Rounds here are built by hand, past the default capacity (a probe with 200
    # others): the engine's capacity holds them (deterministic mode checks its
    # GEMMs up to it), its graphs stay those of the default capacity.
    default = RoundCapacity()
    graphs = default_capacities(default.tokens, default.segments, lean_levels=3) if device.type == "cuda" else None
    probes = mixed(args.probes, config.vocab_size, seed=5)
    tokens, segments = largest_round(probes, args.others, config.vocab_size)
    engine = Engine(args.model, dtype=dtype, device=device, model=model, deterministic=args.deterministic, **cache,
                    round_capacity=RoundCapacity(tokens=max(tokens, default.tokens),
                                                 segments=max(segments, default.segments)),
                    graph_capacities=graphs)
    start_s = time.perf_counter() - t0
    vocab = config.vocab_size
    checker = Checker(engine, probes)
    if engine.graphs is not None:
        checker.each_graph()
    checker.with_others(args.others, vocab)
    checker.resumed(vocab)
    rows = checker.rows
    for r in rows:
        print(f"{r['condition']:<34} {r['bitwise_equal']:>5}/{r['questions']:<5} bitwise equal, "
              f"max |diff| {r['max_abs_diff']:.3g}, argmax changes {r['argmax_changes']}, {r['seconds']:.1f} s")
    differ = sum(r["questions"] - r["bitwise_equal"] for r in rows)
    total = sum(r["questions"] for r in rows)
    print(f"{total - differ}/{total} bitwise equal over {len(rows)} conditions "
          f"({'deterministic mode: ' + engine.runner.deterministic if args.deterministic else 'default mode'})")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "settings": {**vars(args), "start_s": start_s, "deterministic_mode": engine.runner.deterministic,
                         "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                         "graphs": len(engine.graphs.capacities) if engine.graphs is not None else 0,
                         "state_cache_bytes": engine.state_cache_bytes},
            "conditions": rows, "bitwise_equal": total - differ, "questions": total}, indent=1))
    return 1 if args.strict and differ else 0


if __name__ == "__main__":
    sys.exit(main())
