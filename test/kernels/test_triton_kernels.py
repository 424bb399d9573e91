"""Flide's Triton kernels under the Triton interpreter (``TRITON_INTERPRET=1``) on
the CPU, each against its PyTorch reference on small shapes.

The interpreter runs float32 tiles through NumPy (its bf16 ``tl.dot`` gives
garbage in triton 3.8, so these tests stay in float32); the same kernels are checked in
bf16 on the H200 by ``benchmark/kernels/check_kernels.py`` (results in
``benchmark/results/``). fla-core's chunked kernel, which the GPU path also uses,
does not run under the interpreter (tried here: only fla's fused recurrent kernel
does) and is kept out of CPU environments; it is covered by that GPU run.
"""

import os
from functools import partial

# conftest.py sets this before anything imports triton (triton.jit reads it at
# decoration time); kept here so the module also runs on its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels import dispatch  # noqa: E402
from flide_ext.kernels.causal_conv1d import causal_conv1d, causal_conv1d_ref  # noqa: E402
from flide_ext.kernels.causal_conv1d.kernel import causal_conv1d_triton  # noqa: E402
from flide_ext.kernels.fork_attention import fork_attention, fork_attention_ref  # noqa: E402
from flide_ext.kernels.fork_attention.kernel import fork_attention_triton  # noqa: E402
from flide_ext.kernels.fork_attention.paths import PATH_DEPTH, path_tables  # noqa: E402
from flide_ext.kernels.gated_delta_rule import recurrent_gated_delta_rule_ref  # noqa: E402
from flide_ext.kernels.gated_delta_rule.fla_steps import fla_available  # noqa: E402
from flide_ext.kernels.gated_delta_rule.recurrent_kernel import recurrent_gated_delta_rule_triton  # noqa: E402
from flide_ext.plan.flat import Resume, plan_round  # noqa: E402


def _attention_args(plan, Hq, Hkv, D, DV, gen, prefix=0):
    T = plan.num_tokens
    q = torch.randn(T, Hq, D, generator=gen)
    k = torch.randn(prefix + T, Hkv, D, generator=gen)
    v = torch.randn(prefix + T, Hkv, DV, generator=gen)
    return (q, k, v, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.kv_positions, D**-0.5)


