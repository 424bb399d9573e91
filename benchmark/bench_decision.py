"""Decision-serving benchmark in the manner of SGLang's bench_serving: every
strategy of the engine and a Hugging Face transformers per-question forward, on
the same seeded requests, in one run.

Workloads are shaped like RACE, QuALITY and MultiRC (state tokens, questions per
state, question tokens: ``benchmark/kernels/workloads.py``), as seeded random
token ids; models are Qwen3.5 0.8B / 4B / 9B, Qwen3-4B and Llama-3.2-1B shapes
with random weights (``tiny-qwen3.5`` for a CPU smoke run). Methods:

* ``flide``: the state once, forked to every question in one flat stream.
* ``no_fork``: one sequence per question, the state recomputed each time.
* ``prefix_cache``: the state computed once and cached, each question its own
  sequence resuming from it (hybrid models from the last 64-token grid point).
* ``full_readout``: ``flide`` with the final norm and LM head over every row.
* ``no_graphs``: ``flide`` with every kernel launched one by one (no CUDA graphs).
* ``per_shape_graphs``: ``flide`` with one CUDA graph per exact round shape,
  captured when a shape is first seen, instead of the flat graphs over a few
  stream capacities.
* ``hf``: transformers' model, one forward per question (concurrency 1 only).

``--agents 1 8`` adds the agent-trajectory workload (``agent_trajectories.py``):
histories that grow every step (``--agent-shape START GROWTH STEPS CRITERIA
TOKENS``), each step one request whose state is the whole history, resumed from
the state cache; per-step latency (first and later steps), decisions/s, cached
tokens and cache memory. The engine's state cache is on (``--disable-radix-cache``
turns it off for the fresh-state workloads); every fresh-state request has a
state no other request has.

Every timed call gets requests it has not seen (a fresh slice of the seeded
requests), so no method is timed on a repeat of its warm-up; ``--vary`` draws
each request's state length, question count and question length around the
workload's (0.8-1.2x, 0.5-1.5x, 0.8-1.2x), as real traffic mixes them.

Per (model, workload, method): p50/p99 latency of one request, questions/s with
1, 8 and 64 concurrent closed-loop clients (in process: each round holds one
request per client, as the scheduler packs every waiting request), flat-stream
tokens against per-question prompt tokens, and peak GPU memory. Per (model,
workload): the roofline floor of one request, from weight bytes over the copy
bandwidth and FLOPs over the matmul rate, both measured in the same run, and the
time of the same stream tokens run as one plain sequence (the state's prefill
plus the question tokens, unforked: ``prefill_alone_ms``).

Usage::

    python benchmark/bench_decision.py --models qwen3.5-4b --workloads multirc race quality \\
        --out decision.jsonl --plot decision.png
    python benchmark/bench_decision.py --models tiny-qwen3.5 --device cpu --dtype float32 --scale 0.1  # smoke

Writes one JSON line per measurement to ``--out``, prints a table, saves a plot.
Exit status 2 with one line on bad arguments.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent / "kernels"))

from agent_trajectories import AgentShape, run_agents  # noqa: E402
from workloads import WORKLOADS, workload_prompts  # noqa: E402

from flide_ext import Engine  # noqa: E402
from flide_ext.assets.random_checkpoints import random_model, shape_config, shape_names  # noqa: E402
from flide_ext.runtime.strategies import run_strategy  # noqa: E402

METHODS = ("flide", "no_fork", "prefix_cache", "full_readout", "no_graphs", "per_shape_graphs", "hf")
# The engine's CUDA-graph mode per method (engine.graphs.mode).
GRAPH_MODE = {"no_graphs": "off", "per_shape_graphs": "per_shape"}
OPTIONS = {"race": 4, "race_single": 4, "quality": 4, "multirc": 2}  # labels per question
# Attention-only shapes from the published config.json of Qwen3-4B and Llama-3.2-1B.
DENSE_SHAPES = {
    "qwen3-4b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=2560, num_hidden_layers=36, intermediate_size=9728, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5})),
}


def model_config(name: str):
    """transformers config of a named shape (Qwen3.5 from its model cards, Gemma 4
    and Qwen3-4B and Llama-3.2-1B from their published config.json;
    :func:`flide_ext.assets.random_checkpoints.shape_config`).

    Raises:
        KeyError: an unknown name.
    """
    if name in shape_names():
        return shape_config(name)
    if name == "tiny-qwen3.5":
        from check_kernels import tiny_qwen35_config  # benchmark/kernels: the GPU checks' tiny model

        return tiny_qwen35_config()
    if name in DENSE_SHAPES:
        import transformers

        config_class, architecture, shape = DENSE_SHAPES[name]
        config = getattr(transformers, config_class)(**shape)
        config.architectures = [architecture]
        return config
    raise KeyError(name)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeat: int) -> list[float]:
    """Wall seconds of each of ``repeat`` calls (after one warm-up call)."""
    fn()
    out = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def ceilings(device, dtype) -> dict:
    """Matmul rate (TFLOP/s) and copy bandwidth (GB/s, read + write) on ``device``."""
    n = 8192 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    mm = statistics.median(timed(lambda: a @ a, device, 20))
    src = torch.empty((1 << 30) if device.type == "cuda" else (1 << 24), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    cp = statistics.median(timed(lambda: dst.copy_(src), device, 20))
    return {"matmul_tflops": 2 * n**3 / mm / 1e12, "copy_gbps": 2 * src.numel() / cp / 1e9}


def timed_batches(fn, batches, device) -> list[float]:
    """Wall seconds of ``fn(batch)`` for each batch but the first (the warm-up)."""
    fn(batches[0])
    out = []
    for batch in batches[1:]:
        sync(device)
        t0 = time.perf_counter()
        fn(batch)
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def varied_prompts(workload: str, count: int, vocab: int, seed: int = 0):
    """``(owners, prompts)`` like :func:`workload_prompts`, each request's state
    length, question count and question length drawn around the workload's."""
    state_len, questions, question_len, _ = WORKLOADS[workload]
    gen = torch.Generator().manual_seed(seed)

    def around(n, lo, hi):
        return max(1, int(n * (lo + (hi - lo) * torch.rand((), generator=gen).item())))

    owners, prompts = [], []
    for r in range(count):
        state = torch.randint(0, vocab, (around(state_len, 0.8, 1.2),), generator=gen).tolist()
        for i in range(around(questions, 0.5, 1.5)):
            question = torch.randint(0, vocab, (around(question_len, 0.8, 1.2),), generator=gen).tolist()
            question[0] = i
            owners.append(r)
            prompts.append(state + question)
    return owners, prompts


