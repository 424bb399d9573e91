"""``--execution-strategy prefix_cache`` (flide_ext/server/prefix_strategy.py): the
server runs a request's state once into the state cache and then each question as
its own request resuming from it, with the same answers as Flide's forked rounds;
bad strategy flags are refused in one line."""

from __future__ import annotations

import asyncio
import sys

import pytest
import requests

from flide_ext import Engine
from flide_ext.server.io_struct import ScoreDone
from flide_ext.server.prefix_strategy import score_question_by_question
from test.helpers.decisions import choice
from test.helpers.processes import quiet_env, serving


@pytest.fixture(scope="module")
def prefix_server(char_model_dir, tmp_path_factory):
    """Rounds of at most 1,000 tokens, at most 2 requests queued."""
    yield from serving([sys.executable, "-m", "sglang.launch_server", "--decision-mode", "--model-path",
                        str(char_model_dir), "--device", "cpu", "--context-length", "2000",
                        "--max-prefill-tokens", "1000", "--max-queued-requests", "2",
                        "--execution-strategy", "prefix_cache"], tmp_path_factory.mktemp("prefix"))


def _metric(url, name):
    for line in requests.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_prefix_cache_answers_as_the_engine_and_resumes_each_question(prefix_server, char_model_dir):
    """A 150-token state and three items: each item's label log-probabilities
    equal the engine's forked answers bit for bit (the CPU reference), and every question resumed
    the state's checkpoint (128 tokens each: the 150-token shared prefix cut to a
    multiple of 64); a decision request answers as the engine too. Three
    questions pass --max-queued-requests 2 (the request holds one slot), and the
    prompt tokens counted are the request's own."""
    engine = Engine(str(char_model_dir), context_length=400)
    query = [3 + (i * 7) % 90 for i in range(150)]
    items = [[5, 6], [7], [8, 9, 10]]
    body = {"query": query, "items": items, "label_token_ids": [1, 2, 3], "return_token_logprobs": True}
    before = _metric(prefix_server, "flide_prompt_tokens_total")
    got = requests.post(f"{prefix_server}/v1/score", json=body)
    assert got.status_code == 200, got.text
    assert _metric(prefix_server, "flide_prompt_tokens_total") - before == got.json()["usage"]["prompt_tokens"] == 456
    want = engine.score_tokens({"prompts": [query + item for item in items], "label_token_ids": [1, 2, 3]})
    assert got.json()["token_logprobs"] == want.label_logprobs
    assert got.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 128
    decision = {"input": "Harbour log: the ferry left at nine, the gulls followed it west. " * 3,
                "questions": [choice("a", 3), choice("b", 2, "Pick")]}
    r = requests.post(f"{prefix_server}/v1/decisions", json=decision)
    assert r.status_code == 200, r.text
    want = engine.decide(decision).model_dump(exclude_none=True)["answers"]
    for qid, answer in want.items():
        got = r.json()["answers"][qid]["probabilities"]
        assert max(abs(got[k] - v) for k, v in answer["probabilities"].items()) <= 1e-6


def test_a_refused_question_is_a_400_naming_its_field(prefix_server):
    """Bad ids, and a state larger than a round: 400 naming the field, the
    latter saying the state was refused; the server goes on."""
    r = requests.post(f"{prefix_server}/v1/score", json={"query": [5, 6, 7], "items": [[8], [10**6]],
                                                         "label_token_ids": [1, 2]})
    assert r.status_code == 400 and r.json()["param"] == "items[1]", r.text
    r = requests.post(f"{prefix_server}/v1/score", json={"query": [6] * 1100, "items": [[1] * 5, [2] * 5],
                                                         "label_token_ids": [1, 2]})
    assert r.status_code == 400 and r.json()["param"] == "items", r.text
    assert "the request's shared state (1089 tokens, run first under --execution-strategy prefix_cache)" in \
        r.json()["message"], r.text
    ok = requests.post(f"{prefix_server}/v1/score", json={"query": [5, 6, 7], "items": [[8]], "label_token_ids": [1]})
    assert ok.status_code == 200


def test_question_by_question_merges_the_answers_in_order():
    """Unit: the state request first (one token past its checkpoint position, one
    label), then one request per question; the answers back in the questions'
    order, stream tokens counting the state's request, cached tokens summed; the
    HTTP request's clock gets its tokenize and transport stages and the metrics
    its own prompt tokens, once."""
    from types import SimpleNamespace

    sent, laps, counted = [], [], []
    clock = SimpleNamespace(lap=laps.append)
    metrics = SimpleNamespace(tokens=lambda *a: counted.append(a))

    async def score_round(prompts, labels, field, over_labels):
        sent.append((list(prompts[0]), labels, over_labels))
        await asyncio.sleep(0.01 * (3 - len(sent)))  # later requests answer first
        return ScoreDone(rid=len(sent), label_logprobs=[[float(len(prompts[0]))]], stream_tokens=len(prompts[0]),
                         round_requests=len(sent), cached_tokens=64 if len(prompts[0]) > 65 else 0)

    state = list(range(70))
    prompts = [state + [1], state + [2, 3]]
    done = asyncio.run(score_question_by_question(score_round, prompts, [[4, 5], [6]], "items", False, clock, metrics))
    assert laps == ["tokenize", "transport"] and counted == [(71 + 72, 65 + 71 + 72, 128)]
    assert sent[0] == (state[:65], [[4]], True)
    assert [s[0] for s in sent[1:]] == prompts and [s[1] for s in sent[1:]] == [[[4, 5]], [[6]]]
    assert done.label_logprobs == [[71.0], [72.0]]
    assert done.stream_tokens == 65 + 71 + 72 and done.cached_tokens == 128 and done.round_requests == 3
    sent.clear()
    done = asyncio.run(score_question_by_question(score_round, [[1, 2], [1, 3]], [[4], [4]], "items", True))
    assert [s[0] for s in sent] == [[1, 2], [1, 3]]  # no state worth caching: the questions alone


@pytest.mark.parametrize("flags, message", [
    (["--execution-strategy", "no_fork"], "--execution-strategy must be one of flide, prefix_cache, not 'no_fork'"),
    (["--execution-strategy", "prefix_cache", "--disable-radix-cache"],
     "--execution-strategy prefix_cache resumes questions from the state cache: remove --disable-radix-cache"),
])
def test_bad_strategy_flags_exit_in_one_line(char_model_dir, flags, message):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path",
                        str(char_model_dir), *flags], capture_output=True, text=True, env=quiet_env(), timeout=120)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"flide: error: {message}"]
