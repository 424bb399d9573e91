"""Hybrid Gated DeltaNet models (Qwen3.5, Qwen3-Next): exact state forking in
levels, checkpoint and resume, float32 on CPU against themselves alone and a
transformers float32 forward."""

from __future__ import annotations

import random

import pytest

from test.helpers.checkpoints import hf_label_logprobs, write_tiny_checkpoint
from test.helpers.exact_checks import VOCAB, assert_exact, make_request
from test.helpers.processes import flide

HYBRIDS = ["qwen3_5", "qwen3_next"]


@pytest.mark.parametrize("family", HYBRIDS)
def test_multi_request_round(family, tiny_engines, tiny_hf):
    rng = random.Random(11)
    requests = [make_request(rng, n, q) for n, q in [(70, 5), (3, 4), (130, 6), (1, 2)]]
    state = requests[0]["prompts"][0][:70]
    # Duplicates, a question equal to the state, one-token questions.
    requests.append({"prompts": [state, state + [1], state + [1], state + [2]], "label_token_ids": [7, 8, 9]})
    stats = assert_exact(tiny_engines[family], tiny_hf[family], requests)
    assert stats.stream_tokens < stats.prompt_tokens


@pytest.mark.parametrize("family", HYBRIDS)
@pytest.mark.parametrize("state_len", [1, 2, 3, 63, 64, 65, 127, 128, 129])
def test_state_lengths_with_one_token_questions(family, state_len, tiny_engines, tiny_hf):
    rng = random.Random(state_len)
    state = [rng.randrange(VOCAB) for _ in range(state_len)]
    one_token = [state + [t] for t in rng.sample(range(VOCAB), 4)]
    longer = [state + [rng.randrange(VOCAB) for _ in range(rng.randint(2, 70))] for _ in range(2)]
    request = {"prompts": one_token + longer, "label_token_ids": [3, 4, 5]}
    assert_exact(tiny_engines[family], tiny_hf[family], [request, make_request(rng, 5, 2)])


@pytest.mark.parametrize("family", HYBRIDS)
def test_depth_three_tree_equals_each_leaf_alone(family, tiny_engines, tiny_hf):
    rng = random.Random(4)
    state = [rng.randrange(VOCAB) for _ in range(66)]
    question = [rng.randrange(VOCAB) for _ in range(2)]  # shorter than the conv window
    options = [[t] for t in rng.sample(range(VOCAB), 3)] + [[rng.randrange(VOCAB) for _ in range(5)]]
    prompts = [state + question + o for o in options] + [state + question, state + [9]]
    tiny_engines[family].flush_cache()
    stats = assert_exact(tiny_engines[family], tiny_hf[family], [{"prompts": prompts, "label_token_ids": [1, 2]}])
    assert stats.levels == 4  # state, question, options, and the state cut at its checkpoint (64 tokens)


def growing_history(rng, n):
    return [rng.randrange(VOCAB) for _ in range(n)]


def questions_after(rng, history, n=3):
    firsts = rng.sample(range(VOCAB), n)  # distinct first tokens: the state is exactly the history
    return [history + [f] + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 4))] for f in firsts]


@pytest.mark.parametrize("family", HYBRIDS + ["qwen3"])
@pytest.mark.parametrize("split", [1, 63, 64, 65, 100, 129])
def test_checkpoint_then_resume_equals_one_call(family, split, tiny_engines):
    """A request leaves its state in the state cache at its last checkpoint
    position (a multiple of 64 tokens); a longer one resumes from it and gives
    the bits of one cold call."""
    engine = tiny_engines[family]
    rng = random.Random(split)
    history = growing_history(rng, 140)
    prompts = questions_after(rng, history)
    labels = [5, 6, 7]
    engine.flush_cache()
    one_call = engine.score_tokens({"prompts": prompts, "label_token_ids": labels}).label_logprobs
    engine.flush_cache()
    first = engine.score_tokens({"prompts": [history[:split]], "label_token_ids": labels})
    kept = (split - 1) // 64 * 64  # its state is all but its last token
    assert first.checkpoint_tokens == kept
    batch = engine.score_tokens_batch([{"prompts": prompts, "label_token_ids": labels}])
    resumed = batch[0]
    assert resumed.resumed_tokens == kept
    computed = sum(len(p) for p in prompts) - len(prompts) * len(history) + (len(history) - kept)
    assert batch.stats.stream_tokens == computed
    assert resumed.label_logprobs == one_call
    engine.flush_cache()


