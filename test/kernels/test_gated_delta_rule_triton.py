"""The gated-delta-rule Triton kernels (recurrent, inter-chunk states, the whole-tree
pass) under the Triton interpreter (``TRITON_INTERPRET=1``) on the CPU against their
PyTorch references; fla-core's state-free steps by their references (the
interpreter's limits: test_triton_kernels.py)."""

import os

# conftest.py sets this before anything imports triton (triton.jit reads it at
# decoration time); kept here so the module also runs on its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.gated_delta_rule import recurrent_gated_delta_rule_ref  # noqa: E402
from flide_ext.kernels.gated_delta_rule.fla_steps import fla_available  # noqa: E402
from flide_ext.kernels.gated_delta_rule.recurrent_kernel import recurrent_gated_delta_rule_triton  # noqa: E402
from test.helpers.kernel_inputs import TREE_ROWS, segment_table, tree_levels  # noqa: E402


@pytest.mark.parametrize("H,HV,K,V", [(2, 2, 16, 16), (2, 4, 32, 48)])
def test_recurrent_gated_delta_rule_matches_reference(H, HV, K, V):
    gen = torch.Generator().manual_seed(7 + HV)
    T = 23
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    g = -torch.rand(T, HV, generator=gen)
    beta = torch.rand(T, HV, generator=gen)
    starts, lens, initial, final = segment_table()
    pools = [torch.full((6, HV, K, V), float("nan")) for _ in range(2)]
    outs = [torch.full((T, HV, V), float("nan")) for _ in range(2)]
    for fn, pool, out in zip((recurrent_gated_delta_rule_ref, recurrent_gated_delta_rule_triton), pools, outs):
        for level in (slice(0, 3), slice(3, 6)):
            fn(q, k, v, g, beta, K**-0.5, pool, starts[level], lens[level], initial[level], final[level], out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert not outs[1].isnan().any()
    written = final[final >= 0]
    torch.testing.assert_close(pools[1][written], pools[0][written], rtol=1e-5, atol=1e-5)
    # The empty segment (3) passes its parent's state through.
    torch.testing.assert_close(pools[1][3], pools[1][0], rtol=0, atol=0)


@pytest.mark.skipif(not (torch.cuda.is_available() and fla_available()),
                    reason="fla-core's chunked kernel does not run under TRITON_INTERPRET and fla is kept out of "
                    "CPU environments (importing it there breaks transformers' Qwen3.5); benchmark/kernels/check_kernels.py "
                    "covers it on the H200")
def test_fla_chunk_path_matches_reference():
    from flide_ext.kernels.gated_delta_rule.fla_steps import chunk_gated_delta_rule_fla

    gen = torch.Generator().manual_seed(9)
    T, H, HV, K, V = 23, 2, 4, 64, 64
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    g, beta = -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
    starts, lens, initial, final = segment_table()
    pool = torch.randn(6, HV, K, V, generator=gen)
    want = recurrent_gated_delta_rule_ref(q, k, v, g, beta, K**-0.5, pool.clone(), starts, lens, initial, final)
    got = chunk_gated_delta_rule_fla(*(x.cuda() for x in (q, k, v, g, beta)), K**-0.5, pool.cuda(), starts[:3].cuda(),
                                     lens[:3].cuda(), initial[:3].cuda(), final[:3].cuda())
    torch.testing.assert_close(got[:12].cpu(), want[:12], rtol=1e-3, atol=1e-3)


def test_chunk_states_matches_reference():
    """The inter-chunk step with forked states (own kernel beside fla's WY
    kernels on the GPU) against its reference: chunk states, corrected values and
    final states, with a sequence reading another's slot."""
    from flide_ext.kernels.gated_delta_rule import chunk_states_ref
    from flide_ext.kernels.gated_delta_rule.states_kernel import chunk_states_triton

    gen = torch.Generator().manual_seed(12)
    T, H, HV, K, V, C = 150, 2, 4, 32, 48, 16
    k = torch.randn(T, H, K, generator=gen)
    k = k / k.norm(dim=-1, keepdim=True)
    w = torch.randn(T, HV, K, generator=gen) * 0.1
    u = torch.randn(T, HV, V, generator=gen)
    g = -torch.rand(T, HV, generator=gen) * 0.1
    cu = torch.tensor([0, 70, 71, 150])
    g_cum = torch.zeros_like(g)
    offsets = [0]
    for n in range(3):
        for t0 in range(int(cu[n]), int(cu[n + 1]), C):
            t1 = min(t0 + C, int(cu[n + 1]))
            g_cum[t0:t1] = g[t0:t1].cumsum(0)
        offsets.append(offsets[-1] + -(-int(cu[n + 1] - cu[n]) // C))
    chunk_offsets = torch.tensor(offsets)
    initial, final = torch.tensor([-1, 0, 1]), torch.tensor([2, 3, -1])
    pool = torch.randn(4, HV, K, V, generator=gen)
    pools = [pool.clone(), pool.clone()]
    h_ref, v_ref = chunk_states_ref(k, w, u, g_cum, pools[0], cu, chunk_offsets, initial, final, C)
    h_got, v_got = chunk_states_triton(k, w, u, g_cum, pools[1], cu, chunk_offsets, initial, final, C)
    assert h_got.shape == (offsets[-1], HV, K, V)
    torch.testing.assert_close(h_got, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_got, v_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-5, atol=1e-5)


def test_empty_stream_passes_states_through():
    """A zero-length segment with a final slot copies its initial state, also
    when the stream has no rows at all."""
    from flide_ext.kernels.gated_delta_rule import chunk_states_ref
    from flide_ext.kernels.gated_delta_rule.states_kernel import chunk_states_triton

    q = torch.zeros(0, 2, 16)
    v, g, beta = torch.zeros(0, 2, 16), torch.zeros(0, 2), torch.zeros(0, 2)
    table = (torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), torch.tensor([1]))
    for fn in (recurrent_gated_delta_rule_ref, recurrent_gated_delta_rule_triton):
        pool = torch.stack([torch.ones(2, 16, 16), torch.zeros(2, 16, 16)])
        fn(q, q, v, g, beta, 0.25, pool, *table)
        assert torch.equal(pool[1], pool[0]), fn.__name__
    for fn in (chunk_states_ref, chunk_states_triton):
        pool = torch.stack([torch.ones(2, 16, 16), torch.zeros(2, 16, 16)])
        fn(q, torch.zeros(0, 2, 16), v, g, pool, torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([0]),
           torch.tensor([1]), 16)
        assert torch.equal(pool[1], pool[0]), fn.__name__


def _gdn_inputs(T, H, HV, K, V, gen):
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    g, beta = -torch.rand(T, HV, generator=gen) * 0.2, torch.rand(T, HV, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("H,HV,K,V", [(2, 4, 32, 48), (1, 2, 16, 16)])
def test_gdn_tree_matches_reference(monkeypatch, H, HV, K, V):
    """The whole-tree GPU path (state-free steps once over all segments, the own
    inter-chunk kernel level by level) against the level-by-level reference, with
    the state-free steps' references standing in for fla-core's kernels."""
    import flide_ext.kernels.gated_delta_rule as gd
    import flide_ext.kernels.gated_delta_rule.levels as gdl
    import flide_ext.kernels.gated_delta_rule.tree_kernel as gdt
    from flide_ext.kernels.gated_delta_rule import gated_delta_rule_tree_ref

    monkeypatch.setattr(gdt, "chunk_steps", gd.reference_steps)
    chunk_pass, real_pass = [], gdt._chunk_pass
    monkeypatch.setattr(gdt, "_chunk_pass", lambda meta, *a: chunk_pass.append(len(meta.levels)) or real_pass(meta, *a))
    gen = torch.Generator().manual_seed(14)
    T = TREE_ROWS
    q, k, v, g, beta = _gdn_inputs(T, H, HV, K, V, gen)
    pool = torch.zeros(8, HV, K, V)
    pool[5] = torch.randn(HV, K, V, generator=gen) * 0.1
    pools = [pool.clone(), pool.clone()]
    want = gated_delta_rule_tree_ref(q, k, v, g, beta, K**-0.5, pools[0], tree_levels())
    got = gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, K**-0.5, pools[1], tree_levels())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-4, atol=1e-4)
    # The empty segment's slot holds its parent's state; the third level read it.
    assert torch.equal(pools[1][4], pools[1][1])
    assert chunk_pass == [3]  # one chunk pass over all three levels, not the level-by-level fallback


def test_gdn_tree_with_rows_between_segments(monkeypatch):
    """Rows that belong to no segment send the tree level by level (no one varlen
    batch covers them); the result still equals the reference and those rows of
    ``out`` are left as they were."""
    import flide_ext.kernels.gated_delta_rule as gd
    import flide_ext.kernels.gated_delta_rule.levels as gdl
    import flide_ext.kernels.gated_delta_rule.tree_kernel as gdt
    from flide_ext.kernels.gated_delta_rule import gated_delta_rule_tree_ref

    monkeypatch.setattr(gdt, "chunk_steps", gd.reference_steps)
    t = torch.tensor
    levels = [(t([0]), t([40]), t([-1]), t([0])), (t([50, 60]), t([10, 5]), t([0, 0]), t([1, 2]))]
    assert gdt.tree_meta(levels) is None
    gen = torch.Generator().manual_seed(15)
    q, k, v, g, beta = _gdn_inputs(70, 2, 2, 16, 16, gen)
    outs = [torch.full((70, 2, 16), 7.0) for _ in range(2)]
    pools = [torch.zeros(3, 2, 16, 16) for _ in range(2)]
    gated_delta_rule_tree_ref(q, k, v, g, beta, 0.25, pools[0], levels, out=outs[0])
    gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, 0.25, pools[1], levels, out=outs[1])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[1][40:50], torch.full((10, 2, 16), 7.0))


