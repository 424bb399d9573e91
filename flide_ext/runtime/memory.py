"""What an engine holds in memory, by part, in bytes (the ready line's figures)."""

from __future__ import annotations


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_bytes(runner) -> dict:
    """Bytes of a :class:`~.model_runner.ModelRunner`'s parts.

    Returns:
        ``weights`` (the model's parameters and buffers), ``cache`` (the state
        cache's K/V rows and GDN slots: its budget as allocated), ``states``
        (the rest of the K/V pool and the GDN state pool: one round's working
        rows and slots) and ``device_reserved`` (what torch's CUDA allocator
        holds on the runner's device, the graphs' pool included; 0 on the CPU).
    """
    import torch

    model = runner.model
    weights = _tensor_bytes(model.parameters()) + _tensor_bytes(model.buffers())
    pools = 0
    if runner.kv_pool is not None:
        pools += _tensor_bytes(runner.kv_pool.k) + _tensor_bytes(runner.kv_pool.v)
    if runner.state_pool is not None:
        pools += _tensor_bytes(runner.state_pool.recurrent) + _tensor_bytes(runner.state_pool.conv)
    row_bytes = runner.kv_pool.row_bytes if runner.kv_pool is not None else 0
    cache = runner.cache_rows * row_bytes + runner.cache_slots * runner.slot_bytes if runner.state_cache_bytes else 0
    cache = min(cache, pools)
    reserved = torch.cuda.memory_reserved(runner.device) if runner.device.type == "cuda" else 0
    return {"weights": weights, "states": pools - cache, "cache": cache, "device_reserved": reserved}
