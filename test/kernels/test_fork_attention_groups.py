"""ForkAttention's key groups (``kernel.SPLIT_OVERRIDE``, ``kernel.SPLIT_ROWS``)
under the Triton interpreter on the CPU: a row's keys are reduced chunk by
chunk and group by group, and running the groups as one program or as a split
grid with a combine launch gives the same bits; with many chunks a question
still gets the same bits forked and resumed from a checkpoint, and the
function stays the reference's."""

import os

# conftest.py sets this before anything imports triton (triton.jit reads it at
# decoration time); kept here so the module also runs on its own.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import flide_ext.kernels.fork_attention.kernel as fat  # noqa: E402
from flide_ext.kernels.fork_attention import fork_attention_ref  # noqa: E402
from flide_ext.plan.flat import Resume, plan_round  # noqa: E402
from test.helpers.kernel_inputs import attention_args  # noqa: E402

# (BLOCK_M, BLOCK_N, warps, stages, pack) and (CHUNK, GROUPS): 16-key tiles in
# 32-key chunks, three groups, so a 90-token path has chunks 0, 1 and a last
# group folding chunk 2 on.
TILES = (16, 16, 4, 1, True)
GROUPS = (32, 3)


@pytest.fixture
def small_groups(monkeypatch):
    monkeypatch.setattr(fat, "TILE_OVERRIDE", TILES)
    monkeypatch.setattr(fat, "SPLIT_OVERRIDE", GROUPS)


def run(args, split: bool, window=None, monkeypatch=None, **kwargs):
    monkeypatch.setattr(fat, "SPLIT_ROWS", 10**9 if split else 0)
    return fat.fork_attention_triton(*args, sliding_window=window, **kwargs)


def long_round():
    # Two requests with states of 95 and 70 tokens (three and more chunks),
    # questions of 1 to 9 tokens.
    gen = torch.Generator().manual_seed(7)
    prompts, owners = [], []
    for r, n_state in enumerate((95, 70)):
        state = torch.randint(0, 50, (n_state,), generator=gen).tolist()
        for n in (1, 4, 9):
            prompts.append(state + (100 + torch.randint(0, 50, (n,), generator=gen)).tolist())
            owners.append(r)
    return plan_round(owners, prompts)


@pytest.mark.parametrize("window", [None, 40])
def test_split_grid_equals_one_program_bitwise(small_groups, monkeypatch, window):
    plan = long_round()
    args = attention_args(plan, 8, 2, 16, 16, torch.Generator().manual_seed(3))
    walked = run(args, split=False, window=window, monkeypatch=monkeypatch)
    split = run(args, split=True, window=window, monkeypatch=monkeypatch)
    assert torch.equal(walked, split)
    torch.testing.assert_close(split, fork_attention_ref(*args, sliding_window=window), rtol=1e-5, atol=1e-5)


def test_groups_change_the_reduction_not_the_function(small_groups, monkeypatch):
    """The groups are a real change of reduction order (bits differ from one
    group per path) and the same attention (close to it and to the reference)."""
    plan = long_round()
    args = attention_args(plan, 8, 2, 16, 16, torch.Generator().manual_seed(4))
    grouped = run(args, split=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(fat, "SPLIT_OVERRIDE", (512, 16))
    whole = run(args, split=True, monkeypatch=monkeypatch)
    assert not torch.equal(grouped, whole)
    torch.testing.assert_close(grouped, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped, fork_attention_ref(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", [False, True])
def test_forked_and_resumed_bitwise_across_chunks(small_groups, monkeypatch, split):
    """A question's rows forked from its state among another request's and
    resumed from a 64-token checkpoint, over a path of several chunks and
    groups: the same bits. (Alone, the question shares a segment, and so
    query blocks, with its state; under the interpreter numpy's float32 matmul
    may round a row by its place in the block, so alone against forked is
    checked on the GPU, benchmark/kernels/check_kernels.py, and here to 1e-6.)"""
    gen = torch.Generator().manual_seed(5)
    state = torch.randint(0, 50, (101,), generator=gen).tolist()
    other = torch.randint(0, 50, (37,), generator=gen).tolist()
    questions = [[101, 102, 103], [104], [105, 106, 107, 108, 109, 110, 111]]
    Hq, Hkv, D = 4, 2, 16
    table_q = torch.randn(200, 200, Hq, D, generator=gen)
    table_k = torch.randn(200, 200, Hkv, D, generator=gen)
    table_v = torch.randn(200, 200, Hkv, D, generator=gen)

    def rows(plan, prompt_ids=None):
        # q from the stream; K/V of the key array (a resumed prefix's rows
        # hold that prefix's tokens at their positions).
        ids, kv_pos = plan.token_ids, plan.kv_positions
        kv_ids = ids
        if plan.num_prefix_rows:
            kv_ids = torch.cat((torch.tensor(prompt_ids[: plan.num_prefix_rows], dtype=torch.long), ids))
        return run((table_q[ids, plan.positions], table_k[kv_ids, kv_pos], table_v[kv_ids, kv_pos], plan.seg_parent,
                    plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len, plan.positions, kv_pos,
                    D**-0.5), split=split, monkeypatch=monkeypatch)

    forked = plan_round([0, 1, 1, 1], [other + [1, 2], *[state + qn for qn in questions]])
    out = rows(forked)
    resumed = plan_round([0, 0, 0], [state + qn for qn in questions],
                         resume={0: Resume(length=64, slot=-1, kv_start=0)})
    assert resumed.num_prefix_rows == 64
    out_resumed = rows(resumed, state)
    for i, qn in enumerate(questions):
        end = forked.readout_rows[forked.prompt_readout[i + 1]] + 1
        got = out[end - len(qn): end]
        end = resumed.readout_rows[resumed.prompt_readout[i]] + 1
        assert torch.equal(got, out_resumed[end - len(qn): end]), f"question {i}: resumed differs"
        alone = rows(plan_round([0], [state + qn]))[-len(qn):]
        torch.testing.assert_close(alone, got, rtol=1e-6, atol=1e-6)