def _prompts(gen, requests=3):
    prompts, owners = [], []
    for r in range(requests):
        state = torch.randint(0, 50, (int(torch.randint(1, 90, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
            n = int(torch.randint(1, 9, (1,), generator=gen))  # 1-token questions included
            prompts.append(state + (100 + torch.randint(0, 50, (n,), generator=gen)).tolist())
            owners.append(r)
    return owners, prompts


@pytest.mark.parametrize("Hq,Hkv,D,DV,window", [(4, 2, 16, 16, None), (2, 2, 24, 16, None), (6, 2, 32, 32, 7)])
def test_fork_attention_matches_reference(Hq, Hkv, D, DV, window):
    gen = torch.Generator().manual_seed(Hq * 100 + D)
    owners, prompts = _prompts(gen)
    plan = plan_round(owners, prompts)
    args = _attention_args(plan, Hq, Hkv, D, DV, gen)
    got = fork_attention_triton(*args, sliding_window=window)
    want = fork_attention_ref(*args, sliding_window=window)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fork_attention_resumed_from_checkpoint_keys():
    gen = torch.Generator().manual_seed(3)
    state = list(range(1, 41))
    prompts = [state + [60, 61, 62], state + [70]]
    plan = plan_round([0, 0], prompts, resume={0: Resume(length=30, slot=-1, kv_start=5)})
    args = _attention_args(plan, 4, 2, 16, 16, gen, prefix=plan.num_prefix_rows)
    torch.testing.assert_close(fork_attention_triton(*args), fork_attention_ref(*args), rtol=1e-5, atol=1e-5)


def test_fork_attention_empty_and_one_token_segments():
    # Hand-made table: segment 1 is empty (no rows, no keys) between its parent
    # and a 1-token child; segment 3 is a 1-token root.
    gen = torch.Generator().manual_seed(4)
    seg_parent = torch.tensor([-1, 0, 1, -1])
    seg_start = torch.tensor([0, 5, 5, 6])
    seg_len = torch.tensor([5, 0, 1, 1])
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 0])
    q = torch.randn(7, 2, 16, generator=gen)
    k = torch.randn(7, 1, 16, generator=gen)
    v = torch.randn(7, 1, 16, generator=gen)
    args = (q, k, v, seg_parent, seg_start, seg_len, seg_start, seg_len, positions, positions, 0.25)
    got = fork_attention_triton(*args)
    torch.testing.assert_close(got, fork_attention_ref(*args), rtol=1e-5, atol=1e-5)
    # The 1-token root sees only itself: its output is its own value.
    torch.testing.assert_close(got[6, 0], v[6, 0], rtol=1e-6, atol=1e-6)


def test_fork_attention_alone_equals_forked_bitwise():
    """A question's rows get the same bits alone (state and question in one
    segment) as forked from the state among other requests' segments."""
    gen = torch.Generator().manual_seed(5)
    state = torch.randint(0, 50, (77,), generator=gen).tolist()
    questions = [[101, 102, 103], [104], [105, 106, 107, 108, 109]]
    other = torch.randint(0, 50, (40,), generator=gen).tolist()
    forked = plan_round([0, 1, 1, 1], [other + [1, 2], *[state + qn for qn in questions]])
    T = forked.num_tokens
    Hq, Hkv, D = 4, 2, 16
    # Keys and queries are functions of (token id, position), as in a model.
    table_q = torch.randn(200, 400, Hq, D, generator=gen)
    table_k = torch.randn(200, 400, Hkv, D, generator=gen)
    table_v = torch.randn(200, 400, Hkv, D, generator=gen)

    def run(plan):
        ids, pos = plan.token_ids, plan.positions
        return fork_attention_triton(
            table_q[ids, pos], table_k[ids, pos], table_v[ids, pos], plan.seg_parent, plan.seg_start, plan.seg_len,
            plan.seg_kv_start, plan.seg_kv_len, plan.positions, plan.kv_positions, D**-0.5,
        )

    out = run(forked)
    assert T == len(other) + 2 + len(state) + sum(map(len, questions))
    for i, qn in enumerate(questions):
        alone = plan_round([0], [state + qn])
        got_alone = run(alone)[-len(qn):]
        end = forked.readout_rows[forked.prompt_readout[i + 1]] + 1
        got_forked = out[end - len(qn) : end]
        assert torch.equal(got_alone, got_forked), f"question {i} differs"


def test_path_tables_refuse_deep_paths():
    parent = torch.arange(-1, PATH_DEPTH)  # a chain of PATH_DEPTH + 1 segments
    ones = torch.ones(PATH_DEPTH + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="at most"):
        path_tables(parent, torch.arange(PATH_DEPTH + 1), ones)
    kv, offset, count, own = path_tables(parent[:-1], torch.arange(PATH_DEPTH), ones[:-1])
    assert own.tolist() == list(range(PATH_DEPTH))
    assert count[-1].tolist() == [1] * PATH_DEPTH and offset[-1].tolist() == list(range(PATH_DEPTH))


def _segment_table():
    # Level of roots (one shorter than the conv history) then a level of children.
    starts = torch.tensor([0, 9, 11, 12, 12, 19])
    lens = torch.tensor([9, 2, 1, 0, 7, 4])
    parent_slot = torch.tensor([-1, -1, -1, 0, 1, 2])
    slot = torch.tensor([0, 1, 2, 3, -1, 4])
    return starts, lens, parent_slot, slot


@pytest.mark.parametrize("bias,activation", [(False, "silu"), (True, None)])
def test_causal_conv1d_matches_reference(bias, activation):
    gen = torch.Generator().manual_seed(6)
    T, C, W = 23, 150, 4
    x = torch.randn(T, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    starts, lens, initial, final = _segment_table()
    pools = [torch.full((6, C, W - 1), float("nan")) for _ in range(2)]
    outs = [torch.full((T, C), float("nan")) for _ in range(2)]
    for fn, pool, out in zip((causal_conv1d_ref, causal_conv1d_triton), pools, outs):
        for level in (slice(0, 3), slice(3, 6)):
            fn(x, weight, b, pool, starts[level], lens[level], initial[level], final[level], activation, out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert not outs[1].isnan().any()
    written = final[final >= 0]
    torch.testing.assert_close(pools[1][written], pools[0][written], rtol=0, atol=0)


@pytest.mark.parametrize("H,HV,K,V", [(2, 2, 16, 16), (2, 4, 32, 48)])
def test_recurrent_gated_delta_rule_matches_reference(H, HV, K, V):
    gen = torch.Generator().manual_seed(7 + HV)
    T = 23
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    g = -torch.rand(T, HV, generator=gen)
    beta = torch.rand(T, HV, generator=gen)
    starts, lens, initial, final = _segment_table()
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
    starts, lens, initial, final = _segment_table()
    pool = torch.randn(6, HV, K, V, generator=gen)
    want = recurrent_gated_delta_rule_ref(q, k, v, g, beta, K**-0.5, pool.clone(), starts, lens, initial, final)
    got = chunk_gated_delta_rule_fla(*(x.cuda() for x in (q, k, v, g, beta)), K**-0.5, pool.cuda(), starts[:3].cuda(),
                                     lens[:3].cuda(), initial[:3].cuda(), final[:3].cuda())
    torch.testing.assert_close(got[:12].cpu(), want[:12], rtol=1e-3, atol=1e-3)


def test_dispatch_switch(monkeypatch, tiny_dirs):
    from flide_ext import Engine
    from flide_ext.layers.kernel_module import KernelModule

    x = torch.zeros(2, 3)
    assert dispatch.backend_for(x, None) == "reference"  # CPU tensors take the reference by default
    assert dispatch.backend_for(x, "triton") == "triton"
    with pytest.raises(ValueError, match="kernel backend 'cuda'"):
        dispatch.check_backend("cuda")
    monkeypatch.delenv("FLIDE_REFERENCE_KERNELS", raising=False)
    assert dispatch.environment_backend() is None
    monkeypatch.setenv("FLIDE_REFERENCE_KERNELS", "0")
    assert dispatch.environment_backend() is None
    monkeypatch.setenv("FLIDE_REFERENCE_KERNELS", "1")
    assert dispatch.environment_backend() == "reference"
    # Read once, when a model is loaded: every layer of it gets the backend.
    engine = Engine(str(tiny_dirs["qwen3_5"]))
    layers = [m for m in engine.model.modules() if isinstance(m, KernelModule)]
    assert engine.model.kernel_backend == "reference" and layers and all(m.backend == "reference" for m in layers)
    engine.model.set_kernel_backend(None)
    assert all(m.backend is None for m in layers)
    with pytest.raises(ValueError, match="kernel backend"):
        engine.model.set_kernel_backend("gpu")
    # The dispatcher on CPU is the reference.
    gen = torch.Generator().manual_seed(8)
    xs = torch.randn(6, 8, generator=gen)
    w = torch.randn(8, 4, generator=gen)
    one = torch.tensor([0])
    pools = [torch.zeros(1, 8, 3) for _ in range(2)]
    got = causal_conv1d(xs, w, None, pools[0], one, torch.tensor([6]), torch.tensor([-1]), one)
    want = causal_conv1d_ref(xs, w, None, pools[1], one, torch.tensor([6]), torch.tensor([-1]), one)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3"])
def test_whole_model_through_triton_kernels(tiny_dirs, family):
    """A whole tiny model forward with every kernel call sent to the Triton
    kernels (interpreted) matches the reference path, over a round with forks,
    1-token questions and a second request."""
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs[family]))
    gen = torch.Generator().manual_seed(10)
    state = torch.randint(3, 200, (70,), generator=gen).tolist()
    groups = [
        ([state + [201], state + [202, 203, 204], state + [205] * 9], [[1, 2], [1, 2], [3, 4]]),
        ([[7, 8, 9, 10, 11]], [[5]]),
    ]
    want = engine.run_round(groups).answers
    engine.model.set_kernel_backend("triton")
    got = engine.run_round(groups).answers
    for g_req, w_req in zip(got, want):
        for g_q, w_q in zip(g_req, w_req):
            torch.testing.assert_close(torch.tensor(g_q), torch.tensor(w_q), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [(32, 16, 4, 1, True), (16, 32, 4, 1, False)])
def test_fork_attention_other_tilings(monkeypatch, config):
    """Packed GQA rows and other tile shapes compute the same function."""
    import flide_ext.kernels.fork_attention.kernel as fat

    monkeypatch.setattr(fat, "TILE_OVERRIDE", config)
    gen = torch.Generator().manual_seed(11)
    owners, prompts = _prompts(gen)
    plan = plan_round(owners, prompts)
    args = _attention_args(plan, 8, 2, 16, 16, gen)
    for window in (None, 6):
        torch.testing.assert_close(fat.fork_attention_triton(*args, sliding_window=window),
                                   fork_attention_ref(*args, sliding_window=window), rtol=1e-5, atol=1e-5)


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


def test_kernel_argument_errors():
    """Unsupported arguments raise ValueError naming the problem, in the Triton
    wrappers and (where the reference shares the limit) in the references."""
    from flide_ext.kernels.gated_delta_rule.states_kernel import chunk_states_triton

    gen = torch.Generator().manual_seed(13)
    owners, prompts = _prompts(gen, requests=1)
    plan = plan_round(owners, prompts)
    args = _attention_args(plan, 2, 2, 16, 16, gen)
    for window in (0, -1, 2.5):
        for fn in (partial(fork_attention, backend="reference"), partial(fork_attention, backend="triton")):
            with pytest.raises(ValueError, match="sliding_window"):
                fn(*args, sliding_window=window)
    T = 5
    one = torch.tensor([0])
    table = (one, torch.tensor([T]), torch.tensor([-1]), one)
    for H, HV in ((2, 3), (4, 2)):
        q, k = torch.randn(T, H, 16, generator=gen), torch.randn(T, H, 16, generator=gen)
        v, g, beta = torch.randn(T, HV, 16, generator=gen), -torch.rand(T, HV, generator=gen), torch.rand(T, HV, generator=gen)
        for fn in (recurrent_gated_delta_rule_ref, recurrent_gated_delta_rule_triton):
            with pytest.raises(ValueError, match="not a multiple of key heads"):
                fn(q, k, v, g, beta, 0.25, torch.zeros(1, HV, 16, 16), *table)
    q, k, v = torch.randn(T, 2, 16), torch.randn(T, 2, 16), torch.randn(T, 2, 16)
    g, beta = -torch.rand(T, 2), torch.rand(T, 2)
    with pytest.raises(ValueError, match="state_pool must be contiguous"):
        recurrent_gated_delta_rule_triton(q, k, v, g, beta, 0.25, torch.zeros(1, 2, 16, 32)[..., ::2], *table)
    with pytest.raises(ValueError, match="out must be contiguous"):
        causal_conv1d_triton(torch.randn(T, 8), torch.randn(8, 4), None, torch.zeros(1, 8, 3), *table,
                             out=torch.zeros(T, 16)[:, ::2])
    cu, offsets = torch.tensor([0, T]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_states_triton(k, torch.randn(T, 2, 16), v, g, torch.zeros(1, 2, 16, 16), cu, offsets,
                            torch.tensor([-1]), torch.tensor([0]), chunk_size=48)


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


def test_strided_position_tables():
    """Position tables that are strided views give the same result as contiguous ones."""
    gen = torch.Generator().manual_seed(14)
    owners, prompts = _prompts(gen)
    plan = plan_round(owners, prompts)
    q, k, v, *tables, scale = _attention_args(plan, 4, 2, 16, 16, gen)
    positions = torch.empty(2 * plan.num_tokens, dtype=torch.long)[::2]
    positions.copy_(plan.positions)
    tables[5], tables[6] = positions, positions
    torch.testing.assert_close(fork_attention_triton(q, k, v, *tables, scale, 5),
                               fork_attention_ref(q, k, v, *tables, scale, 5), rtol=1e-5, atol=1e-5)


def test_deep_requests_refused_alone(tiny_dirs):
    """A request whose prompts nest deeper than the served limit gets a
    RequestError naming ``prompts``; the other request in the round is answered,
    and a 9-level request runs through the Triton kernels as through the reference."""
    from flide_ext import Engine, RequestError
    from flide_ext.plan.tree import MAX_TREE_DEPTH

    engine = Engine(str(tiny_dirs["qwen3_5"]))
    chain = [[5 + i for i in range(n + 1)] for n in range(MAX_TREE_DEPTH + 1)]  # each prompt extends the last
    deep = {"prompts": chain, "label_token_ids": [1, 2]}
    fine = {"prompts": [[7, 8, 9]], "label_token_ids": [3]}
    out = engine.score_tokens_batch([deep, fine])
    assert isinstance(out[0], RequestError) and out[0].field == "prompts"
    assert not isinstance(out[1], RequestError)
    assert out[1].label_logprobs == engine.score_tokens(fine).label_logprobs
    nine = {"prompts": chain[:9], "label_token_ids": [1, 2]}
    want = engine.score_tokens(nine).label_logprobs
    engine.model.set_kernel_backend("triton")
    got = engine.score_tokens(nine).label_logprobs
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-4)


def _tree_levels():
    # Roots: a 130-row state from zeros and a 70-row state resumed from slot 5;
    # then questions (a 1-row one, an empty one, one with no kept state); then a
    # third level, one of whose parents is the empty segment.
    t = torch.tensor
    return [
        (t([0, 130]), t([130, 70]), t([-1, 5]), t([0, 1])),
        (t([200, 265, 266, 266]), t([65, 1, 0, 34]), t([0, 0, 1, 1]), t([2, 3, 4, -1])),
        (t([300, 340]), t([40, 8]), t([2, 4]), t([6, 7])),
    ]


TREE_ROWS = 348


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
    want = gated_delta_rule_tree_ref(q, k, v, g, beta, K**-0.5, pools[0], _tree_levels())
    got = gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, K**-0.5, pools[1], _tree_levels())
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


def test_causal_conv1d_long_segments_match_reference():
    """Segments spanning several row blocks (a program per 32 rows), a 1-row and
    an empty segment, a resumed root and three levels."""
    gen = torch.Generator().manual_seed(16)
    T, C, W = TREE_ROWS, 150, 4
    x = torch.randn(T, C, generator=gen)
    weight = torch.randn(C, W, generator=gen)
    pool = torch.full((8, C, W - 1), float("nan"))
    pool[5] = torch.randn(C, W - 1, generator=gen)
    pools = [pool.clone(), pool.clone()]
    outs = [torch.full((T, C), float("nan")) for _ in range(2)]
    for fn, pool, out in zip((causal_conv1d_ref, causal_conv1d_triton), pools, outs):
        for level in _tree_levels():
            fn(x, weight, None, pool, *level, "silu", out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert not outs[1].isnan().any()
    torch.testing.assert_close(pools[1][[0, 1, 2, 3, 4, 6, 7]], pools[0][[0, 1, 2, 3, 4, 6, 7]], rtol=0, atol=0)


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
    want = gated_delta_rule_tree_ref(q, k, v, g, beta, 0.25, torch.zeros(8, 4, 16, 16), _tree_levels())
    for steps in (None, gd.reference_steps):
        if steps is not None:
            monkeypatch.setattr(gdt, "chunk_steps", steps)
        got = gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, 0.25, torch.zeros(8, 4, 16, 16), _tree_levels())
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        out = torch.zeros(4, TREE_ROWS, 16).transpose(0, 1)
        gdt.gated_delta_rule_tree_triton(q, k, v, g, beta, 0.25, torch.zeros(8, 4, 16, 16), _tree_levels(), out=out)
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
        for level in _tree_levels():
            fn(q, k, v, g, beta, 0.25, pool, *level, out=out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-4, atol=1e-4)
    assert torch.equal(pools[1][4], pools[1][1])