def requests_for(workload: str, count: int, vocab: int, scale: float, seed: int = 0, vary: bool = False):
    """``count`` requests of a workload as ``(prompts, labels)`` groups."""
    if vary:
        owners, prompts = varied_prompts(workload, count, vocab, seed)
    else:
        owners, prompts = workload_prompts(workload, requests=count, seed=seed, vocab=vocab)
    if scale != 1.0:  # shorter states and questions for smoke runs, same tree shape
        state_len, _, question_len, _ = WORKLOADS[workload]
        keep_state, keep_q = max(1, int(state_len * scale)), max(1, int(question_len * scale))
        prompts = [p[:keep_state] + p[state_len:state_len + keep_q] for p in prompts]
    groups: list = [([], []) for _ in range(count)]
    for r, p in zip(owners, prompts):
        groups[r][0].append(p)
        groups[r][1].append(list(range(OPTIONS[workload])))
    return groups


def hf_runner(config, device, dtype, groups):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with device:  # initialised where it runs (a 4B model's CPU init takes minutes)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()

    @torch.inference_mode()
    def run(batch):
        out = []
        for prompts, labels in batch:
            answers = []
            for p, ids in zip(prompts, labels):
                logits = model(torch.tensor([p], device=device)).logits[0, -1].float()
                answers.append(torch.log_softmax(logits, -1)[ids].tolist())
            out.append(answers)
        return out

    return run, model


