"""Flide's Triton kernels under the Triton interpreter (``TRITON_INTERPRET=1``) on
the CPU: the backend switch, argument checks shared by the wrappers and their
references, and whole tiny models through every kernel (each kernel against its
reference: test_fork_attention_triton.py, test_causal_conv1d_triton.py,
test_gated_delta_rule_triton.py; the RMSNorm, gate, rotary and SiLU-product kernels
in their own files).

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
from flide_ext.kernels.fork_attention import fork_attention  # noqa: E402
from flide_ext.kernels.gated_delta_rule import recurrent_gated_delta_rule_ref  # noqa: E402
from flide_ext.kernels.gated_delta_rule.recurrent_kernel import recurrent_gated_delta_rule_triton  # noqa: E402
from flide_ext.plan.flat import plan_round  # noqa: E402
from test.helpers.kernel_inputs import attention_args, random_prompts  # noqa: E402


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


def test_kernel_argument_errors():
    """Unsupported arguments raise ValueError naming the problem, in the Triton
    wrappers and (where the reference shares the limit) in the references."""
    from flide_ext.kernels.gated_delta_rule.states_kernel import chunk_states_triton

    gen = torch.Generator().manual_seed(13)
    owners, prompts = random_prompts(gen, requests=1)
    plan = plan_round(owners, prompts)
    args = attention_args(plan, 2, 2, 16, 16, gen)
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


