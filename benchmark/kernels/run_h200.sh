#!/usr/bin/env bash
# Everything issue 5 measures on the lent GPU, in one device call, each step
# under its own time limit and writing its files to $OUT as it goes:
#   bash scripts/fetch_gpu_wheels.sh            # here, once
#   run (carry .whl, timeout_s 600): bash benchmark/kernels/run_h200.sh   # steps: 280 + 140 + 110 + 50 s at most
set -uo pipefail
OUT=${OUT:-results}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt"
timeout 280 python3 benchmark/kernels/check_kernels.py --out "$OUT/check_kernels.json" > "$OUT/check_kernels.log" 2>&1
timeout 140 python3 benchmark/kernels/bench_gdn.py --out "$OUT/gdn.json" > "$OUT/bench_gdn.log" 2>&1
timeout 110 python3 benchmark/kernels/bench_fork_attention.py --out "$OUT/fork_attention.json" \
    > "$OUT/bench_fork_attention.log" 2>&1
timeout 50 python3 benchmark/kernels/sweep_kernels.py --only states_vs_fla --out "$OUT/states_vs_fla.json" \
    > "$OUT/states_vs_fla.log" 2>&1
grep -c PASS "$OUT/check_kernels.log"; grep -v "^PASS" "$OUT/check_kernels.log" | tail -5
tail -6 "$OUT/bench_gdn.log"; tail -4 "$OUT/bench_fork_attention.log"; grep "^states" "$OUT/states_vs_fla.log"