def prefill_alone(group):
    """One request's state followed by every question's own tokens as a single
    prompt with one label: the request's stream tokens, unforked."""
    from flide_ext.plan.tree import build_prefix_tree

    prompts, _ = group
    tree = build_prefix_tree([0] * len(prompts), prompts)
    tokens = [int(t) for seg in tree.segments for t in seg.tokens]
    return [tokens], [[0]]


def flops_per_request(config, stream_tokens: int, readout_rows: int) -> float:
    """Matmul FLOPs of one request: 2 x the layers' parameters x stream tokens, plus
    2 x hidden x vocab per readout row (the LM head runs on those rows only; the
    embedding is a lookup, no FLOPs). Attention's own FLOPs are left out (a floor)."""
    from flide_ext.assets.random_checkpoints import count_parameters

    head = config.hidden_size * config.vocab_size
    embeddings = head if getattr(config, "tie_word_embeddings", False) else 2 * head
    return 2.0 * (count_parameters(config) - embeddings) * stream_tokens + 2.0 * head * readout_rows


def bench(args) -> list[dict]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows: list[dict] = []
    ceil = ceilings(device, dtype)
    tqdm.write(f"ceilings on {args.device}: {ceil}")
    out = open(args.out, "w") if args.out else None

    def emit(row):
        rows.append(row)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    for model_name in args.models:
        config = model_config(model_name)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        model = random_model(config, dtype, device, seed=0)
        engine = Engine(model_name, dtype=dtype, device=device, model=model, radix_cache=not args.disable_radix_cache)
        if engine.graphs is not None:
            emit({"model": model_name, "kind": "graphs", "capture_s": engine.graphs.capture_seconds,
                  "graphs": len(engine.graphs.capacities),
                  "capacities": [[c.tokens, c.segments, c.levels] for c in engine.graphs.capacities]})
            tqdm.write(f"{model_name}: {len(engine.graphs.capacities)} CUDA graphs captured in "
                       f"{engine.graphs.capture_seconds:.1f} s")
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for agents in args.agents:
            # The agent workload: histories growing every step, the state cache on.
            shape = AgentShape(*args.agent_shape)
            row = run_agents(engine, shape, agents, config.vocab_size, device, cold=args.agent_cold)
            row.update(model=model_name, workload="agent", kind="agent")
            emit(row)
            tqdm.write(f"{model_name} agent x{agents} {args.agent_shape}: first step {row['first_step_ms']:.1f} ms, "
                       f"later p50 {row['later_p50_ms']:.1f} ms, {row['later_decisions_per_s']:.0f} decisions/s later, "
                       f"cached {row['cache']['cached_tokens']} tokens ({row['cache']['bytes'] / 2**20:.0f} MiB)")
        for workload in args.workloads:
            top = max(args.concurrency)
            # Every timed call gets a fresh slice: enough requests for the largest
            # concurrency's rounds, and for the latency calls.
            need = max(top * (args.rounds + 1), args.latency_iters + 1)
            groups = requests_for(workload, need, config.vocab_size, args.scale, vary=args.vary)
            one = groups[:1]
            stream = engine.run_round(one).stats.stream_tokens
            floor_bytes = weight_bytes / (ceil["copy_gbps"] * 1e9)
            readouts = sum(len(p) for p, _ in one)
            floor_flops = flops_per_request(config, stream, readouts) / (ceil["matmul_tflops"] * 1e12)
            # The same tokens as one plain sequence (the state, then every question's
            # own tokens, one readout): what the stream costs without forking.
            alone = [prefill_alone(g) for g in groups[:args.latency_iters + 1]]
            alone_ms = statistics.median(timed_batches(lambda g: engine.run_round([g]), alone, device)) * 1e3
            emit({"model": model_name, "workload": workload, "kind": "roofline", "weight_bytes": weight_bytes,
                  "stream_tokens": stream, "floor_weights_ms": 1e3 * floor_bytes, "floor_flops_ms": 1e3 * floor_flops,
                  "floor_ms": 1e3 * max(floor_bytes, floor_flops), "prefill_alone_ms": alone_ms, **ceil})
            hf = None
            for method in tqdm(args.methods, desc=f"{model_name} {workload}", leave=False):
                if method == "hf":
                    if hf is None:
                        hf = hf_runner(config, device, dtype, groups)
                    run, concurrencies = hf[0], [1]
                else:
                    if method in GRAPH_MODE and engine.graphs is None:
                        tqdm.write(f"{method}: skipped (CUDA graphs need a CUDA device)")
                        emit({"model": model_name, "workload": workload, "kind": "skipped", "method": method,
                              "reason": "CUDA graphs need a CUDA device"})
                        continue
                    strategy = method if method in ("no_fork", "prefix_cache") else "flide"
                    model.selective_readout = method != "full_readout"
                    if engine.graphs is not None:
                        engine.graphs.mode = GRAPH_MODE.get(method, "flat")

                    def run(batch, strategy=strategy):
                        return run_strategy(engine, batch, strategy)

                    concurrencies = args.concurrency
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                lat = timed_batches(run, [[g] for g in groups[:args.latency_iters + 1]], device)
                counted = run(one) if method != "hf" else None  # untimed: the row's token counts are the first request's
                questions = sum(len(p) for p, _ in one)
                row = {"model": model_name, "workload": workload, "kind": "method", "method": method,
                       "questions_per_request": questions,
                       "prompt_tokens": sum(len(p) for prompts, _ in one for p in prompts),
                       "stream_tokens": counted.stats.stream_tokens if counted is not None else None,
                       "p50_ms": 1e3 * statistics.median(lat),
                       "p99_ms": 1e3 * sorted(lat)[min(len(lat) - 1, int(0.99 * len(lat)))]}
                for c in concurrencies:
                    batches = [groups[i * c:(i + 1) * c] for i in range(args.rounds + 1)]
                    secs = timed_batches(run, batches, device)
                    row[f"qps_c{c}"] = sum(len(p) for b in batches[1:] for p, _ in b) / sum(secs)
                row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
                emit(row)
                tqdm.write(f"{model_name} {workload} {method}: p50 {row['p50_ms']:.1f} ms, "
                           + ", ".join(f"c{c} {row[f'qps_c{c}']:.1f} q/s" for c in concurrencies))
            model.selective_readout = True
            if engine.graphs is not None:
                engine.graphs.mode = "flat"
            if hf is not None:
                del hf
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if out:
        out.close()
    return rows


