"""On CPU a bf16 or fp16 engine answers a request inside a round of others with
the same bits as the request alone: every reduction of the CPU path is per row
(its GEMMs accumulate in float64, its kernels are the per-segment references).

(A request of several questions is a different tree from each question sent on
its own: its state is forked through a float32 state slot, which in bf16 can
move a question's bits. What may not move them is the rest of the round.)"""

import random

import pytest

from flide_ext import Engine
from test.helpers.exact_checks import make_request


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_request_in_a_round_equals_it_alone_bitwise(tiny_dirs, dtype):
    rng = random.Random(3)
    requests = [make_request(rng, rng.randint(40, 140), rng.randint(1, 6)) for _ in range(5)]
    for family in ("qwen3_5", "qwen3_next", "llama"):
        engine = Engine(str(tiny_dirs[family]), dtype=dtype, radix_cache=False)
        answers = engine.score_tokens_batch(requests)
        for request, answer in zip(requests, answers):
            assert engine.score_tokens(request).label_logprobs == answer.label_logprobs, (family, dtype)


def test_a_float32_gdn_rule_in_a_bf16_model_keeps_rows_invariant(tiny_dirs, monkeypatch):
    import torch

    import flide_ext.layers.gated_deltanet as gdn_layer

    seen = []
    rule = gdn_layer.gated_delta_rule_tree

    def spy(q, k, v, g, beta, *args, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype, beta.dtype))
        return rule(q, k, v, g, beta, *args, **kwargs)

    monkeypatch.setattr(gdn_layer, "gated_delta_rule_tree", spy)
    rng = random.Random(5)
    requests = [make_request(rng, rng.randint(40, 140), rng.randint(1, 6)) for _ in range(4)]
    path = str(tiny_dirs["qwen3_5"])
    engine = Engine(path, dtype="bfloat16", radix_cache=False, gdn_rule_dtype="float32")
    answers = engine.score_tokens_batch(requests)
    assert seen and set(seen) == {(torch.float32,) * 4}
    for request, answer in zip(requests, answers):
        assert engine.score_tokens(request).label_logprobs == answer.label_logprobs
    # The rule's inputs are the same bf16 values either way (the CPU reference works in
    # float64 inside): only the rounding of its output may differ.
    default = Engine(path, dtype="bfloat16", radix_cache=False).score_tokens_batch(requests)
    for a, b in zip(answers, default):
        for x, y in zip(a.label_logprobs, b.label_logprobs):
            assert x == pytest.approx(y, abs=0.05)
    with pytest.raises(ValueError, match="GDN rule dtype"):
        Engine(path, dtype="bfloat16", radix_cache=False, gdn_rule_dtype="float16")


def test_a_float32_residual_stream_keeps_rows_invariant_and_comes_closer_to_float32(tiny_dirs, monkeypatch):
    """A bf16 engine keeps its residual stream in float32 unless asked for the
    model's dtype; either stream is per row, and the float32 one answers closer
    to the float32 engine (mean |log-probability error| over every label)."""
    import torch

    import flide_ext.layers.norm as norm_layer

    seen = set()
    norm = norm_layer.rms_norm

    def spy(x, *args, residual=None, **kwargs):
        if residual is not None:
            seen.add((x.dtype, residual.dtype))
        return norm(x, *args, residual=residual, **kwargs)

    monkeypatch.setattr(norm_layer, "rms_norm", spy)
    rng = random.Random(3)
    requests = [make_request(rng, rng.randint(40, 140), rng.randint(1, 6)) for _ in range(8)]
    for family in ("qwen3_5", "llama", "qwen3_next"):
        path = str(tiny_dirs[family])
        reference = Engine(path, radix_cache=False).score_tokens_batch(requests)
        errors = {}
        for stream, dtype in (("float32", torch.float32), ("model", torch.bfloat16), (None, torch.float32)):
            seen.clear()
            engine = Engine(path, dtype="bfloat16", radix_cache=False, residual_dtype=stream)
            answers = engine.score_tokens_batch(requests)
            assert seen == {(torch.bfloat16, dtype)}, (family, stream, seen)
            for request, answer in zip(requests[:3], answers):
                assert engine.score_tokens(request).label_logprobs == answer.label_logprobs, (family, stream)
            errors[stream] = [abs(p - q) for a, b in zip(answers, reference)
                              for x, y in zip(a.label_logprobs, b.label_logprobs) for p, q in zip(x, y)]
        assert errors[None] == errors["float32"], family  # float32 is the default
        assert sum(errors["float32"]) < sum(errors["model"]), family
    with pytest.raises(ValueError, match="residual dtype 'bfloat16' is not one of float32, model"):
        Engine(str(tiny_dirs["llama"]), dtype="bfloat16", residual_dtype="bfloat16")
    with pytest.raises(ValueError, match="residual dtype torch.bfloat16 is not one of"):
        Engine(str(tiny_dirs["llama"]), dtype="bfloat16", residual_dtype=torch.bfloat16)
    typed = Engine(str(tiny_dirs["llama"]), dtype="bfloat16", radix_cache=False, residual_dtype=torch.float32)
    assert typed.runner.model.residual_dtype is torch.float32
    # A model handed to a second engine takes that engine's setting, None included (the default).
    model = typed.runner.model
    Engine(str(tiny_dirs["llama"]), dtype="bfloat16", model=model, residual_dtype="model")
    assert model.residual_dtype is None
    Engine(str(tiny_dirs["llama"]), dtype="bfloat16", model=model)
    assert model.residual_dtype is torch.float32
    with pytest.raises(ValueError, match="not 'float32'"):
        model.set_residual_dtype("float32")