@pytest.mark.parametrize("family", HYBRIDS)
def test_eight_successive_resumes_of_a_growing_history(family, tiny_engines, tiny_hf):
    engine = tiny_engines[family]
    engine.flush_cache()
    rng = random.Random(8)
    history = []
    previous = 0
    for step in range(8):
        history = history + growing_history(rng, rng.randint(1, 40))
        prompts = questions_after(rng, history, n=2)
        answer = engine.score_tokens({"prompts": prompts, "label_token_ids": [1, 2, 3]})
        assert answer.resumed_tokens == previous
        checkpoint = len(history) // 64 * 64
        assert answer.checkpoint_tokens == (checkpoint if checkpoint > previous else 0)
        previous = max(previous, checkpoint)
        for prompt, got in zip(prompts, answer.label_logprobs):
            ref = hf_label_logprobs(tiny_hf[family], prompt, [1, 2, 3])
            assert max(abs(x - y) for x, y in zip(got, ref)) <= 1e-4
            assert got.index(max(got)) == ref.index(max(ref))
    assert previous >= 128
    cold = engine.__class__(str(engine.path), radix_cache=False).score_tokens(
        {"prompts": prompts, "label_token_ids": [1, 2, 3]})
    assert answer.label_logprobs == cold.label_logprobs
    engine.flush_cache()


@pytest.mark.parametrize("family", HYBRIDS + ["llama"])
def test_same_request_cold_then_warm_is_identical(family, tiny_engines):
    engine = tiny_engines[family]
    engine.flush_cache()
    rng = random.Random(3)
    history = growing_history(rng, 90)
    request = {"prompts": questions_after(rng, history, n=4), "label_token_ids": [1, 2]}
    cold = engine.score_tokens(request)
    warm = engine.score_tokens(request)
    assert cold.resumed_tokens == 0 and warm.resumed_tokens == 64
    assert warm.label_logprobs == cold.label_logprobs
    assert warm.probabilities == cold.probabilities
    engine.flush_cache()


def test_flide_decide_with_a_qwen35_checkpoint_directory(tmp_path):
    """A tiny Qwen3.5 with the real Qwen3.5 tokenizer (vocabulary 248,320) answers
    decision requests through the CLI, and the answers match the engine's."""
    import json

    from flide_ext import Engine
    from flide_ext.assets.qwen35_tokenizer import write_qwen35_tokenizer

    model = write_tiny_checkpoint(tmp_path / "qwen35", "qwen3_5", vocab_size=248320, tie_word_embeddings=True)
    write_qwen35_tokenizer(model)
    request = {
        "input": "The meeting moved to Thursday at 3 pm.",
        "questions": [
            {"id": "day", "type": "choice", "question": "Which day?", "options": [{"name": "Tuesday"}, {"name": "Thursday"}]},
            {"id": "moved", "type": "yes_no", "question": "The meeting moved."},
            {"id": "sure", "type": "score", "question": "How certain?", "levels": ["low", "mid", "high"]},
        ],
    }
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "r1", "request": request}) + "\n")
    run = flide("decide", "--model", str(model), "--input", str(src))
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)["response"]["answers"]
    want = Engine(str(model)).decide(request).model_dump(exclude_none=True)["answers"]
    assert set(got) == {"day", "moved", "sure"}
    for qid in got:
        assert got[qid]["probabilities"] == pytest.approx(want[qid]["probabilities"], abs=1e-6)


@pytest.mark.parametrize("family", HYBRIDS)
def test_forked_and_resumed_are_bitwise_alone(family, tmp_path):
    """With peaked logits (label log-probabilities far below zero), a question in a
    round and after successive resumes gives the same bits as alone."""
    from flide_ext import Engine

    directory = write_tiny_checkpoint(tmp_path / family, family, seed=5, head_scale=20.0)
    engine = Engine(str(directory))
    rng = random.Random(2)
    state = [rng.randrange(VOCAB) for _ in range(300)]
    prompts = [state + [rng.randrange(VOCAB) for _ in range(2)] for _ in range(4)]
    labels = list(range(0, VOCAB, 3))
    together = engine.score_tokens({"prompts": prompts, "label_token_ids": labels}).label_logprobs
    for prompt, got in zip(prompts, together):
        assert got == engine.score_tokens({"prompts": [prompt], "label_token_ids": labels}).label_logprobs[0]
    engine.flush_cache()
    for split in (150, 170, 299):  # checkpoints at 128 and 256 tokens
        engine.score_tokens({"prompts": [state[:split]], "label_token_ids": labels})
    resumed = engine.score_tokens({"prompts": prompts, "label_token_ids": labels})
    assert resumed.resumed_tokens == 256 and resumed.label_logprobs == together


def test_a_failing_round_raises_its_own_error_and_frees_its_slots(tiny_dirs, monkeypatch):
    from flide_ext import Engine

    engine = Engine(str(tiny_dirs["qwen3_5"]))
    state = list(range(3, 73))
    request = {"prompts": [state + [4], state + [5]], "label_token_ids": [1]}

    def broken(*args, **kwargs):
        raise MemoryError("simulated")

    monkeypatch.setattr(engine.model, "forward", broken)
    with pytest.raises(MemoryError, match="simulated"):
        engine.score_tokens(request)
    pool = engine.state_pool
    assert pool.capacity == len(pool.free) and engine.cache_stats()["nodes"] == 0
    assert engine.runner.kv_pool.num_free == engine.runner.kv_pool.rows
    monkeypatch.undo()
    assert engine.score_tokens(request).checkpoint_tokens == 64
