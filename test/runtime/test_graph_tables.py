"""The flat-graph runtime's CPU-testable parts: kernel tables built on the host,
padded to a capacity; the tree-wide causal conv; the table-driven GDN pass; the
one-copy round buffers; the graph runner's capacities and its eager mode.

What a CUDA graph replays is exactly these tables and kernels over static
buffers; capture and replay themselves run on the H200
(``benchmark/kernels/check_graphs.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flide_ext.kernels.causal_conv1d import causal_conv1d_ref, causal_conv1d_tree, causal_conv1d_tree_ref
from flide_ext.kernels.causal_conv1d.kernel import causal_conv1d_tree_triton
from flide_ext.kernels.fork_attention.kernel import _build_metadata
from flide_ext.kernels.tables import TableCapacity, build_tables, conv_history, table_arrays
from flide_ext.plan.flat import Resume, plan_round
from flide_ext.runtime.graph_capacities import GraphCapacity, default_capacities, parse_capacities
from flide_ext.runtime.graph_runner import GraphRunner, TableSpec
from flide_ext.runtime.round_buffers import RoundBuffers, device_round, pad_plan
from test.helpers.plans import keep_parent_states


def _round(seed=3, state=70):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(3, 200, (state,), generator=gen).tolist()
    requests = [0, 0, 0, 0, 1]
    prompts = [base + [201], base + [202, 203, 204], base + [202, 203, 9, 9], base + [205] * 9, [7, 8, 9, 10, 11]]
    return requests, prompts


def _planned(model, requests, prompts, resume=None):
    plan = plan_round(requests, prompts, "cpu", resume)
    return keep_parent_states(plan) if model.num_gdn_layers else plan


def _pool(engine):
    pool = engine.state_pool
    if pool is not None and pool.capacity < 16:
        pool.allocate(16)
        pool.release(range(16))
    return pool


def test_attention_and_gdn_tables_match_the_round(tiny_dirs):
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs["qwen3_5"]))
    plan = _planned(engine.model, *_round())
    cap = TableCapacity(tokens=256, segments=16, levels=4)
    t = build_tables(plan, cap, conv_width=4, block_sizes=(16,))
    want = _build_metadata(plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len, 16)
    S, n = plan.num_segments, want[0]
    assert list(t["attention"]) == [16]
    NB, block_seg, block_row, starts, lens, own, path_kv, path_offset, path_len = t["attention"][16]
    assert NB == cap.blocks(16) and block_seg.shape == (NB,)
    assert torch.equal(block_seg[:n], want[1]) and torch.equal(block_row[:n], want[2])
    assert bool((block_seg[n:] == cap.segments).all())  # padding blocks name the padding segment
    for got, ref in zip((starts, lens, own, path_kv, path_offset, path_len), want[3:]):
        assert torch.equal(got[:S], ref)
        assert got.shape[0] == cap.segments + 1
    assert int(lens[S:].abs().sum()) == 0 and int(path_len[S:].abs().sum()) == 0
    # fla's chunk table: every real chunk once, in stream order, then padding.
    chunks = [(s, c) for s in range(S) for c in range(-(-int(plan.seg_len[s]) // 64))]
    assert t["chunk_indices"].shape == (cap.chunks, 2)
    assert t["chunk_indices"][: len(chunks)].tolist() == [list(p) for p in chunks]
    assert bool((t["chunk_indices"][len(chunks):, 0] == cap.segments).all())
    assert t["cu_seqlens"][: S + 1].tolist() == plan.seg_start.tolist() + [plan.num_tokens]
    # Levels: consecutive ranges of the segment table, then empty padding levels.
    ranges = t["level_range"].tolist()
    assert ranges[: plan.num_levels] == [[int(l.min()), int(l.max()) + 1] for l in plan.levels]
    assert all(a == b for a, b in ranges[plan.num_levels:])
    assert t["row_valid"].sum() == plan.num_tokens
    with pytest.raises(ValueError, match="does not fit"):
        build_tables(plan, TableCapacity(64, 16, 4), 4, 16)
    # The numpy arrays the round buffers copy are the same tables.
    arrays = table_arrays(plan, cap, conv_width=4, block_sizes=(16,))
    assert arrays.keys() == t.keys()
    for name, value in arrays.items():
        pairs = zip(value[16][1:], t[name][16][1:]) if name == "attention" else [(value, t[name])]
        for a, b in pairs:
            if isinstance(a, np.ndarray):
                assert torch.equal(torch.from_numpy(a), b), name
            else:
                assert a == b, name


def _conv_case():
    # Roots: one resumed from a checkpoint window (slot 5); a child of 2 rows;
    # its child, whose history reaches through the short parent into the root;
    # a 1-row root and its child (history partly zeros).
    parent, length, request = [-1, 0, 1, -1, 3], [10, 2, 5, 1, 3], [0, 0, 0, 1, 1]
    start = [0, 10, 12, 17, 18]
    return parent, length, request, start, 21


def test_conv_history_rows():
    parent, length, request, start, _ = _conv_case()
    hist = conv_history(parent, start, length, request, {0}, 4).tolist()
    assert hist == [[-2, -3, -4], [7, 8, 9], [9, 10, 11], [-1, -1, -1], [-1, -1, 17]]


def test_tree_conv_equals_level_conv_and_triton():
    """The tree-wide conv (history rows) gives the level-by-level conv's outputs
    and final windows; the Triton kernel (interpreted) gives the reference's."""
    parent, length, request, start, T = _conv_case()
    gen = torch.Generator().manual_seed(4)
    C, W = 40, 4
    x = torch.randn(T + 3, C, generator=gen)  # 3 padding rows
    weight, bias = torch.randn(C, W, generator=gen), torch.randn(C, generator=gen)
    pool = torch.randn(8, C, W - 1, generator=gen)
    pad = len(length)
    token_segment = torch.tensor([s for s in range(pad) for _ in range(length[s])] + [pad] * 3)
    seg_start, seg_len = torch.tensor(start + [T]), torch.tensor(length + [0])
    history = torch.cat([torch.tensor(conv_history(parent, start, length, request, {0}, W)), torch.full((1, W - 1), -1)])
    history_slot = torch.tensor([5, 5, 5, -1, -1, -1])
    final = torch.tensor([1, 2, 6, 3, 7, -1])
    pools = [pool.clone() for _ in range(3)]
    got = causal_conv1d_tree_ref(x, weight, bias, pools[0], token_segment, seg_start, seg_len, history, history_slot, final)
    levels = [[0, 3], [1, 4], [2]]
    initial = [5, 1, 2, -1, 3]
    want = torch.zeros_like(x)
    for segs in levels:
        pick = lambda values: torch.tensor([values[s] for s in segs])  # noqa: E731
        causal_conv1d_ref(x, weight, bias, pools[1], pick(start), pick(length), pick(initial), pick(final.tolist()),
                          out=want)
    assert torch.equal(got, want)
    assert torch.equal(pools[0], pools[1])
    fast = causal_conv1d_tree_triton(x, weight, bias, pools[2], *(t.int() for t in (token_segment, seg_start, seg_len,
                                                                                      history, history_slot, final)))
    torch.testing.assert_close(fast, got, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pools[2], pools[0], rtol=0, atol=0)
    assert bool((fast[T:] == 0).all())  # padding rows
    # Other tile shapes (the sweep's) and a strided input (the q/k/v columns of a
    # stacked projection): the same taps in the same order, the same outputs.
    import flide_ext.kernels.causal_conv1d.kernel as cct

    wide = torch.cat([x, torch.randn(T + 3, 7, generator=gen)], dim=1)[:, :C]
    for cfg in [(16, 32, 4), (8, 64, 2)]:
        monkey = cct.TREE_CONFIG
        cct.TREE_CONFIG = cfg
        try:
            other = causal_conv1d_tree_triton(wide, weight, bias, pool.clone(), *(t.int() for t in (
                token_segment, seg_start, seg_len, history, history_slot, final)))
        finally:
            cct.TREE_CONFIG = monkey
        assert torch.equal(other, fast)
    # Split outputs: the reference's are the columns, contiguous; the kernel stores
    # them so itself when the groups fall on its tile (16 channels here), and
    # copies them otherwise.
    tabs = [t.int() for t in (token_segment, seg_start, seg_len, history, history_slot, final)]
    for split in ([16, 16, 8], [8, 32], [40], [13, 20, 7]):
        want_parts = causal_conv1d_tree_ref(x, weight, bias, pool.clone(), token_segment, seg_start, seg_len, history,
                                            history_slot, final, split=split)
        assert [p.shape[1] for p in want_parts] == split and all(p.is_contiguous() for p in want_parts)
        assert torch.equal(torch.cat(want_parts, 1), got)
        monkey = cct.TREE_CONFIG
        cct.TREE_CONFIG = (16, 16, 4)
        try:
            parts = causal_conv1d_tree_triton(wide, weight, bias, pool.clone(), *tabs, split=split)
        finally:
            cct.TREE_CONFIG = monkey
        assert [p.shape for p in parts] == [p.shape for p in want_parts] and all(p.is_contiguous() for p in parts)
        assert torch.equal(torch.cat(parts, 1), fast)
    for bad in ([40, 1], [20, 10, 5, 5], [0, 40], [41], [16.0, 16, 8], torch.tensor([16, 16, 8])):
        with pytest.raises(ValueError, match="split"):
            causal_conv1d_tree(x, weight, bias, pool.clone(), token_segment, seg_start, seg_len, history,
                               history_slot, final, split=bad, backend="reference")
        with pytest.raises(ValueError, match="split"):
            causal_conv1d_tree(x, weight, bias, pool.clone(), *tabs, split=bad, backend="triton")


