"""The real SmolLM2-135M-Instruct on the bundled decision requests, float32 on CPU.

The round's label log-probabilities must equal each question's prompt run alone
(1e-5) and a transformers float32 forward of the full prompt (1e-4), with the
same argmax; the DecisionResponse must carry exactly those numbers.
"""

from __future__ import annotations

import math

import pytest

from test.helpers.checkpoints import hf_label_logprobs
from test.helpers.decisions import example_requests


def test_round_equals_alone_and_transformers(smollm2_engine, smollm2_hf):
    engine = smollm2_engine
    requests = example_requests()
    encoded = [engine.renderer.encode(_parse(r)) for r in requests]
    groups = [([q.prompt_ids for q in enc], [q.label_ids for q in enc]) for enc in encoded]
    result = engine.run_round(groups)
    forked, stats = result.answers, result.stats
    assert stats.questions == sum(len(r["questions"]) for r in requests) >= 60
    assert stats.stream_tokens < stats.prompt_tokens
    for enc, answers in zip(encoded, forked):
        for q, lp in zip(enc, answers):
            alone = engine.run_round([([q.prompt_ids], [q.label_ids])]).answers[0][0]
            ref = hf_label_logprobs(smollm2_hf, q.prompt_ids, q.label_ids)
            assert max(abs(a - b) for a, b in zip(lp, alone)) <= 1e-5
            assert max(abs(a - b) for a, b in zip(lp, ref)) <= 1e-4
            assert lp.index(max(lp)) == alone.index(max(alone)) == ref.index(max(ref))


def test_decision_response_carries_the_round_numbers(smollm2_engine):
    engine = smollm2_engine
    requests = example_requests()[:5]
    responses = engine.decide_batch(requests)
    for request, response in zip(requests, responses):
        enc = engine.renderer.encode(_parse(request))
        logprobs = engine.run_round([([q.prompt_ids for q in enc], [q.label_ids for q in enc])]).answers[0]
        assert list(response.answers) == [q["id"] for q in request["questions"]]
        for question, lp in zip(request["questions"], logprobs):
            answer = response.answers[question["id"]]
            top = max(lp)
            weights = [math.exp(x - top) for x in lp]
            probs = [w / sum(weights) for w in weights]
            assert list(answer.probabilities.values()) == pytest.approx(probs, abs=1e-6)
            assert answer.label_mass == pytest.approx(sum(math.exp(x) for x in lp), abs=1e-6)
            if question["type"] == "choice":
                assert answer.choice == question["options"][probs.index(max(probs))]["name"]
            if question["type"] == "score":
                assert answer.score == pytest.approx(sum(i * p for i, p in enumerate(probs)), abs=1e-6)


def _parse(request):
    from flide_ext.protocol.decisions import parse_decision_request

    return parse_decision_request(request)