def print_table(rows: list[dict], concurrency) -> None:
    head = f"{'model':14s} {'workload':9s} {'method':16s} {'p50 ms':>9s} {'p99 ms':>9s} " + " ".join(
        f"{'q/s c' + str(c):>10s}" for c in concurrency) + f" {'stream/prompt tok':>18s} {'peak MB':>9s}"
    print(head)
    for r in rows:
        if r["kind"] == "graphs":
            print(f"{r['model']:14s} {r['graphs']} CUDA graphs captured in {r['capture_s']:.1f} s")
            continue
        if r["kind"] == "skipped":
            print(f"{r['model']:14s} {r['workload']:9s} {r['method']:16s} skipped: {r['reason']}")
            continue
        if r["kind"] == "agent":
            print(f"{r['model']:14s} {'agent':9s} {'x' + str(r['agents']):16s} first step {r['first_step_ms']:.1f} ms, "
                  f"later p50 {r['later_p50_ms']:.1f} ms, {r['later_decisions_per_s']:.0f} decisions/s later"
                  + (f", cold equal {r['cold_equal']}/{r['cold_total']}" if r["cold_total"] else ""))
            continue
        if r["kind"] == "roofline":
            alone = f"; the same tokens as one sequence {r['prefill_alone_ms']:.2f} ms" if "prefill_alone_ms" in r else ""
            print(f"{r['model']:14s} {r['workload']:9s} {'roofline':16s} {r['floor_ms']:9.2f} "
                  f"(weights {r['floor_weights_ms']:.2f} ms, FLOPs {r['floor_flops_ms']:.2f} ms{alone})")
            continue
        qps = " ".join(f"{r[f'qps_c{c}']:10.1f}" if f"qps_c{c}" in r else f"{'-':>10s}" for c in concurrency)
        tokens = f"{r['stream_tokens']}/{r['prompt_tokens']}" if r["stream_tokens"] is not None else f"-/{r['prompt_tokens']}"
        peak = f"{r['peak_gpu_mb']:9.0f}" if r["peak_gpu_mb"] else f"{'-':>9s}"
        print(f"{r['model']:14s} {r['workload']:9s} {r['method']:16s} {r['p50_ms']:9.2f} {r['p99_ms']:9.2f} {qps} "
              f"{tokens:>18s} {peak}")


