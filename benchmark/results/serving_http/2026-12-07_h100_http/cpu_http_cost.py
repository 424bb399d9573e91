"""CPU seconds per request of a Flide server's processes over one bench_serving level (diagnostic, CPU box).

Made the model and started the server (from the checkout's root):
    .venv/bin/python -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from test.helpers.checkpoints import write_tiny_checkpoint; from flide_ext.assets.qwen35_tokenizer import write_qwen35_tokenizer; write_qwen35_tokenizer(write_tiny_checkpoint(Path('/tmp/hload/tiny'), 'llama', seed=1, vocab_size=248320))"
    OMP_NUM_THREADS=1 .venv/bin/python -m flide_ext.entrypoints.cli serve --model-path /tmp/hload/tiny --context-length 2000 --port 31000 &
then: python cpu_http_cost.py SERVER_PID CLIENTS PROMPTS SEED; the README has the figures.
"""
import json, resource, subprocess, sys, time
from pathlib import Path

import psutil
server_pid, clients, prompts, seed, extra = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
root = psutil.Process(server_pid)
procs = [root] + root.children(recursive=True)
def cpu():
    return {p.pid: sum(p.cpu_times()[:2]) for p in procs}
out = f"/tmp/hload/level_{clients}_{seed}.jsonl"
cmd = [sys.executable, str(Path(__file__).resolve().parents[4] / "benchmark" / "bench_serving_sglang.py"), "--backend", "decision-score", "--base-url",
       "http://127.0.0.1:31000", "--model", "/tmp/hload/tiny", "--dataset-name", "race_single", "--num-prompts", str(prompts),
       "--max-concurrency", str(clients), "--seed", str(seed), "--tag", "cpu", "--disable-tqdm", "--output-file", out, *extra]
a = cpu(); t0 = time.time()
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
b = cpu(); wall = time.time() - t0
line = [json.loads(l) for l in open(out)][-1]
n = line["completed"]
names = {root.pid: "http"}
for p in procs[1:]:
    names[p.pid] = "scheduler" if p.num_threads() > 1 and sum(p.cpu_times()[:2]) > 0.5 else f"child{p.pid}"
res = {names[pid]: round(1e3 * (b[pid] - a[pid]) / n, 3) for pid in a}
res["client_incl_startup"] = round(1e3 * ((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)) / n, 3)
print(json.dumps({"clients": clients, "requests": n, "p50_ms": round(line["median_e2e_latency_ms"], 2),
                  "req_per_s": round(line["request_throughput"], 1), "cpu_ms_per_request": res, "wall_s": round(wall, 1)}))