def test_tree_conv_rows_read_a_checkpoint_window_as_the_stream_rows_it_holds():
    """Rows whose taps reach into a checkpoint window (computed again after the
    tree kernel, by the per-segment edges kernel) give bit for bit what the same
    rows give when those inputs are stream rows of the round (the state computed
    cold), under several tile shapes; the final windows match too; every output
    matches the reference."""
    import flide_ext.kernels.causal_conv1d.kernel as cct

    W, C, P, Q = 4, 40, 10, 7
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(P + Q + 2, C, generator=gen).to(torch.bfloat16)  # 2 padding rows
    weight = torch.randn(C, W, generator=gen).to(torch.bfloat16)
    bias = torch.randn(C, generator=gen).to(torch.bfloat16)
    # Cold: the state P and its question Q in one round; Q's final window kept in slot 3.
    cold = [torch.tensor([0] * P + [1] * Q + [2, 2]), torch.tensor([0, P, P + Q]), torch.tensor([P, Q, 0]),
            torch.cat([torch.tensor(conv_history([-1, 0], [0, P], [P, Q], [0, 0], set(), W)), torch.full((1, 3), -1)]),
            torch.tensor([-1, -1, -1]), torch.tensor([-1, 3, -1])]
    # Resumed: Q alone, its root continuing the checkpoint window in slot 5 (P's last W-1 inputs).
    pool = torch.zeros(8, C, W - 1, dtype=torch.bfloat16)
    pool[5] = x[P - (W - 1):P].t()
    warm = [torch.tensor([0] * Q + [1, 1]), torch.tensor([0, Q]), torch.tensor([Q, 0]),
            torch.cat([torch.tensor(conv_history([-1], [0], [Q], [0], {0}, W)), torch.full((1, 3), -1)]),
            torch.tensor([5, -1]), torch.tensor([3, -1])]
    saved = cct.TREE_CONFIG
    results = []
    try:
        for config in [(16, 32, 4), (8, 64, 2), (4, 16, 1)]:
            cct.TREE_CONFIG = config
            pools = (pool.clone(), pool.clone())
            out_cold = causal_conv1d_tree_triton(x, weight, bias, pools[0], *(t.int() for t in cold))
            out_warm = causal_conv1d_tree_triton(x[P:], weight, bias, pools[1], *(t.int() for t in warm))
            assert torch.equal(out_warm[:Q], out_cold[P:P + Q]), config
            assert torch.equal(pools[1][3], pools[0][3]), config
            assert bool((out_cold[P + Q:] == 0).all()) and bool((out_warm[Q:] == 0).all())
            results.append((out_cold, out_warm))
    finally:
        cct.TREE_CONFIG = saved
    assert all(torch.equal(r[0], results[0][0]) and torch.equal(r[1], results[0][1]) for r in results)
    want = causal_conv1d_tree_ref(x[P:].float(), weight.float(), bias.float(), pool.float(), *warm)
    torch.testing.assert_close(results[0][1].float(), want, rtol=2e-2, atol=2e-2)