def plot(rows: list[dict], path: str, concurrency) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [r for r in rows if r["kind"] == "method"]
    keys = list(dict.fromkeys((r["model"], r["workload"]) for r in methods))
    c = max(concurrency)
    fig, ax = plt.subplots(figsize=(max(6, 2.5 * len(keys)), 4.5))
    names = list(dict.fromkeys(r["method"] for r in methods))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        vals = [next((r.get(f"qps_c{c}", r.get("qps_c1", 0)) for r in methods if (r["model"], r["workload"]) == k
                      and r["method"] == name), 0) for k in keys]
        ax.bar([x + i * width for x in range(len(keys))], vals, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(keys))], [f"{m}\n{w}" for m, w in keys])
    ax.set_yscale("log")
    ax.set_ylabel(f"questions/s ({c} clients; hf: 1)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--models", nargs="+", default=["qwen3.5-4b"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--scale", type=float, default=1.0, help="shrink state and question lengths (smoke runs)")
    parser.add_argument("--latency-iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per concurrency")
    parser.add_argument("--vary", action="store_true", help="vary state, question count and length per request")
    parser.add_argument("--agents", nargs="*", type=int, default=[],
                        help="also run the agent-trajectory workload with these numbers of agents stepping together")
    parser.add_argument("--agent-shape", nargs=5, type=int, default=[8000, 400, 8, 10, 30],
                        metavar=("START", "GROWTH", "STEPS", "CRITERIA", "TOKENS"),
                        help="agent histories: start tokens, growth per step, steps, criteria per step, criterion tokens")
    parser.add_argument("--agent-cold", action="store_true",
                        help="send every agent step again cold (cache flushed) and count bitwise equal answers")
    parser.add_argument("--disable-radix-cache", action="store_true", help="the engine without its state cache")
    parser.add_argument("--out", default="decision.jsonl")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args(argv)
    for name in args.models:
        try:
            model_config(name)
        except KeyError:
            known = ", ".join([*shape_names(), *DENSE_SHAPES, "tiny-qwen3.5"])
            print(f"bench_decision.py: unknown model {name!r} ({known})", file=sys.stderr)
            return 2
    if args.agents and args.disable_radix_cache:
        print("bench_decision.py: --agents needs the state cache (drop --disable-radix-cache)", file=sys.stderr)
        return 2
    if any(a < 1 for a in args.agents) or min(args.agent_shape) < 0 or args.agent_shape[0] < 1:
        print("bench_decision.py: --agents must be >= 1 and --agent-shape non-negative", file=sys.stderr)
        return 2
    if any(c < 1 for c in args.concurrency) or not 0 < args.scale <= 1 or args.latency_iters < 1 or args.rounds < 1:
        print("bench_decision.py: --concurrency, --latency-iters and --rounds must be >= 1, --scale in (0, 1]",
              file=sys.stderr)
        return 2
    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        print(f"bench_decision.py: --device {args.device!r} is not cpu or cuda", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_decision.py: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            print(f"bench_decision.py: {flag} {path!r}: no such directory", file=sys.stderr)
            return 2
    rows = bench(args)
    print_table(rows, args.concurrency)
    if args.plot:
        plot(rows, args.plot, args.concurrency)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
