#!/usr/bin/env bash
# Same bits as an older checkout, on the lent GPU, in one device call per step,
# each step under its own time limit and writing its files to $OUT as it goes:
#   bash scripts/fetch_gpu_wheels.sh                       # here, once
#   git archive OLD_COMMIT flide_ext benchmark | tar -x -C .baseline   # the older checkout (ignored by git)
#   run (carry .whl and .baseline): bash benchmark/check_same_bits_h200.sh .baseline [steps]
# steps (default all): digest (answers and kernel outputs of both checkouts, compared bitwise; 540 s at most),
# graphs (check_graphs.py on this checkout; 420 s), kernels (check_kernels.py --skip-4b on both, values
# compared; 270 s each).
set -uo pipefail
OLD=${1:?usage: check_same_bits_h200.sh OLD_CHECKOUT [steps]}
shift
STEPS=${*:-digest graphs kernels}
want() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-results}
source scripts/gpu_site.sh
if want digest; then
    timeout 270 python3 benchmark/answer_digest.py --tree "$OLD" --out "$OUT/digest_old.json" > "$OUT/digest_old.log" 2>&1
    timeout 270 python3 benchmark/answer_digest.py --tree . --out "$OUT/digest_new.json" > "$OUT/digest_new.log" 2>&1
    python3 benchmark/answer_digest.py --compare "$OUT/digest_old.json" "$OUT/digest_new.json" > "$OUT/digest_compare.log" 2>&1
    tail -n 3 "$OUT/digest_old.log" "$OUT/digest_new.log"; tail -n 5 "$OUT/digest_compare.log"
fi
if want graphs; then
    timeout 420 python3 benchmark/check_graphs.py --model qwen3.5-4b --out "$OUT/graphs_check.json" \
        > "$OUT/graphs_check.log" 2>&1
    tail -n 3 "$OUT/graphs_check.log"
fi
if want kernels; then
    timeout 270 python3 "$OLD/benchmark/kernels/check_kernels.py" --skip-4b --out "$OUT/check_kernels_old.json" \
        > "$OUT/check_kernels_old.log" 2>&1
    timeout 270 python3 benchmark/kernels/check_kernels.py --skip-4b --out "$OUT/check_kernels.json" \
        > "$OUT/check_kernels.log" 2>&1
    python3 - "$OUT/check_kernels_old.json" "$OUT/check_kernels.json" <<'PY'
import json, sys
old, new = (json.load(open(p))["checks"] for p in sys.argv[1:])
timing = ("seconds",)
strip = lambda c: {k: v for k, v in c.items() if k not in timing}
same = sum(strip(a) == strip(b) for a, b in zip(old, new))
print(f"check_kernels: {sum(c['pass'] for c in new)}/{len(new)} pass; {same} of {len(old)} checks report the "
      f"same values as the older checkout's ({len(new)} now)")
for a, b in zip(old, new):
    if strip(a) != strip(b):
        print("DIFFERS", a["check"], "|", b["check"])
PY
fi