def _logprobs(model, plan, pool):
    with torch.inference_mode():
        return model(plan, pool)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3"])
def test_padded_round_gives_the_same_answers(tiny_dirs, family):
    """A round padded to a larger capacity (padding rows, spare segments and
    levels, padding readout rows) answers its questions with the same bits
    (reference kernels), and with the kernel tables through the Triton kernels
    (interpreted) the same as without padding."""
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs[family]))
    model, pool = engine.model, _pool(engine)
    plan = _planned(model, *_round())
    R = int(plan.readout_rows.numel())
    want = _logprobs(model, plan, pool)
    cap = TableCapacity(tokens=160, segments=12, levels=3)
    padded = device_round(plan, None, "cpu", cap, readouts=12)
    assert padded.num_tokens == 160 and padded.readout_rows.numel() == 12
    got = _logprobs(model, padded, pool)
    assert torch.equal(got[:R], want)
    assert torch.isfinite(got).all()
    spec = TableSpec.of(model, torch.float32)
    model.set_kernel_backend("triton")  # this engine's own model, for the rest of the test
    exact = _logprobs(model, device_round(plan, spec, "cpu"), pool)
    wide = _logprobs(model, device_round(plan, spec, "cpu", cap, 12), pool)
    torch.testing.assert_close(exact, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wide[:R], exact, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(wide).all()


def test_reused_buffers_forget_the_last_round(tiny_dirs):
    """Static buffers written by a large round and then a small one answer the
    small one as fresh buffers do (nothing stale is read), through the tables
    and Triton kernels (interpreted)."""
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs["qwen3_5"]))
    model, pool = engine.model, _pool(engine)
    spec = TableSpec.of(model, torch.float32)
    cap = TableCapacity(tokens=200, segments=12, levels=3)
    big = _planned(model, *_round(seed=5, state=120))
    small = _planned(model, [0, 0], [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11]])
    buffers = RoundBuffers("cpu")
    model.set_kernel_backend("triton")
    _logprobs(model, device_round(big, spec, "cpu", cap, 12, buffers), pool)
    reused = _logprobs(model, device_round(small, spec, "cpu", cap, 12, buffers), pool)
    fresh = _logprobs(model, device_round(small, spec, "cpu", cap, 12), pool)
    assert torch.equal(reused[:2], fresh[:2])
    with pytest.raises(ValueError, match="layout"):
        device_round(small, spec, "cpu", TableCapacity(tokens=100, segments=12, levels=3), 12, buffers)