def test_round_metadata_built_once_for_the_deepest_tree(monkeypatch):
    """Every layer of a round asks for the same per-level metadata; at the deepest
    tree allowed (16 levels) each table is still built once per round, not once
    per layer (each build waits for the device on a GPU)."""
    import flide_ext.kernels.causal_conv1d.kernel as conv
    import flide_ext.kernels.gated_delta_rule as gd
    import flide_ext.kernels.gated_delta_rule.levels as gdl
    import flide_ext.kernels.gated_delta_rule.tree_kernel as gdt
    from flide_ext.plan.tree import MAX_TREE_DEPTH

    monkeypatch.setattr(gdt, "chunk_steps", gd.reference_steps)
    builds = {"level": 0, "tree": 0, "blocks": 0}

    def counted(name, fn):
        return lambda *a, **kw: builds.__setitem__(name, builds[name] + 1) or fn(*a, **kw)

    monkeypatch.setattr(gdl, "_level_meta", counted("level", gdl._level_meta))
    monkeypatch.setattr(gdl, "_tree_meta", counted("tree", gdl._tree_meta))
    monkeypatch.setattr(conv, "_blocks", counted("blocks", conv._blocks))
    depth = MAX_TREE_DEPTH + 1
    t = torch.tensor
    levels = [(t([0]), t([20]), t([-1]), t([0]))]
    levels += [(t([20 + 3 * (i - 1)]), t([3]), t([i - 1]), t([i])) for i in range(1, depth)]
    T = 20 + 3 * (depth - 1)
    gen = torch.Generator().manual_seed(17)
    q, k, v, g, beta = _gdn_inputs(T, 1, 2, 16, 16, gen)
    x, w = torch.randn(T, 8, generator=gen), torch.randn(8, 4, generator=gen)
    for _layer in range(3):
        conv_pool, pool = torch.zeros(depth, 8, 3), torch.zeros(depth, 2, 16, 16)
        for level in levels:
            conv.causal_conv1d_triton(x, w, None, conv_pool, *level, "silu")
        gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, 0.25, pool, levels)
    assert builds == {"level": depth, "tree": 1, "blocks": depth}


