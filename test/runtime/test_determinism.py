"""Deterministic mode on the CPU: the path is per row already, so the mode says
so, changes no bit, and a request's answer is the same in any round."""

import random

import torch

from flide_ext import Engine
from flide_ext.runtime.determinism import enable_deterministic
from test.helpers.exact_checks import make_request


def test_cpu_deterministic_mode_is_the_default_path(tiny_dirs):
    assert "float64 GEMMs" in enable_deterministic(torch.device("cpu"))
    rng = random.Random(11)
    requests = [make_request(rng, rng.randint(20, 90), rng.randint(1, 4)) for _ in range(4)]
    plain = Engine(str(tiny_dirs["qwen3_5"]), dtype="bfloat16", radix_cache=False)
    fixed = Engine(str(tiny_dirs["qwen3_5"]), dtype="bfloat16", radix_cache=False, deterministic=True)
    assert plain.runner.deterministic is None and "float64" in fixed.runner.deterministic
    together = fixed.score_tokens_batch(requests)
    for request, answer in zip(requests, together):
        assert plain.score_tokens(request).label_logprobs == answer.label_logprobs
        assert fixed.score_tokens(request).label_logprobs == answer.label_logprobs


# The GPU mode's row counts, checked on CPU with GEMMs whose row dependence is known.

import pytest
import torch.nn.functional as F

from flide_ext.layers import linear as linear_module
from flide_ext.layers.linear import GemmRows, at_checked_rows, checked_rows
from flide_ext.runtime.determinism import check_rows, model_gemms, row_steps


def test_row_steps_follow_the_graph_ladder_and_cover_the_capacity():
    assert row_steps(600) == ((608, 32),)
    assert row_steps(16384) == ((1024, 32), (16384, 64))
    assert row_steps(20000) == ((1024, 32), (16384, 64), (20224, 256))
    counts = GemmRows(row_steps(2048), {}).padded_counts()
    assert counts[:3] == [32, 64, 96] and 1024 in counts and 1056 not in counts and counts[-2:] == [1984, 2048]


def test_gemm_rows_pad_to_the_step_then_to_a_moved_count():
    rows = GemmRows(((1024, 32), (2048, 64)), {"k": {64: 128}})
    assert [rows.rows(t, "other") for t in (1, 32, 33, 1024, 1025, 2048)] == [32, 32, 64, 1024, 1088, 2048]
    assert rows.rows(40, "k") == 128 and rows.rows(70, "k") == 96
    with pytest.raises(ValueError, match="up to 2048 rows"):
        rows.rows(2049, "k")


def _exact(w):
    return lambda x: F.linear(x.double(), w.double()).float()


def test_a_row_invariant_gemm_moves_no_count():
    w = torch.randn(24, 16)
    assert check_rows(_exact(w), 16, torch.float32, torch.device("cpu"), range(32, 321, 32)) == {}


def test_counts_whose_rows_differ_move_to_the_next_count_that_matches():
    w = torch.randn(24, 16)

    def split_k(x):  # at 64 and 96 rows another kernel: the reduction split in two halves
        if x.shape[0] in (64, 96):
            return (F.linear(x[:, :8].double(), w[:, :8].double()).float()
                    + F.linear(x[:, 8:].double(), w[:, 8:].double()).float())
        return _exact(w)(x)

    moved = check_rows(split_k, 16, torch.float32, torch.device("cpu"), range(32, 257, 32))
    assert moved == {64: 128, 96: 128}


def test_a_reduction_that_depends_on_the_row_position_is_refused():
    w = torch.randn(24, 16)

    def by_position(x):  # odd rows reduce in another order, as a stream-K tile split would
        out = _exact(w)(x)
        odd = torch.arange(x.shape[0]) % 2 == 1
        out[odd] = (F.linear(x[odd][:, :8].double(), w[:, :8].double()).float()
                    + F.linear(x[odd][:, 8:].double(), w[:, 8:].double()).float())
        return out

    with pytest.raises(RuntimeError, match="one position down"):
        check_rows(by_position, 16, torch.float32, torch.device("cpu"), range(32, 129, 32))


def test_checked_rows_pad_the_input_and_return_its_own_rows():
    seen = []

    def gemm(x):
        seen.append(tuple(x.shape))
        return x * 2

    x = torch.randn(37, 8)
    with checked_rows(GemmRows(((1024, 32),), {"k": {64: 96}})):
        out = at_checked_rows(gemm, x, "k")
        with pytest.raises(ValueError, match=r"not \(2, 3, 8\)"):
            at_checked_rows(gemm, torch.randn(2, 3, 8), "k")
        with checked_rows(None):  # an inner block without counts, then the outer's again
            assert at_checked_rows(gemm, x, "k").shape == (37, 8) and seen[-1] == (37, 8)
        at_checked_rows(gemm, x, "k")
    assert seen == [(96, 8), (37, 8), (96, 8)] and torch.equal(out, x * 2)
    assert at_checked_rows(gemm, x, "k").shape == (37, 8) and seen[-1] == (37, 8)


def test_the_model_gemms_are_its_layers_stacks_and_readout_and_padding_keeps_answers(tiny_dirs):
    rng = random.Random(5)
    requests = [make_request(rng, rng.randint(20, 90), rng.randint(1, 4)) for _ in range(3)]
    engine = Engine(str(tiny_dirs["qwen3_5"]), dtype="bfloat16", radix_cache=False)
    model = engine.runner.model
    gemms = model_gemms(model)
    keys = set(gemms)
    head = model.lm_head.weight
    assert ("readout", head.shape[0], head.shape[1], head.dtype, head.dtype, torch.float32, False) in keys
    mlp = next(m for m in model.modules() if hasattr(m, "gate_up"))
    stacked = (sum(mlp.gate_up.sizes), mlp.gate_proj.in_features, head.dtype, head.dtype, head.dtype, False)
    assert stacked in keys
    # Every layer not run inside a stack is a GEMM of its own.
    lone = {(m.out_features, m.in_features) for m in model.modules()
            if isinstance(m, linear_module.Linear) and m is not model.lm_head
            and not any(m in s.layers for v in model.modules() for s in vars(v).values()
                        if isinstance(s, linear_module.StackedLinear))}
    assert lone <= {k[:2] for k in keys if k[0] != "readout"}
    for key, (gemm, in_features, dtype) in gemms.items():
        x = torch.randn(5, in_features).to(dtype)
        assert gemm(x).shape[0] == 5
    plain = [engine.score_tokens(r).label_logprobs for r in requests]
    # The readout run at padded row counts (its GEMM on CPU is float64: the real rows keep their bits).
    model.gemm_rows = GemmRows(((4096, 32),), {})
    other = Engine(str(tiny_dirs["qwen3_5"]), dtype="bfloat16", radix_cache=False)
    padded = [engine.score_tokens(r).label_logprobs for r in requests]
    together = [a.label_logprobs for a in engine.score_tokens_batch(requests)]
    assert padded == plain and together == plain
    # The counts are the model's: another engine's model runs at its own, even past them.
    model.gemm_rows = GemmRows(((1, 1),), {})
    with pytest.raises(ValueError, match="up to 1 rows, not 3"):
        engine.score_tokens(make_request(rng, 30, 3))
    assert [other.score_tokens(r).label_logprobs for r in requests] == plain