@pytest.mark.parametrize("pooled", [False, True])
def test_write_padded_copies_the_bytes_of_the_padded_plan(pooled):
    """A graph round's fast path (each field padded in the pinned buffer, no
    padded or device plan built) writes byte for byte what padding the plan and
    writing it does, round after round into one layout: rounds with and without
    K/V pool rows, resumed from a checkpoint, of other sizes; and refuses what
    does not fit or has another layout."""
    spec = TableSpec(conv_width=4, block_sizes=(16,))
    cap, readouts = TableCapacity(tokens=200, segments=12, levels=3), 12

    def planned(requests, prompts, resume=None):
        plan = keep_parent_states(plan_round(requests, prompts, "cpu", resume))
        if pooled:
            prefix = sum(r.length for r in (resume or {}).values())
            plan.assign_kv_rows(torch.arange(1000, 1000 + prefix), torch.arange(10, 10 + plan.num_tokens), 999)
        return plan

    rounds = [planned(*_round(seed=5, state=120)), planned([0, 0], [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11]]),
              planned(*_round(seed=2, state=40))]
    if pooled:
        rounds.append(planned([0, 0, 1], [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [7, 8]], {0: Resume(2, 3, 0)}))
    slow, fast = RoundBuffers("cpu"), RoundBuffers("cpu")
    device_round(rounds[0], spec, "cpu", cap, readouts, fast)  # fixes the layout
    for plan in rounds:
        device_round(plan, spec, "cpu", cap, readouts, slow)
        assert device_round(plan, spec, "cpu", cap, readouts, fast, device_plan=False) is None
        # Every field's bytes (the alignment gaps between fields are never written).
        assert fast._views.keys() == slow._views.keys()
        for name, view in fast._views.items():
            assert torch.equal(view.view(torch.uint8), slow._views[name].view(torch.uint8)), name
    with pytest.raises(ValueError, match="does not fit"):
        device_round(rounds[0], spec, "cpu", TableCapacity(tokens=100, segments=12, levels=3), readouts, fast,
                     device_plan=False)
    other = RoundBuffers("cpu")
    device_round(rounds[1], spec, "cpu", TableCapacity(tokens=150, segments=12, levels=3), readouts, other)
    with pytest.raises(ValueError, match="layout"):
        device_round(rounds[1], spec, "cpu", cap, readouts, other, device_plan=False)
    with pytest.raises(ValueError, match="layout fixed"):
        RoundBuffers("cpu").write_padded(rounds[1], cap, readouts, {})


