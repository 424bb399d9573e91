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
