"""The fork-attention Triton kernel under the Triton interpreter (``TRITON_INTERPRET=1``)
on the CPU against its PyTorch reference (the interpreter's limits: test_triton_kernels.py)."""

import os

# conftest.py sets this before anything imports triton (triton.jit reads it at
# decoration time); kept here so the module also runs on its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flide_ext.kernels.fork_attention import fork_attention_ref  # noqa: E402
from flide_ext.kernels.fork_attention.kernel import fork_attention_triton  # noqa: E402
from flide_ext.kernels.fork_attention.paths import PATH_DEPTH, path_tables  # noqa: E402
from flide_ext.plan.flat import Resume, plan_round  # noqa: E402
from test.helpers.kernel_inputs import attention_args, random_prompts  # noqa: E402


@pytest.mark.parametrize("Hq,Hkv,D,DV,window", [(4, 2, 16, 16, None), (2, 2, 24, 16, None), (6, 2, 32, 32, 7),
                                                 (4, 1, 512, 512, 7)])  # Gemma 4's full-layer heads
def test_fork_attention_matches_reference(Hq, Hkv, D, DV, window):
    gen = torch.Generator().manual_seed(Hq * 100 + D)
    owners, prompts = random_prompts(gen)
    plan = plan_round(owners, prompts)
    args = attention_args(plan, Hq, Hkv, D, DV, gen)
    got = fork_attention_triton(*args, sliding_window=window)
    want = fork_attention_ref(*args, sliding_window=window)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fork_attention_resumed_from_checkpoint_keys():
    gen = torch.Generator().manual_seed(3)
    state = list(range(1, 41))
    prompts = [state + [60, 61, 62], state + [70]]
    plan = plan_round([0, 0], prompts, resume={0: Resume(length=30, slot=-1, kv_start=5)})
    args = attention_args(plan, 4, 2, 16, 16, gen, prefix=plan.num_prefix_rows)
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


@pytest.mark.parametrize("config", [(32, 16, 4, 1, True), (16, 32, 4, 1, False)])
def test_fork_attention_other_tilings(monkeypatch, config):
    """Packed GQA rows and other tile shapes compute the same function."""
    import flide_ext.kernels.fork_attention.kernel as fat

    monkeypatch.setattr(fat, "TILE_OVERRIDE", config)
    gen = torch.Generator().manual_seed(11)
    owners, prompts = random_prompts(gen)
    plan = plan_round(owners, prompts)
    args = attention_args(plan, 8, 2, 16, 16, gen)
    for window in (None, 6):
        torch.testing.assert_close(fat.fork_attention_triton(*args, sliding_window=window),
                                   fork_attention_ref(*args, sliding_window=window), rtol=1e-5, atol=1e-5)


def test_strided_position_tables():
    """Position tables that are strided views give the same result as contiguous ones."""
    gen = torch.Generator().manual_seed(14)
    owners, prompts = random_prompts(gen)
    plan = plan_round(owners, prompts)
    q, k, v, *tables, scale = attention_args(plan, 4, 2, 16, 16, gen)
    positions = torch.empty(2 * plan.num_tokens, dtype=torch.long)[::2]
    positions.copy_(plan.positions)
    tables[5], tables[6] = positions, positions
    torch.testing.assert_close(fork_attention_triton(q, k, v, *tables, scale, 5),
                               fork_attention_ref(q, k, v, *tables, scale, 5), rtol=1e-5, atol=1e-5)


def test_path_tables_match_a_walk_up_each_segment():
    """Random forests (parents before children, some segments without keys):
    each segment's row lists its root-to-leaf path's key starts, counts and
    offsets, as walking its parents one by one gives."""
    gen = torch.Generator().manual_seed(21)
    for S in (1, 2, 7, 40):
        parent = [-1]
        for s in range(1, S):
            parent.append(int(torch.randint(-1, s, (1,), generator=gen)))
        kv_start = torch.randint(0, 500, (S,), generator=gen)
        kv_len = torch.randint(0, 5, (S,), generator=gen)
        kv, offset, count, own = path_tables(torch.tensor(parent), kv_start, kv_len)
        for s in range(S):
            path, node = [], s
            while node >= 0:
                path.insert(0, node)
                node = parent[node]
            lens = [int(kv_len[p]) for p in path] + [0] * (PATH_DEPTH - len(path))
            starts = [int(kv_start[p]) for p in path] + [0] * (PATH_DEPTH - len(path))
            assert count[s].tolist() == lens and kv[s].tolist() == starts
            assert offset[s].tolist() == [sum(lens[:j]) for j in range(PATH_DEPTH)]
            assert int(own[s]) == sum(lens[:len(path) - 1])


def test_head_sizes_over_the_kernels_limit_are_refused():
    from flide_ext.kernels.fork_attention.kernel import MAX_HEAD_SIZE, tokens_per_block

    gen = torch.Generator().manual_seed(9)
    plan = plan_round([0], [[1, 2, 3]])
    args = attention_args(plan, 2, 1, MAX_HEAD_SIZE * 2, MAX_HEAD_SIZE * 2, gen)
    with pytest.raises(ValueError, match=f"head size {MAX_HEAD_SIZE * 2} is over {MAX_HEAD_SIZE}"):
        fork_attention_triton(*args)
    # A 512-wide bf16 head: a narrower tile, one query head per program.
    assert tokens_per_block(512, torch.bfloat16, 4) == 32 and tokens_per_block(256, torch.bfloat16, 4) == 32