def test_pad_plan_refuses_what_does_not_fit(tiny_dirs):
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs["qwen3"]))
    plan = _planned(engine.model, *_round())
    with pytest.raises(ValueError, match="does not fit"):
        pad_plan(plan, TableCapacity(tokens=80, segments=12, levels=3), 12)
    with pytest.raises(ValueError, match="does not fit"):
        pad_plan(plan, TableCapacity(tokens=200, segments=12, levels=1), 12)
    resumed = plan_round([0], [[1, 2, 3, 4]], "cpu", {0: Resume(2, -1, 0)})
    with pytest.raises(ValueError, match="checkpoints"):
        pad_plan(resumed, TableCapacity(tokens=200, segments=12, levels=3), 12)


def test_capacities():
    caps = default_capacities(65536, 4096)
    assert caps[0] == GraphCapacity(256, 2, 2) and caps[-1] == GraphCapacity(65536, 4096)
    full = [c for c in caps if c.levels == 4]
    lean = [c for c in caps if c.levels == 2]
    assert full[0] == GraphCapacity(256, 8) and len(full) + len(lean) == len(caps)
    # One segment per 32 tokens: MultiRC's 31 segments per 1,050 tokens fit the
    # graph its tokens choose.
    assert all(c.segments == max(8, c.tokens // 32) for c in full[:-1])
    # Lean graphs (one segment per 128 tokens, 2 levels) up to 2,048 tokens,
    # beside the full graph of the same token capacity.
    assert [c.tokens for c in lean] == [c.tokens for c in full if c.tokens <= 2048]
    assert all(c.segments == max(2, c.tokens // 128) for c in lean)
    assert caps == sorted(caps, key=lambda c: (c.tokens, c.segments, c.levels))
    # The first capacity that holds a round (the runner's pick) is the lean one
    # for a single RACE question (465 tokens, one segment, one level) and for four
    # (735 tokens, five segments, two levels); MultiRC (1,050 tokens, 31 segments)
    # and three-level trees take the full graph.
    pick = lambda *size: next(c for c in caps if c.holds(*size))  # noqa: E731
    assert pick(465, 1, 1, 1) == GraphCapacity(480, 3, 2)
    assert pick(735, 5, 2, 4) == GraphCapacity(736, 5, 2)
    assert pick(1050, 31, 2, 30) == GraphCapacity(1152, 36)
    assert pick(465, 3, 3, 2) == GraphCapacity(480, 15)
    assert len(default_capacities(65536, 4096, lean_tokens=0)) == len(full)
    tokens = [c.tokens for c in full]
    # Each at most 2**(1/4) times the last (plus rounding to 64 rows): a round
    # pads at most ~19% of its tokens.
    assert all(b <= a * 2**0.25 + 64 and b > a for a, b in zip(tokens, tokens[1:]))
    assert all(t % 32 == 0 for t in tokens) and all(t % 64 == 0 for t in tokens if t > 1024)
    assert 40 <= len(full) <= 55
    # Up to 2,048 tokens each at most 2**(1/8) times the last, up to 1,024 at
    # most 2**(1/16) times (plus rounding to 32 rows): an agent step resumed
    # from the state cache (536 tokens in 13 segments, 3 levels, 10 readouts)
    # pads to 544 rows, not 576 or 640.
    small = [t for t in tokens if t <= 2048]
    assert all(b <= a * 2**0.125 + 64 for a, b in zip(small, small[1:]))
    finest = [t for t in tokens if t <= 1024]
    assert all(b <= a * 2**0.0625 + 32 for a, b in zip(finest, finest[1:]))
    assert pick(536, 13, 3, 10) == GraphCapacity(544, 17)
    assert all(c.segments <= 4096 for c in caps)
    assert [c.tokens for c in default_capacities(65536, 4096, step=2.0, lean_tokens=0, fine_tokens=0,
                                                                finest_tokens=0)] == [256 * 2**i for i in range(9)]
    assert default_capacities(100, 5) == [GraphCapacity(100, 5)]
    assert parse_capacities("512:32, 4096:256", levels=3) == [GraphCapacity(512, 32, 3), GraphCapacity(4096, 256, 3)]
    assert parse_capacities("512:32:2,1024:64") == [GraphCapacity(512, 32, 2), GraphCapacity(1024, 64, 4)]
    for bad in ("512", "512:0", "a:b", "512:32:0", "512:32:1:1", "", "+512:32", "1_024:64", "\u0665\u0661\u0662:32"):
        with pytest.raises(ValueError, match="graph capacity"):
            parse_capacities(bad)
    with pytest.raises(ValueError, match="levels must be"):
        parse_capacities("512:32", levels=0)
    assert GraphCapacity(512, 32, 2).holds(512, 32, 2, 32)
    assert not GraphCapacity(512, 32, 2).holds(512, 32, 3, 1)


def test_faster_graphs_stand_in_only_when_they_hold_every_round_and_save_time():
    """A larger graph stands in for a smaller one when it holds every round the
    smaller holds (tokens, segments and levels) and replays at least the margin
    faster; among several, the fastest (then the smallest) is chosen."""
    from flide_ext.runtime.graph_capacities import FASTER_MARGIN, faster_graphs

    small, lean_512, full_512, wide = (GraphCapacity(480, 3, 2), GraphCapacity(512, 4, 2), GraphCapacity(512, 16),
                                       GraphCapacity(544, 17))
    replay = {small: 10.0, lean_512: 9.5, full_512: 9.0, wide: 10.4}
    assert faster_graphs(replay) == {small: full_512, lean_512: full_512}
    # Fewer levels or segments than the graph it would replace: never a stand-in.
    assert faster_graphs({GraphCapacity(480, 15): 10.0, lean_512: 1.0}) == {}
    assert faster_graphs({GraphCapacity(480, 3, 3): 10.0, GraphCapacity(512, 4, 2): 1.0}) == {}
    # Within the margin (timing noise): the smaller one stays.
    assert faster_graphs({small: 10.0, lean_512: 10.0 * (1 - FASTER_MARGIN / 2)}) == {}
    assert faster_graphs({small: 10.0, lean_512: 10.0 * (1 - 2 * FASTER_MARGIN)}) == {small: lean_512}
    # Equal times: the smaller of the stand-ins.
    assert faster_graphs({small: 10.0, lean_512: 5.0, full_512: 5.0}) == {small: lean_512}
    assert faster_graphs({}) == {}


def test_runner_without_graphs_answers_as_the_engine(tiny_dirs):
    """The runner's eager mode (tables built on the host, kernels launched one by
    one) gives the engine's answers; graph modes need a CUDA device."""
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs["qwen3_5"]))
    model, pool = engine.model, _pool(engine)
    plan = _planned(model, *_round())
    runner = GraphRunner(model, pool, default_capacities(1024, 64), mode="off")
    with torch.inference_mode():
        got, capacity = runner.run(plan)
    assert capacity is None and runner.eager_rounds == 1
    # It stops at the normed readout rows; the LM head after it gives the engine's log-probabilities.
    assert got.shape == (int(plan.readout_rows.numel()), model.lm_head.weight.shape[1])
    assert torch.equal(model.head_logprobs(got), _logprobs(model, plan, pool))
    with pytest.raises(ValueError, match="graph mode"):
        GraphRunner(model, pool, [], mode="sometimes")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Engine(str(tiny_dirs["qwen3_5"]), cuda_graphs="flat")
    with pytest.raises(ValueError, match="cuda_graphs"):
        Engine(str(tiny_dirs["qwen3_5"]), cuda_graphs="always")
    with pytest.raises(ValueError, match="graph_capacities only apply"):
        Engine(str(tiny_dirs["qwen3_5"]), graph_capacities=[GraphCapacity(512, 32)])


def test_graphs_need_triton_kernels_and_fla_for_gdn(tiny_dirs):
    """Graphs are only captured where every kernel can run inside one: not with
    the reference backend (it reads tables on the host), not for GDN models
    without fla-core (the levels are then sized on the host)."""
    from flide_ext import Engine
    from flide_ext.kernels.gated_delta_rule.fla_steps import fla_available
    from flide_ext.runtime.graph_runner import graphs_supported

    hybrid, dense = Engine(str(tiny_dirs["qwen3_5"])).model, Engine(str(tiny_dirs["qwen3"])).model
    assert graphs_supported(dense)
    assert graphs_supported(hybrid) == fla_available()
    dense.set_kernel_backend("reference")
    assert not graphs_supported(dense)
    assert GraphRunner(dense, None, [GraphCapacity(256, 16)], mode="flat").mode == "off"


def test_round_buffers_copy_any_dtype():
    """The pinned buffer's numpy views take every dtype, bfloat16 (which numpy
    lacks) as its bytes."""
    from dataclasses import replace

    from flide_ext.runtime.round_buffers import RoundBuffers

    plan = plan_round([0], [[1, 2, 3]], "cpu")
    buffers = RoundBuffers("cpu")
    for shift in (0.5, -1.25):
        odd = replace(plan, positions=plan.positions.to(torch.bfloat16) + shift,
                      seg_depth=plan.seg_depth >= 0, token_ids=plan.token_ids.to(torch.uint8) + 1)
        out = buffers.write(odd, with_levels=False)
        for name in ("positions", "seg_depth", "token_ids", "seg_start"):
            got, want = getattr(out, name), getattr(odd, name)
            assert got.dtype == want.dtype and torch.equal(got, want), name


def test_tables_hold_every_block_size_the_attention_layers_need(tiny_dirs):
    """A model whose attention layers use two ForkAttention tile shapes (Gemma 4's
    16- and 32-wide test heads in bf16) gets tables for both block sizes, each
    what the kernel builds for itself from the round; a layer whose block size
    the tables lack is refused rather than given another's tables."""
    from flide_ext import Engine
    from flide_ext.assets.random_checkpoints import random_model
    from flide_ext.kernels.fork_attention import tokens_per_block
    from flide_ext.kernels.fork_attention.kernel import fork_attention_triton
    from test.helpers.checkpoints import tiny_config

    gemma = random_model(tiny_config("gemma4"), torch.bfloat16, "cpu")
    sizes = (tokens_per_block(16, torch.bfloat16, 2), tokens_per_block(32, torch.bfloat16, 4))
    assert sizes[0] != sizes[1]
    spec = TableSpec.of(gemma, torch.bfloat16)
    assert spec.block_sizes == tuple(sorted(sizes))
    assert TableSpec.of(gemma, torch.float32).block_sizes == (32,)  # float32 tiles do not depend on the head
    qwen = random_model(tiny_config("qwen3_5"), torch.bfloat16, "cpu")
    assert TableSpec.of(qwen, torch.bfloat16).block_sizes == (tokens_per_block(32, torch.bfloat16, 2),)

    plan = _planned(Engine(str(tiny_dirs["qwen3_5"])).model, *_round())
    cap = TableCapacity(tokens=256, segments=16, levels=4)
    t = build_tables(plan, cap, conv_width=4, block_sizes=spec.block_sizes)
    assert sorted(t["attention"]) == sorted(sizes)
    for size in sizes:
        want = _build_metadata(plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
                               size)
        NB, block_seg, block_row = t["attention"][size][:3]
        assert NB == cap.blocks(size) and torch.equal(block_seg[:want[0]], want[1])
        assert torch.equal(block_row[:want[0]], want[2])
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(plan.num_tokens, h, 16, generator=gen) for h in (4, 1, 1))
    args = (q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.positions, 0.25)
    with pytest.raises(ValueError, match="not this layer's 32"):
        fork_attention_triton(*args, tables={64: t["attention"][sizes[0]]})