def test_gdn_tree_strided_out_and_values(monkeypatch):
    """A strided ``out`` and strided (permuted) values are accepted on both the
    one-batch path and the level-by-level fallback, as by the reference."""
    import flide_ext.kernels.gated_delta_rule as gd
    import flide_ext.kernels.gated_delta_rule.levels as gdl
    import flide_ext.kernels.gated_delta_rule.tree_kernel as gdt
    from flide_ext.kernels.gated_delta_rule import gated_delta_rule_tree_ref

    gen = torch.Generator().manual_seed(18)
    q, k, _, g, beta = _gdn_inputs(TREE_ROWS, 2, 4, 16, 16, gen)
    v = torch.randn(4, TREE_ROWS, 16, generator=gen).transpose(0, 1)  # dense, not contiguous
    want = gated_delta_rule_tree_ref(q, k, v, g, beta, 0.25, torch.zeros(8, 4, 16, 16), tree_levels())
    for steps in (None, gd.reference_steps):
        if steps is not None:
            monkeypatch.setattr(gdt, "chunk_steps", steps)
        got = gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, 0.25, torch.zeros(8, 4, 16, 16), tree_levels())
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        out = torch.zeros(4, TREE_ROWS, 16).transpose(0, 1)
        gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, 0.25, torch.zeros(8, 4, 16, 16), tree_levels(), out=out)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_chunk_states_strided_inputs():
    """Dense but permuted WY factors: the kernel reads contiguous copies and
    writes its own (contiguous) outputs."""
    from flide_ext.kernels.gated_delta_rule import chunk_states_ref
    from flide_ext.kernels.gated_delta_rule.states_kernel import chunk_states_triton

    gen = torch.Generator().manual_seed(19)
    T, H, HV, K, V = 40, 1, 2, 16, 16
    k = torch.nn.functional.normalize(torch.randn(T, H, K, generator=gen), dim=-1)
    w = torch.randn(HV, T, K, generator=gen).transpose(0, 1) * 0.1
    u = torch.randn(HV, T, V, generator=gen).transpose(0, 1)
    g_cum = -torch.rand(T, HV, generator=gen).cumsum(0) * 0.01
    tables = (torch.tensor([0, T]), torch.tensor([0, 3]), torch.tensor([-1]), torch.tensor([0]))
    pools = [torch.zeros(1, HV, K, V) for _ in range(2)]
    want = chunk_states_ref(k, w, u, g_cum, pools[0], *tables, 16)
    got = chunk_states_triton(k, w, u, g_cum, pools[1], *tables, 16)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-5, atol=1e-5)


