"""Checks shared by the exactness tests: random token requests, and every
question of a round against the same prompt alone and a transformers forward."""

from __future__ import annotations

from .checkpoints import hf_label_logprobs

VOCAB = 512


def make_request(rng, state_len, n_questions, shared_labels=False):
    state = [rng.randrange(VOCAB) for _ in range(state_len)]
    prompts = [state + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(n_questions)]
    if shared_labels:
        labels = rng.sample(range(VOCAB), 4)
    else:
        labels = [rng.sample(range(VOCAB), rng.randint(2, 5)) for _ in prompts]
    return {"prompts": prompts, "label_token_ids": labels}


def labels_of(request, i):
    labels = request["label_token_ids"]
    return labels[i] if isinstance(labels[0], list) else labels


def assert_exact(engine, hf, requests, check_hf=True):
    """Answer ``requests`` as one round; every question must match itself alone
    (1e-5) and transformers (1e-4) with the same argmax. Returns the round's stats."""
    answers = engine.score_tokens_batch(requests)
    stats = answers.stats
    for request, answer in zip(requests, answers):
        assert len(answer.label_logprobs) == len(request["prompts"])
        for i, (prompt, forked) in enumerate(zip(request["prompts"], answer.label_logprobs)):
            labels = labels_of(request, i)
            alone = engine.score_tokens({"prompts": [prompt], "label_token_ids": [labels]}).label_logprobs[0]
            diff = max(abs(a - b) for a, b in zip(forked, alone))
            assert diff <= 1e-5, (i, forked, alone)
            assert forked.index(max(forked)) == alone.index(max(alone))
            if check_hf:
                ref = hf_label_logprobs(hf, prompt, labels)
                diff = max(abs(a - b) for a, b in zip(forked, ref))
                assert diff <= 1e-4, (i, forked, ref)
                assert forked.index(max(forked)) == ref.index(max(ref))
    return stats
