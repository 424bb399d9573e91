import glob, os, sys, collections, statistics, subprocess, re
def hops(dirs):
    spans = collections.defaultdict(list); outside = []
    chain = "arrive body handler encoded sized made msent recv put ran sent mrecv setres resumed scored waited built staged startsend sentbody".split()
    for d in dirs:
        ev = []
        for f in glob.glob(d + "/stamps.*"):
            for line in open(f):
                p = line.split()
                if len(p) == 3: ev.append((float(p[2]), p[1]))
        ev.sort(); cycles, cur = [], None
        for t, n in ev:
            if n == "arrive":
                if cur: cycles.append(cur)
                cur = [(t, n)]
            elif cur is not None: cur.append((t, n))
        if cur: cycles.append(cur)
        for c in cycles[20:]:
            first = {}
            for t, n in c:
                if n not in first or n == "sentbody": first[n] = t
            if not all(n in first for n in ("arrive", "put", "ran", "sentbody")): continue
            have = [n for n in chain if n in first]
            for a, b in zip(have, have[1:]): spans[(a, b)].append((first[b] - first[a]) * 1e3)
            outside.append(((first["sentbody"] - first["arrive"]) - (first["ran"] - first["put"])) * 1e3)
    return chain, spans, outside
A = sorted(glob.glob(os.environ.get("WORK", "/tmp/hopsrun") + f"/ab/{sys.argv[1]}.*")); B = sorted(glob.glob(os.environ.get("WORK", "/tmp/hopsrun") + f"/ab/{sys.argv[2]}.*"))
chain, sa, oa = hops(A); _, sb, ob = hops(B)
print(f"{'hop':>22} {sys.argv[1]:>8} {sys.argv[2]:>8}")
for a, b in zip(chain, chain[1:]):
    if (a, b) in sa and (a, b) in sb:
        print(f"{a:>9} -> {b:<9} {statistics.median(sa[(a,b)]):8.3f} {statistics.median(sb[(a,b)]):8.3f}")
print(f"{'outside the round':>22} {statistics.median(oa):8.3f} {statistics.median(ob):8.3f}  (n {len(oa)}, {len(ob)})")
if len(sys.argv) > 3:
    import json
    out = {"runs": {sys.argv[1]: len(A), sys.argv[2]: len(B)}, "requests": {sys.argv[1]: len(oa), sys.argv[2]: len(ob)},
           "outside_round_p50_ms": {sys.argv[1]: round(statistics.median(oa), 3), sys.argv[2]: round(statistics.median(ob), 3)},
           "hops_p50_ms": {f"{a}->{b}": {sys.argv[1]: round(statistics.median(sa[(a, b)]), 3), sys.argv[2]: round(statistics.median(sb[(a, b)]), 3)}
                           for a, b in zip(chain, chain[1:]) if (a, b) in sa and (a, b) in sb},
           "per_run_outside_p50_ms": {name: [round(statistics.median(hops([d])[2]), 3) for d in dirs] for name, dirs in ((sys.argv[1], A), (sys.argv[2], B))}}
    json.dump(out, open(sys.argv[3], "w"), indent=1)
