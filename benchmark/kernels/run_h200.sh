#!/usr/bin/env bash
# Everything issue 5 measures on the lent GPU, in one device call, each step
# under its own time limit and writing its files to $OUT as it goes:
#   bash scripts/fetch_gpu_wheels.sh            # here, once
#   run (carry .whl, timeout_s 600): bash benchmark/kernels/run_h200.sh [steps]
# steps (default all): check (250 s at most, without the 4B model), model4b (200), gdn (170), attention (110),
# states (90), tree (120).
set -uo pipefail
STEPS=${*:-check model4b gdn attention states tree}
want() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-results}
source scripts/gpu_site.sh
want check && timeout 250 python3 benchmark/kernels/check_kernels.py --skip-4b --out "$OUT/check_kernels.json" \
    > "$OUT/check_kernels.log" 2>&1
want model4b && timeout 200 python3 benchmark/kernels/check_kernels.py --only 4B --out "$OUT/check_4b.json" \
    > "$OUT/check_4b.log" 2>&1
want gdn && timeout 170 python3 benchmark/kernels/bench_gdn.py --out "$OUT/gdn.json" > "$OUT/bench_gdn.log" 2>&1
want attention && timeout 110 python3 benchmark/kernels/bench_fork_attention.py --out "$OUT/fork_attention.json" \
    > "$OUT/bench_fork_attention.log" 2>&1
want states && timeout 90 python3 benchmark/kernels/sweep_kernels.py --only states_vs_fla --out "$OUT/states_vs_fla.json" \
    > "$OUT/states_vs_fla.log" 2>&1
want tree && timeout 120 python3 benchmark/kernels/sweep_kernels.py --only states --out "$OUT/sweep_tree.json" \
    > "$OUT/sweep_tree.log" 2>&1
for f in check_kernels check_4b bench_gdn bench_fork_attention states_vs_fla sweep_tree; do
    [ -f "$OUT/$f.log" ] || continue
    echo "== $f"
    case $f in
        check_kernels|check_4b) grep -c PASS "$OUT/$f.log"; grep -v "^PASS" "$OUT/$f.log" | tail -8 ;;
        states_vs_fla) grep "^states" "$OUT/$f.log" ;;
        sweep_tree) grep "^gdn tree" "$OUT/$f.log" ;;
        *) tail -8 "$OUT/$f.log" ;;
    esac
done
