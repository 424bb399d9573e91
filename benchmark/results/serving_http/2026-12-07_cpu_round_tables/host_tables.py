"""A graph round's host tables and their write into the round buffers (device_round with a capacity,
the replay's fast path), and plan_round, for a RACE-like (375 + 90) and a MultiRC-like (300 + 30 x 25)
round, on the CPU: python host_tables.py [-p] (-p: cProfile of the tables). Run with PYTHONPATH set to
the checkout to time (see README)."""
import cProfile, pstats, sys, time
import numpy as np, torch
from flide_ext.plan.flat import plan_round
from flide_ext.runtime.graph_runner import TableSpec
from flide_ext.runtime.round_buffers import RoundBuffers, device_round
from flide_ext.kernels.tables import TableCapacity

rng = np.random.default_rng(0)
def race():
    state = rng.integers(10, 1000, 375).tolist()
    return [0], [state + rng.integers(10, 1000, 90).tolist()]
def multirc():
    state = rng.integers(10, 1000, 300).tolist()
    qs = [state + rng.integers(10, 1000, 25).tolist() for _ in range(30)]
    return [0] * 30, qs
spec = TableSpec(4, 64)
for name, make, cap, ro in [("race", race, TableCapacity(480, 4, 3), 4), ("multirc", multirc, TableCapacity(1152, 36, 4), 36)]:
    reqs, prompts = make()
    plan = plan_round(reqs, prompts, "cpu")
    plan.assign_slots([0] + [-1] * (plan.num_segments - 1))
    plan.assign_kv_rows([], list(range(plan.num_tokens)), 5000)
    buf = RoundBuffers("cpu")
    device_round(plan, spec, "cpu", cap, ro, buf, device_plan=True)  # fixes the layout
    N = 300
    t0 = time.perf_counter()
    for _ in range(N):
        device_round(plan, spec, "cpu", cap, ro, buf, device_plan=False)
    t_tab = (time.perf_counter() - t0) / N * 1e3
    t0 = time.perf_counter()
    for _ in range(N):
        p = plan_round(reqs, prompts, "cpu")
    t_plan = (time.perf_counter() - t0) / N * 1e3
    print(f"{name}: tables+write {t_tab:.3f} ms, plan_round {t_plan:.3f} ms, segments {plan.num_segments}")
    if "-p" in sys.argv:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(200):
            device_round(plan, spec, "cpu", cap, ro, buf, device_plan=False)
        pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
