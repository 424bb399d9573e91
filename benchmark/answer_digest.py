"""Bit-exact record of what a checkout computes on a GPU, to show that two
checkouts (before and after a refactor, say) give the same bits on the same inputs.

Records, for a random-weight model shape: every label log-probability of
``check_graphs.py``'s workloads (RACE, MultiRC, QuALITY shapes; fixed and varied
mixes; 1, 8 and 64 requests per round) under flat CUDA graphs and eagerly, as
float hex; and a SHA-256 of the outputs of each public kernel on seeded inputs.
Everything comes from the checkout given by ``--tree`` (its ``flide_ext`` and its
``benchmark/bench_decision.py`` workloads), so the same script runs on either::

    python benchmark/answer_digest.py --tree . --out new.json
    python benchmark/answer_digest.py --tree /path/to/old/checkout --out old.json
    python benchmark/answer_digest.py --compare old.json new.json

``--compare`` (plain or gzipped JSON) prints one line per entry that differs and exits 1 if any does.
Exit status 2 with one line on bad arguments or without CUDA.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import time
from pathlib import Path


def _read(path: str) -> dict:
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if path.endswith(".gz") else data)


def compare(old_path: str, new_path: str) -> int:
    old, new = _read(old_path), _read(new_path)
    differ = sorted(k for k in set(old["entries"]) | set(new["entries"]) if old["entries"].get(k) != new["entries"].get(k))
    for key in differ:
        print(f"DIFFERS {key}")
    same = len(set(old["entries"]) & set(new["entries"])) - len([k for k in differ if k in old["entries"] and k in new["entries"]])
    print(f"{same} of {len(old['entries'])} (old) / {len(new['entries'])} (new) entries bitwise equal; {len(differ)} differ")
    return 1 if differ else 0


def _hex(answers) -> list:
    return [[[float(x).hex() for x in q] for q in request] for request in answers]


def _sha(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def kernel_entries(device) -> dict:
    """Each public kernel on seeded inputs (bf16, the GPU path)."""
    from flide_ext.kernels.causal_conv1d import causal_conv1d
    from flide_ext.kernels.fork_attention import fork_attention
    from flide_ext.kernels.gated_delta_rule import chunk_gated_delta_rule
    from flide_ext.kernels.gdn_gate import gdn_gate
    from flide_ext.kernels.rms_norm import rms_norm
    from flide_ext.kernels.rotary import rotary
    from flide_ext.kernels.silu_mul import silu_mul
    from flide_ext.plan import plan_round

    gen = torch.Generator().manual_seed(2026)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    out = {}
    x, w, z = rand(300, 1024), rand(1024), rand(300, 1024)
    out["rms_norm cast"] = _sha(rms_norm(x, w, 1e-6, "cast"))
    out["rms_norm offset"] = _sha(rms_norm(x, w, 1e-6, "offset"))
    out["rms_norm gate"] = _sha(rms_norm(x, w, 1e-6, "cast", gate=z))
    out["rms_norm residual"] = _sha(*rms_norm(x, w, 1e-6, "offset", residual=z))
    q, cos, sin = rand(300, 8, 256), rand(300, 64), rand(300, 64)
    out["rotary"] = _sha(rotary(q, cos, sin))
    out["silu_mul"] = _sha(silu_mul(rand(300, 3584), rand(300, 3584)))
    out["gdn_gate"] = _sha(*gdn_gate(rand(300, 16), rand(300, 16), rand(16, dtype=torch.float32),
                                     rand(16, dtype=torch.float32)))
    state = torch.randint(3, 1000, (200,), generator=gen).tolist()
    prompts = [state + torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (1, 25, 90, 130)]
    plan = plan_round([0] * 4, prompts, device)
    T = plan.num_tokens
    q, k, v = rand(T, 16, 256), rand(T, 4, 256), rand(T, 4, 256)
    out["fork_attention"] = _sha(fork_attention(q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len,
                                                plan.seg_kv_start, plan.seg_kv_len, plan.positions, plan.kv_positions,
                                                256**-0.5))
    S = plan.num_segments
    slots = list(range(S))
    plan.assign_slots(slots)
    conv_pool = torch.zeros(S, 512, 3, dtype=torch.bfloat16, device=device)
    mixed, conv_w = rand(T, 512), rand(512, 4)
    conv_out = torch.zeros(T, 512, dtype=torch.bfloat16, device=device)
    for level in plan.level_tables():
        causal_conv1d(mixed, conv_w, None, conv_pool, *level, activation="silu", out=conv_out)
    out["causal_conv1d levels"] = _sha(conv_out, conv_pool)
    HV, H, K, V = 32, 16, 128, 128
    qg, kg, vg = rand(T, H, K), rand(T, H, K), rand(T, HV, V)
    g = -torch.rand(T, HV, generator=gen).to(device)
    beta = torch.rand(T, HV, generator=gen).to(torch.bfloat16).to(device)
    pool = torch.zeros(S, HV, K, V, dtype=torch.float32, device=device)
    o = torch.zeros(T, HV, V, dtype=torch.bfloat16, device=device)
    for level in plan.level_tables():
        chunk_gated_delta_rule(qg, kg, vg, g, beta, K**-0.5, pool, *level, True, o)
    out["gated_delta_rule levels"] = _sha(o, pool)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="checkout to run")
    parser.add_argument("--model", default="qwen3.5-4b")
    parser.add_argument("--workloads", nargs="+", default=["race", "multirc", "quality"])
    parser.add_argument("--out", default="digest.json")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two digests instead")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    tree = Path(args.tree).resolve()
    if not (tree / "flide_ext").is_dir() or not (tree / "benchmark" / "bench_decision.py").is_file():
        print(f"answer_digest.py: --tree {tree} holds no flide_ext and benchmark/bench_decision.py", file=sys.stderr)
        return 2
    # The checkout under test, ahead of anything installed.
    sys.path[:0] = [str(tree), str(tree / "benchmark"), str(tree / "benchmark" / "kernels")]
    global torch
    import torch

    if not torch.cuda.is_available():
        print("answer_digest.py: needs a CUDA device", file=sys.stderr)
        return 2
    import flide_ext
    from bench_decision import model_config, random_model, requests_for

    device = torch.device("cuda")
    config = model_config(args.model)
    model = random_model(config, torch.bfloat16, device, seed=0)
    t0 = time.perf_counter()
    engine = flide_ext.Engine(args.model, dtype=torch.bfloat16, device=device, model=model)
    entries, facts = {}, {"tree": str(tree), "flide_ext": flide_ext.__file__, "model": args.model,
                          "engine_start_s": time.perf_counter() - t0, "device": torch.cuda.get_device_name()}
    for workload in args.workloads:
        for vary in (False, True):
            for count in (1, 8) if workload == "quality" else (1, 8, 64):
                groups = requests_for(workload, count, config.vocab_size, 1.0, seed=count, vary=vary)
                for mode in ("off", "flat"):
                    engine.graphs.mode = mode
                    result = engine.run_round(groups)
                    answers = getattr(result, "answers", result)  # a RoundResult, or the old list
                    entries[f"{workload}{' varied' if vary else ''} x{count} {mode}"] = _hex(answers)
        print(f"{workload}: {len(entries)} entries", flush=True)
    with torch.inference_mode():
        for name, digest in kernel_entries(device).items():
            entries[f"kernel {name}"] = digest
    Path(args.out).write_text(json.dumps({"facts": facts, "entries": entries}))
    print(f"{len(entries)} entries written to {args.out} ({facts['flide_ext']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
