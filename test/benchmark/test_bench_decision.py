"""benchmark/bench_decision.py end to end on CPU with a tiny model (smoke scale)."""

from __future__ import annotations

import json
import subprocess
import sys

from test.helpers import ROOT
from test.helpers.processes import main_in_process

SCRIPT = ROOT / "benchmark" / "bench_decision.py"


def test_bench_decision_runs_every_method(tmp_path):
    out, plot = tmp_path / "d.jsonl", tmp_path / "d.png"
    run = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny-qwen3.5", "--device", "cpu", "--dtype",
                          "float32", "--workloads", "multirc", "--scale", "0.1", "--concurrency", "1", "2",
                          "--latency-iters", "1", "--rounds", "1", "--vary", "--out", str(out), "--plot", str(plot)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    roofline = [r for r in rows if r["kind"] == "roofline"]
    methods = {r["method"]: r for r in rows if r["kind"] == "method"}
    assert len(roofline) == 1 and roofline[0]["floor_ms"] > 0 and roofline[0]["prefill_alone_ms"] > 0
    assert set(methods) == {"flide", "no_fork", "prefix_cache", "full_readout", "hf"}
    # CUDA graphs cannot run on the CPU: those methods are recorded as skipped, with the reason.
    skipped = {r["method"]: r["reason"] for r in rows if r["kind"] == "skipped"}
    assert set(skipped) == {"no_graphs", "per_shape_graphs"} and all("CUDA" in r for r in skipped.values())
    # Flide computes each state once; one sequence per question recomputes it.
    assert methods["flide"]["stream_tokens"] < methods["no_fork"]["stream_tokens"] == methods["flide"]["prompt_tokens"]
    assert all(r["qps_c1"] > 0 and r["p50_ms"] > 0 for r in methods.values())
    assert "qps_c2" in methods["flide"] and "qps_c2" not in methods["hf"]
    assert plot.stat().st_size > 0 and "roofline" in run.stdout


def test_bench_decision_bad_arguments():
    cases = (["--models", "gpt-5"], ["--concurrency", "0"], ["--scale", "2"], ["--device", "meta"],
             ["--out", "/no/such/dir/x.jsonl"], ["--plot", "/no/such/dir/x.png"])
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", *cases[0]], capture_output=True, text=True,
                         timeout=300)  # as a user runs it
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, (cases[0], run.stderr)
    main = _script_main("bench_decision")
    for args in cases[1:]:
        run = main_in_process(main, "--device", "cpu", *args)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, (args, run.stderr)


def _script_main(name: str):
    # A benchmark script's main(), imported as its own directory's module (as it imports its siblings).
    import importlib

    sys.path.insert(0, str(ROOT / "benchmark"))
    try:
        return importlib.import_module(name).main
    finally:
        sys.path.remove(str(ROOT / "benchmark"))


def test_profile_round_smoke(tmp_path):
    """benchmark/profile_round.py on CPU: the eager forward's operators by time."""
    script = ROOT / "benchmark" / "profile_round.py"
    out = tmp_path / "p.json"
    run = subprocess.run([sys.executable, str(script), "--model", "tiny-qwen3.5", "--device", "cpu", "--dtype",
                          "float32", "--scale", "0.1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["stream_tokens"] > 0 and report["kernels"][0]["total_us"] > 0
    times = [k["total_us"] for k in report["kernels"]]
    assert times == sorted(times, reverse=True)
    bad = main_in_process(_script_main("profile_round"), "--model", "gpt-5", "--device", "cpu")
    assert bad.returncode == 2 and "unknown model" in bad.stderr
    # A loaded round: three requests' trees in one flat stream; then a round of load
    # (run_rounds, its requests normalised over their labels as the server's are).
    multi = main_in_process(_script_main("profile_round"), "--model", "tiny-qwen3.5", "--device", "cpu", "--dtype",
                            "float32", "--scale", "0.1", "--requests", "3", "--load-rounds", "1",
                            "--state-cache-gb", "0.125", "--out", str(out))
    assert multi.returncode == 0, multi.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["state_cache_bytes"] == 2**27  # the engine got the budget given
    sys.path.insert(0, str(ROOT / "benchmark"))
    try:
        from bench_decision import model_config, requests_for
    finally:
        sys.path.remove(str(ROOT / "benchmark"))
    from flide_ext.plan.tree import build_prefix_tree
    from flide_ext.runtime.rounds import tree_size

    profiled = requests_for("race", 7, model_config("tiny-qwen3.5").vocab_size, 0.1)[3:6]
    trees = [tree_size(build_prefix_tree([0] * len(prompts), prompts)).tokens for prompts, _ in profiled]
    assert report["requests"] == 3 and report["stream_tokens"] == sum(trees)
    assert "load: 1 x 64 race requests" in multi.stdout
    too_many = main_in_process(_script_main("profile_round"), "--model", "tiny-qwen3.5", "--device", "cpu",
                               "--scale", "0.1", "--requests", "300")  # more requests than a round holds
    assert too_many.returncode == 2 and len(too_many.stderr.strip().splitlines()) == 1
    assert "does not fit one round" in too_many.stderr
    bad = main_in_process(_script_main("profile_round"), "--model", "tiny-qwen3.5", "--device", "cpu",
                          "--requests", "0")
    assert bad.returncode == 2 and "--requests" in bad.stderr
    bad = main_in_process(_script_main("profile_round"), "--model", "tiny-qwen3.5", "--device", "cpu",
                          "--state-cache-gb", "-2")
    assert bad.returncode == 2 and "--state-cache-gb" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # An agent step resumed from the state cache: only the new history and criteria are computed.
    agent = subprocess.run([sys.executable, str(script), "--model", "tiny-qwen3.5", "--device", "cpu", "--dtype",
                            "float32", "--agent", "200:70", "--out", str(out)], capture_output=True, text=True,
                           timeout=300)
    assert agent.returncode == 0, agent.stderr[-2000:]
    report = json.loads(out.read_text())
    assert "(256 resumed from the state cache)" in agent.stdout  # step 1 left 270 tokens: cut at 256
    # Step 2: a 340-token history (256 resumed) and 10 criteria of 30 tokens, some of
    # which may share first tokens (a small vocabulary) and be merged.
    assert report["workload"] == "agent 200+70" and 300 < report["stream_tokens"] <= 340 - 256 + 10 * 30
    bad = main_in_process(_script_main("profile_round"), "--model", "tiny-qwen3.5", "--device", "cpu", "--agent", "8k")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--agent" in bad.stderr


def test_bench_overlap_smoke(tmp_path):
    """benchmark/bench_overlap.py on CPU: the same rounds one at a time and
    overlapped, every answer compared (none differs), both rates recorded."""
    out = tmp_path / "o.json"
    run = main_in_process(_script_main("bench_overlap"), "--model", "tiny-qwen3.5", "--device", "cpu", "--dtype",
                          "float32", "--workload", "multirc:3", "race_single:2:3", "--rounds", "2", "--passes", "1",
                          "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["workload"], r["requests"], r["rounds"]) for r in runs] == [("multirc", 3, 2), ("race_single", 2, 3)]
    for r in runs:
        assert r["rounds_differing"] == 0
        assert all(r["questions_per_s"][k] > 0 for k in ("one_at_a_time", "overlapped"))
    for bad_args in (["--passes", "0"], ["--workload", "race:0"], ["--workload", "nope"], ["--model", "gpt-5"]):
        bad = main_in_process(_script_main("bench_overlap"), "--device", "cpu", *bad_args)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, (bad_args, bad.stderr)
