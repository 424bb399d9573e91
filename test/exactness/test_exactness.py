"""Fork exactness on tiny random Llama and Qwen3 checkpoints, float32 on CPU.

Every question's label log-probabilities from a multi-request round must equal
(a) the same question's full prompt run alone through the engine, within 1e-5,
and (b) a Hugging Face transformers float32 forward of the full prompt, within
1e-4, with the same argmax everywhere.
"""

from __future__ import annotations

import random

import pytest
import torch

from test.helpers.exact_checks import VOCAB, assert_exact, make_request

FAMILIES = ["llama", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_request_round(family, tiny_engines, tiny_hf):
    rng = random.Random(1)
    requests = [make_request(rng, n, q) for n, q in [(40, 5), (7, 3), (90, 8), (1, 2)]]
    # A request whose state repeats another's tokens: still its own tree.
    requests.append({"prompts": [p[:] for p in requests[0]["prompts"][:2]], "label_token_ids": [[3, 4], [5, 6]]})
    # Duplicate questions, and a question equal to the whole state.
    state = requests[2]["prompts"][0][:90]
    requests.append({"prompts": [state, state + [1], state + [1]], "label_token_ids": [7, 8, 9]})
    stats = assert_exact(tiny_engines[family], tiny_hf[family], requests)
    assert stats.requests == len(requests)
    assert stats.stream_tokens < stats.prompt_tokens


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("state_len", [31, 32, 33, 63, 64, 65])
@pytest.mark.parametrize("n_questions", [1, 300])
def test_state_lengths_and_question_counts(family, state_len, n_questions, tiny_engines, tiny_hf):
    rng = random.Random(state_len * 1000 + n_questions)
    requests = [make_request(rng, state_len, n_questions, shared_labels=True), make_request(rng, 17, 3)]
    assert_exact(tiny_engines[family], tiny_hf[family], requests)


@pytest.mark.parametrize("family", FAMILIES)
def test_depth_three_tree(family, tiny_engines, tiny_hf):
    rng = random.Random(3)
    state = [rng.randrange(VOCAB) for _ in range(50)]
    question = [rng.randrange(VOCAB) for _ in range(6)]
    options = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))] for _ in range(4)]
    prompts = [state + question] + [state + question + o for o in options] + [state + [5, 6]]
    request = {"prompts": prompts, "label_token_ids": [10, 11, 12]}
    assert assert_exact(tiny_engines[family], tiny_hf[family], [request]).levels == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_reordering_changes_nothing(family, tiny_engines):
    rng = random.Random(5)
    requests = [make_request(rng, n, 20) for n in (33, 64, 65, 12)]
    engine = tiny_engines[family]
    base = engine.score_tokens_batch(requests)
    expected = {
        (r, i): lp for r, ans in enumerate(base) for i, lp in enumerate(ans.label_logprobs)
    }
    for trial in range(3):
        order = list(range(len(requests)))
        rng.shuffle(order)
        shuffled, keys = [], []
        for r in order:
            q = list(range(len(requests[r]["prompts"])))
            rng.shuffle(q)
            shuffled.append({
                "prompts": [requests[r]["prompts"][i] for i in q],
                "label_token_ids": [requests[r]["label_token_ids"][i] for i in q],
            })
            keys.append([(r, i) for i in q])
        for ans, ks in zip(engine.score_tokens_batch(shuffled), keys):
            for lp, key in zip(ans.label_logprobs, ks):
                assert max(abs(a - b) for a, b in zip(lp, expected[key])) <= 1e-6


def test_probabilities_follow_sglang_renormalisation(tiny_engines):
    rng = random.Random(9)
    request = make_request(rng, 20, 3, shared_labels=True)
    request["temperature"] = 0.5
    answer = tiny_engines["llama"].score_tokens(request)
    for lp, probs, mass in zip(answer.label_logprobs, answer.probabilities, answer.label_mass):
        expected = torch.softmax(torch.tensor(lp, dtype=torch.float64) / 0.5, 0)
        torch.testing.assert_close(torch.tensor(probs, dtype=torch.float64), expected)
        assert mass == pytest.approx(float(torch.tensor(lp, dtype=torch.float64).exp().sum()), rel=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_forked_is_bitwise_alone(family, tiny_engines):
    """Small forks and states longer than the reference's query block give the
    very same bits inside a round as alone (over the whole vocabulary)."""
    engine = tiny_engines[family]
    rng = random.Random(2)
    long_state = [rng.randrange(VOCAB) for _ in range(600)]
    rounds = [
        [[1, 2], [1, 3]],
        [[5, 3, 1, 3], [5, 3, 511, 511], [5, 3, 1]],
        [long_state + [1, 2, 3], long_state + [4], long_state[:550] + [9]],
    ]
    vocab = list(range(VOCAB))
    for prompts in rounds:
        together = engine.score_tokens({"prompts": prompts, "label_token_ids": vocab}).label_logprobs
        for prompt, got in zip(prompts, together):
            alone = engine.score_tokens({"prompts": [prompt], "label_token_ids": vocab}).label_logprobs[0]
            assert got == alone
