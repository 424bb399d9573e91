"""One agent step under several flat-graph capacity sets, in one process.

For each set (a ``--graph-capacities`` list) an engine over the same random
model captures only those graphs, then times the agent's third step resumed
from its second step's checkpoint (:func:`profile_round.wall_breakdown`): which
graph the step replays and what padding it pays in tokens, segments and levels.
Every set's answers must be bitwise equal to the first set's (a graph's shape
never changes a question's bits); the run fails if one is not.

Usage (GPU)::

    python benchmark/sweep_agent_graphs.py --agent 1500:200 --sets "640:20:4;640:13:3;576:13:3" --out sweep.json

Exit status 2 with one line on bad arguments, 1 when answers differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_trajectories import AgentShape, agent_steps, label_ids, step_groups  # noqa: E402
from bench_decision import model_config  # noqa: E402
from profile_round import wall_breakdown  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model  # noqa: E402
from flide_ext.runtime.graph_capacities import parse_capacities  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--agent", required=True, metavar="START:GROWTH")
    parser.add_argument("--sets", required=True, help="capacity sets separated by ';', each tokens:segments[:levels],...")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cache-gb", type=float, default=4.0, help="each engine's state cache (GiB)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        start, growth = (int(x) for x in args.agent.split(":"))
        shape = AgentShape(start=start, growth=growth, steps=3)
        sets = [parse_capacities(text) for text in args.sets.split(";")]
        config = model_config(args.model)
        trajectory = [agent_steps(shape, config.vocab_size)]  # checks the shape
        if args.runs < 1 or not 0 < args.cache_gb < float("inf"):
            raise ValueError(f"--runs {args.runs} must be >= 1 and --cache-gb {args.cache_gb} a positive number")
    except (ValueError, KeyError) as err:
        print(f"sweep_agent_graphs.py: {err}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sweep_agent_graphs.py: needs a CUDA device", file=sys.stderr)
        return 2
    model = random_model(config, torch.bfloat16, torch.device("cuda"), seed=0)
    groups = [step_groups(trajectory, step, label_ids(shape))[0] for step in range(1, 3)]
    rows, first, same = [], None, True
    for text, capacities in zip(args.sets.split(";"), sets):
        engine = Engine(args.model, dtype=torch.bfloat16, device="cuda", model=model, graph_capacities=capacities,
                        state_cache_bytes=int(args.cache_gb * 2**30))

        def setup():
            engine.flush_cache()
            engine.run_round(groups[:1])

        setup()
        answers = engine.run_round(groups[1:]).answers
        first = answers if first is None else first
        equal = answers == first
        same &= equal
        row = {"set": text, **wall_breakdown(engine, groups[1:], args.runs, setup), "equal_to_first": equal}
        rows.append(row)
        print("{set:>28s}: graph {graph}, {stream_tokens} tokens, {request_ms:.2f} ms (plan {plan_ms:.2f}, tables "
              "{tables_ms:.2f}, GPU {gpu_ms:.2f}, forward {forward_ms:.2f}, finish {finish_ms:.2f}), bits equal: "
              "{equal_to_first}".format(**row), flush=True)
        del engine
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "agent": args.agent, "rows": rows}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
