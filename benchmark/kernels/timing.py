"""How the kernel benchmarks time a call on the GPU (METHOD.md of the device
tool: events, warm-up, median of many; or the GPU kernels' own time alone)."""

from __future__ import annotations

import torch
import triton.testing


def median_ms(fn, rep: int = 200) -> float:
    """Median wall time of ``fn()`` in ms over ``rep`` ms of repeats (CUDA events,
    after 25 ms of warm-up); host gaps between launches count."""
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def device_ms(fn, iters: int = 10) -> float:
    """Summed time of the GPU kernels one call of ``fn`` launches (no host gaps), ms."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / iters / 1e3
