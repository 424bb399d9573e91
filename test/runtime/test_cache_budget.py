"""The state cache's budget (flide_ext/runtime/cache_budget.py): the sizes it
reckons with are the pools' real sizes, and the GPU default sets one round's
working pools aside before taking its share of the free memory."""

from __future__ import annotations

import pytest
import torch

from flide_ext import Engine
from flide_ext.runtime import cache_budget, model_runner
from flide_ext.runtime.capacity import RoundCapacity

GIB = 1 << 30


@pytest.mark.parametrize("family", ["qwen3_5", "llama"])
def test_row_and_slot_bytes_are_the_pools(tiny_dirs, family):
    # bfloat16 on the CPU keeps float32 recurrent states, as on the GPU.
    engine = Engine(str(tiny_dirs[family]), dtype="bfloat16", state_cache_bytes=1 << 20)
    runner = engine.runner
    row_bytes, slot_bytes = cache_budget.row_and_slot_bytes(runner.model, torch.bfloat16)
    assert row_bytes == runner.kv_pool.row_bytes > 0
    if family == "qwen3_5":
        pool = runner.state_pool
        assert slot_bytes == sum(r[0].nbytes + c[0].nbytes for r, c in zip(pool.recurrent, pool.conv)) > 0
    else:
        assert slot_bytes == 0 and runner.state_pool is None
    capacity = RoundCapacity()
    assert (cache_budget.round_working_bytes(runner.model, torch.bfloat16, capacity)
            == capacity.tokens * row_bytes + capacity.requests * slot_bytes)


def test_gpu_default_sets_the_round_aside(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    def mem_get_info(device):
        calls.append("mem_get_info")
        return 70 * GIB, 80 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    cuda = torch.device("cuda")
    assert cache_budget.default_cache_bytes(cuda, 13 * GIB) == int(0.4 * 57 * GIB)
    # What torch's allocator caches is handed back before the free memory is read.
    assert calls[:2] == ["empty_cache", "mem_get_info"]
    assert cache_budget.default_cache_bytes(cuda) == int(0.4 * 70 * GIB)
    assert cache_budget.default_cache_bytes(cuda, 71 * GIB) == 1 << 20  # nothing left: the least budget
    assert cache_budget.default_cache_bytes(torch.device("cpu"), 13 * GIB) == 256 << 20


def test_runner_default_budget_gets_the_round(tiny_dirs, monkeypatch):
    seen = []

    def default(device, working_bytes=0):
        seen.append((device.type, working_bytes))
        return 3 << 20

    monkeypatch.setattr(model_runner, "default_cache_bytes", default)
    capacity = RoundCapacity(tokens=1024, requests=16)
    engine = Engine(str(tiny_dirs["qwen3_5"]), dtype="bfloat16", round_capacity=capacity)
    row_bytes, slot_bytes = cache_budget.row_and_slot_bytes(engine.runner.model, torch.bfloat16)
    assert seen == [("cpu", 1024 * row_bytes + 16 * slot_bytes)]
    assert engine.state_cache_bytes == 3 << 20
