"""Hop stamps of a served request (hops/diag.patch writes one line per stamp: rid, name, time.time())
read back in time order and split at each HTTP arrival: the median time between successive stamps.
Usage: python analyze_stamps.py DIR  (the folder of stamps.PID files)."""
import glob, sys, collections, statistics
ev = []
for f in glob.glob(sys.argv[1] + "/stamps.*"):
    for line in open(f):
        parts = line.split()
        if len(parts) == 3:
            ev.append((float(parts[2]), parts[1]))
ev.sort()
cycles, cur = [], None
for t, n in ev:
    if n == "arrive":
        if cur: cycles.append(cur)
        cur = [(t, n)]
    elif cur is not None:
        cur.append((t, n))
if cur: cycles.append(cur)
pairs = collections.defaultdict(list)
total = []
for c in cycles:
    names = [n for _, n in c]
    if "made" not in names or "sentbody" not in names: continue
    for (t0, a), (t1, b) in zip(c, c[1:]):
        pairs[(a, b)].append((t1 - t0) * 1e3)
    total.append((c[-1][0] - c[0][0]) * 1e3)
n = len(total)
print(f"{n} request cycles; arrive -> last stamp p50 {statistics.median(total):.3f} ms")
for k, v in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
    if len(v) >= n * 0.3:
        print(f"{k[0]:>9} -> {k[1]:<9} n={len(v):4d} p50 {statistics.median(v):.3f} ms")
