"""StackedLinear: several projections of one input as one GEMM, with the
layers' parameters as views of the stack (names, loading and memory unchanged)."""

import pytest
import torch
from torch import nn

from flide_ext.layers.linear import Linear, StackedLinear


def _layers(bias=False, seed=0):
    torch.manual_seed(seed)
    return Linear(24, 40, bias=bias), Linear(24, 3, bias=bias), Linear(24, 5, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
def test_outputs_equal_the_separate_layers(bias):
    layers = _layers(bias)
    x = torch.randn(7, 24)
    with torch.no_grad():
        want = [layer(x) for layer in layers]
    stack = StackedLinear(*layers)
    with torch.inference_mode():
        got = stack(x)
    assert [g.shape for g in got] == [(7, 40), (7, 3), (7, 5)]
    for g, w in zip(got, want):
        # CPU float32 accumulates in float64 whatever the width: the same rows.
        assert torch.equal(g, w)


def test_parameters_become_views_and_follow_loads():
    layers = _layers()
    holder = nn.ModuleList(layers)
    names = [n for n, _ in holder.named_parameters()]
    stack = StackedLinear(*layers)
    with torch.inference_mode():
        stack(torch.randn(2, 24))
    base = stack._weight.data_ptr()
    assert [n for n, _ in holder.named_parameters()] == names
    assert layers[1].weight.data_ptr() == base + 40 * 24 * 4
    assert not layers[0].weight.is_inference()
    # A later load copies into the views, so the next call uses it.
    fresh = _layers(seed=1)
    holder.load_state_dict(nn.ModuleList(fresh).state_dict())
    x = torch.randn(3, 24)
    with torch.inference_mode():
        got = stack(x)
    assert stack._weight.data_ptr() == base
    with torch.no_grad():
        assert all(torch.equal(g, f(x)) for g, f in zip(got, fresh))


def test_restacks_after_the_layers_move():
    layers = _layers()
    stack = StackedLinear(*layers)
    x = torch.randn(3, 24)
    with torch.inference_mode():
        stack(x)
        nn.ModuleList(layers).to(torch.float64)
        got = stack(x.double())
    assert stack._weight.dtype == torch.float64
    assert all(g.dtype == torch.float64 for g in got)
    # float64 GEMMs are not row-invariant (the CPU float32 path is): the BLAS may
    # block the stacked and the single GEMM differently, a last-bit difference.
    with torch.no_grad():
        for g, layer in zip(got, layers):
            torch.testing.assert_close(g, layer(x.double()), rtol=1e-12, atol=1e-12)
    layers[2].weight.data = torch.zeros(5, 24, dtype=torch.float64)
    with torch.inference_mode():
        assert torch.equal(stack(x.double())[2], torch.zeros(3, 5, dtype=torch.float64))


def test_refuses_unlike_layers():
    with pytest.raises(ValueError, match="input width"):
        StackedLinear(Linear(4, 2), Linear(5, 2))
    with pytest.raises(ValueError, match="bias"):
        StackedLinear(Linear(4, 2, bias=True), Linear(4, 2, bias=False))


def test_autograd_reaches_the_layers():
    """Outside no-grad the layers run one by one, so their parameters get gradients."""
    from flide_ext.layers.mlp import GatedMLP

    torch.manual_seed(1)
    mlp = GatedMLP(8, 12, "silu")
    x = torch.randn(3, 8)
    mlp(x).sum().backward()
    for layer in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)))


def test_refuses_layers_of_different_dtypes():
    a, b = Linear(4, 2), Linear(4, 3).double()
    with torch.inference_mode(), pytest.raises(ValueError, match="dtype and device"):
        StackedLinear(a, b)(torch.randn(2, 4))
    assert a.weight.dtype == torch.float32  # untouched