def test_chunk_forked_level_matches_reference(monkeypatch):
    """One level through the chunked GPU path (a one-level tree pass; the
    state-free steps' references standing in for fla-core) against the chunked
    reference, level after level, incl. the empty segment's pass-through."""
    import flide_ext.kernels.gated_delta_rule as gd
    import flide_ext.kernels.gated_delta_rule.levels as gdl
    import flide_ext.kernels.gated_delta_rule.tree_kernel as gdt
    from flide_ext.kernels.gated_delta_rule import chunk_gated_delta_rule_ref

    monkeypatch.setattr(gdt, "chunk_steps", gd.reference_steps)
    gen = torch.Generator().manual_seed(20)
    q, k, v, g, beta = _gdn_inputs(TREE_ROWS, 2, 4, 16, 16, gen)
    pools = [torch.zeros(8, 4, 16, 16) for _ in range(2)]
    pools[0][5] = pools[1][5] = torch.randn(4, 16, 16, generator=gen) * 0.1
    outs = [torch.zeros(TREE_ROWS, 4, 16) for _ in range(2)]
    for fn, pool, out in zip((chunk_gated_delta_rule_ref, gdt.chunk_gated_delta_rule_forked), pools, outs):
        for level in tree_levels():
            fn(q, k, v, g, beta, 0.25, pool, *level, out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(pools[1][4], pools[1][1])
