"""The public kernel functions as callers meet them: a backend is one of the
known ones or refused, the references an op package exports check their
arguments as the public function does, and a model handed to an engine keeps the
backend it was given."""

import inspect

import pytest
import torch

from flide_ext.kernels.causal_conv1d import causal_conv1d_tree, causal_conv1d_tree_ref
from flide_ext.kernels.fork_attention import fork_attention, fork_attention_ref
from flide_ext.kernels.fork_attention import reference as fork_attention_leaf
from flide_ext.kernels.gdn_gate import gdn_gate
from flide_ext.kernels.rms_norm import rms_norm, rms_norm_ref
from flide_ext.kernels.rotary import rotary, rotary_ref
from flide_ext.kernels.silu_mul import silu_mul, silu_mul_ref
from flide_ext.plan import plan_round


def test_unknown_backends_are_refused():
    x, w = torch.randn(3, 8), torch.ones(8)
    cos = torch.randn(3, 4)
    calls = [
        lambda b: rms_norm(x, w, 1e-6, backend=b),
        lambda b: rotary(x.view(3, 1, 8), cos, cos, backend=b),
        lambda b: silu_mul(x, x, backend=b),
        lambda b: gdn_gate(x, x, torch.zeros(8), torch.zeros(8), backend=b),
    ]
    for call in calls:
        assert torch.equal(torch.as_tensor(call("reference")[0]), torch.as_tensor(call(None)[0]))
        for bad in ("Triton", "gpu", ""):
            with pytest.raises(ValueError, match=f"kernel backend {bad!r} is not one of triton, reference"):
                call(bad)


def test_exported_references_check_their_arguments():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="mode"):
        rms_norm_ref(x, torch.ones(8), 1e-6, "layer")
    with pytest.raises(ValueError, match="gate"):
        rms_norm_ref(x, torch.ones(8), 1e-6, "offset", gate=x)
    with pytest.raises(ValueError, match="even"):
        rotary_ref(x.view(3, 1, 8), torch.randn(3, 3), torch.randn(3, 3))
    with pytest.raises(ValueError, match="floating-point"):
        silu_mul_ref(x.int(), x.int())
    plan = plan_round([0, 0], [[1, 2, 3], [1, 2, 4]])
    q = torch.randn(plan.num_tokens, 2, 8)
    args = (q, q, q, plan.seg_parent, plan.seg_start, plan.seg_len, plan.seg_kv_start, plan.seg_kv_len,
            plan.positions, plan.kv_positions, 8**-0.5)
    with pytest.raises(ValueError, match="sliding_window"):
        fork_attention_ref(*args, sliding_window=0)
    with pytest.raises(ValueError, match=r"must be \[rows, heads, head size\]"):
        fork_attention(torch.tensor(1.0), *args[1:])
    with pytest.raises(ValueError, match=r"must be \[T, C\]"):
        causal_conv1d_tree(torch.zeros(4), *([None] * 9))
    with pytest.raises(ValueError, match="split"):
        table = torch.zeros(2, dtype=torch.long)
        causal_conv1d_tree_ref(torch.zeros(2, 12), torch.zeros(12, 4), None, torch.zeros(1, 12, 3), table, table,
                               table, torch.zeros(2, 3, dtype=torch.long), table, table, split=[3, 3, 3, 3])
    # The same numbers as the leaf, under the leaf's name and signature.
    assert torch.equal(fork_attention_ref(*args), fork_attention_leaf.fork_attention_ref(*args))
    assert fork_attention_ref.__name__ == "fork_attention_ref"
    assert inspect.signature(fork_attention_ref) == inspect.signature(fork_attention_leaf.fork_attention_ref)
    assert list(inspect.signature(fork_attention).parameters)[-1] == "backend"


def test_a_given_model_keeps_its_backend(tiny_dirs, monkeypatch):
    from flide_ext import Engine

    monkeypatch.delenv("FLIDE_REFERENCE_KERNELS", raising=False)
    model = Engine(str(tiny_dirs["qwen3"])).model
    model.set_kernel_backend("reference")
    assert Engine("tiny", model=model).model.kernel_backend == "reference"
    model.set_kernel_backend("triton")
    monkeypatch.setenv("FLIDE_REFERENCE_KERNELS", "1")  # the environment still forces the references
    assert Engine("tiny", model=model).model.kernel_backend == "reference"
