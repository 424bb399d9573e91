"""The real server (``flide serve``) as a subprocess on CPU: SGLang's wire format,
answers equal to the Engine's, concurrency without loss, bad input as 4xx, the
state cache's cached tokens and ``/flush_cache``."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys

import pytest
import requests

from flide_ext import Engine
from flide_ext.protocol.decisions import parse_decision_request
from test.helpers import EXAMPLES
from test.helpers.decisions import choice
from test.helpers.processes import quiet_env, serving

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(char_model_dir, tmp_path_factory):
    yield from serving([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", str(char_model_dir),
                        "--api-key", KEY, "--context-length", "400", "--round-tokens", "3000"],
                       tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def engine(char_model_dir):
    return Engine(str(char_model_dir), context_length=400)


def random_request(rng):
    words = ["cat", "dog", "sky", "blue", "rain", "sun", "tree", "road"]
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 25)))
    questions = [choice(f"q{i}", rng.randint(2, 6), f"Pick {rng.choice(words)}") for i in range(rng.randint(1, 6))]
    if rng.random() < 0.3:
        questions.append({"id": "s", "type": "score", "question": "How much?", "levels": ["low", "mid", "high"]})
    return {"input": text, "questions": questions}


def test_decisions_match_the_engine(server, engine):
    rng = random.Random(0)
    for _ in range(5):
        request = {**random_request(rng), "return_prompt_token_ids": True}
        got = requests.post(f"{server}/v1/decisions", json=request, headers=AUTH).json()
        want = engine.decide(request).model_dump(exclude_none=True)
        encoded = engine.renderer.encode(parse_decision_request(request))
        for q, enc in zip(request["questions"], encoded):
            a, b = got["answers"][q["id"]], want["answers"][q["id"]]
            assert a["prompt_token_ids"] == enc.prompt_ids and a["label_token_ids"] == enc.label_ids
            for name in b["probabilities"]:
                assert abs(a["probabilities"][name] - b["probabilities"][name]) <= 1e-6
            assert abs(a["label_mass"] - b["label_mass"]) <= 1e-6


def test_score_route_matches_the_engine(server, engine):
    body = {"query": "Sky is ", "items": ["blue", "red", "green"], "label_token_ids": [1, 2, 3], "apply_softmax": True}
    got = requests.post(f"{server}/v1/score", json=body, headers=AUTH).json()
    tok = engine.renderer.tokenizer
    query = tok.encode("Sky is ")
    prompts = [query + tok.encode(item, add_special_tokens=False) for item in body["items"]]
    want = engine.score_tokens({"prompts": prompts, "label_token_ids": [1, 2, 3]}).probabilities
    for a, b in zip(got["scores"], want):
        assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-6


async def _concurrent(url, bodies, clients):
    import aiohttp

    results = [None] * len(bodies)
    queue = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)

    async def client(session):
        while not queue.empty():
            i = queue.get_nowait()
            async with session.post(f"{url}/v1/decisions", json=bodies[i], headers=AUTH) as r:
                results[i] = (r.status, await r.json())

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return results


def test_64_clients_1000_requests_lose_nothing(server, engine):
    rng = random.Random(1)
    unique = [random_request(rng) for _ in range(100)]
    alone = [engine.decide(r).model_dump(exclude_none=True) for r in unique]
    order = [rng.randrange(len(unique)) for _ in range(1000)]
    results = asyncio.run(_concurrent(server, [unique[i] for i in order], clients=64))
    for i, (status, body) in zip(order, results):
        assert status == 200, body
        for qid, answer in alone[i]["answers"].items():
            got = body["answers"][qid]["probabilities"]
            assert max(abs(got[k] - v) for k, v in answer["probabilities"].items()) <= 1e-6
    assert requests.get(f"{server}/health", timeout=5).status_code == 200


BAD = {
    "malformed JSON": ("{not json", "body"),
    "unknown question type": ({"input": "x", "questions": [{"id": "a", "type": "rank", "question": "?"}]}, "questions[0]"),
    "duplicate ids": ({"input": "x", "questions": [choice("a"), choice("a")]}, "questions"),
    "too many options": ({"input": "x", "questions": [choice("a", 27)]}, "questions[0].options"),
    "label not one token": ({"input": "x", "questions": [{"id": "y", "type": "yes_no", "question": "Is it?"}]}, "questions[0]"),
    "input over the context length": ({"input": "word " * 100, "questions": [choice("a")]}, "input"),
    "empty input": ({"input": "", "questions": [choice("a")]}, "input"),
    # Each prompt fits the context; together they need more than one round (3000 tokens).
    "questions over a round's capacity": (
        {"input": "x", "questions": [choice(f"q{i}", 2, f"Pick {i} " + "z" * 150) for i in range(30)]}, "questions"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_400_naming_the_field(case, server):
    body, field = BAD[case]
    data = body if isinstance(body, str) else json.dumps(body)
    r = requests.post(f"{server}/v1/decisions", data=data, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["param"] == field and r.json()["message"]
    ok = requests.post(f"{server}/v1/decisions", json={"input": "x", "questions": [choice("a")]}, headers=AUTH)
    assert ok.status_code == 200


def test_wrong_api_key_is_401(server):
    """SGLang's own API-key middleware answers, with its body; probes need no key."""
    r = requests.post(f"{server}/v1/decisions", json={"input": "x", "questions": [choice("a")]},
                      headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    lower = requests.post(f"{server}/v1/decisions", json={"input": "x", "questions": [choice("a")]},
                          headers={"Authorization": f"bearer {KEY}"})
    assert lower.status_code == 200  # the scheme in any case, as SGLang reads it
    assert requests.get(f"{server}/health").status_code == 200


def test_disconnected_clients_lose_no_other_answer(server, engine):
    rng = random.Random(2)
    bodies = [random_request(rng) for _ in range(40)]

    async def run():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            async def impatient(body):
                try:
                    async with session.post(f"{server}/v1/decisions", json=body, headers=AUTH,
                                            timeout=aiohttp.ClientTimeout(total=0.001)) as r:
                        await r.read()
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    pass

            async def patient(body):
                async with session.post(f"{server}/v1/decisions", json=body, headers=AUTH) as r:
                    return r.status, await r.json()

            tasks = [impatient(b) if i % 2 else patient(b) for i, b in enumerate(bodies)]
            return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    for i, result in enumerate(results):
        if i % 2 == 0:
            status, body = result
            assert status == 200
            want = engine.decide(bodies[i]).model_dump(exclude_none=True)
            assert body["answers"].keys() == want["answers"].keys()


def test_info_routes_and_metrics(server):
    models = requests.get(f"{server}/v1/models", headers=AUTH).json()
    assert models["data"][0]["max_model_len"] == 400
    for path in ("/model_info", "/get_model_info", "/server_info"):
        assert requests.get(f"{server}{path}", headers=AUTH).json()["context_length"] == 400
    text = requests.get(f"{server}/metrics").text
    saved = [line for line in text.splitlines() if line.startswith("flide_tokens_saved_total ")]
    assert saved and float(saved[0].split()[1]) > 0
    assert 'flide_requests_total{route="/v1/decisions",status="200"}' in text
    assert "flide_request_latency_seconds_bucket" in text


def test_sgl_decide_example_runs_against_the_live_server(server, engine):
    example = EXAMPLES / "sgl_decide.py"
    run = subprocess.run([sys.executable, str(example), "--url", server, "--api-key", KEY], capture_output=True,
                         text=True, env=quiet_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.strip().splitlines())
    assert set(lines) == {"category", "refund", "urgency"}
    import sglang as sgl

    from flide_ext.entrypoints.lang import FlideEndpoint

    @sgl.function
    def program(s):
        s += "Sky report: clear and blue.\n"
        s += sgl.decide("d", questions=[choice("q1", 3), choice("q2", 2, "Pick")])

    state = program.run(backend=FlideEndpoint(server, api_key=KEY))
    answers = state.get_meta_info("d")["answers"]
    want = engine.decide({"input": "Sky report: clear and blue.\n", "questions": [choice("q1", 3), choice("q2", 2, "Pick")]})
    for qid in ("q1", "q2"):
        assert state[qid] == want.answers[qid].choice == answers[qid]["choice"]
        for name, p in want.answers[qid].probabilities.items():
            assert abs(answers[qid]["probabilities"][name] - p) <= 1e-6


def test_schemathesis_finds_no_server_error(server, tmp_path):
    """Schema-driven fuzzing of the decision routes: no input may cause a 5xx."""
    assert requests.get(f"{server}/openapi.json").status_code == 401  # behind the key, as SGLang's schema is
    schema = requests.get(f"{server}/openapi.json", headers=AUTH).json()
    assert "DecisionRequest" in schema["components"]["schemas"]
    cli = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    run = subprocess.run(
        [cli, "run", f"{server}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "40",
         "--include-path-regex", "^/v1/(decisions|systemone|score)$", "--header", f"Authorization: Bearer {KEY}",
         "--seed", "1", "--no-color"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "Tested: 3" in run.stdout, run.stdout[-2000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert generated and int(generated[1]) >= 100 and generated[1] == generated[2], run.stdout[-2000:]
    assert requests.get(f"{server}/health").status_code == 200


def test_systemone_route(server, engine):
    from flide_ext.protocol.systemone import SystemOneRenderer

    body = {"state": "Rain all day.", "model": "any", "questions": {
        "mood": {"type": "choice", "instructions": "Weather?", "criteria": {"wet": "rain", "dry": None, "snowy": "snow"}},
        "level": {"type": "score", "instructions": "How wet?", "criteria": ["dry", "damp", "soaked"]}}}
    r = requests.post(f"{server}/v1/systemone", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    got = r.json()
    renderer = SystemOneRenderer(engine.renderer, "any")
    request = renderer.parse(body)
    views, encoded = renderer.encode(request)
    logprobs = engine.run_round([([q.prompt_ids for q in encoded], [q.label_ids for q in encoded])]).answers[0]
    want = renderer.respond(request, views, encoded, logprobs).model_dump()
    for qid in ("mood", "level"):
        for name, p in want["answers"][qid]["probabilities"].items():
            assert abs(got["answers"][qid]["probabilities"][name] - p) <= 1e-6
    assert got["answers"]["mood"]["choice"] == want["answers"]["mood"]["choice"]
    assert got["answers"]["level"]["legend"] == {"0": "dry", "1": "damp", "2": "soaked"}
    bad = requests.post(f"{server}/v1/systemone", json={**body, "temperature": 0.5}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["param"] == "temperature"
    noul = requests.post(f"{server}/v1/systemone", json={"state": "x", "model": "m", "questions": {
        "q": {"type": "noul", "instructions": "Is it?"}}}, headers=AUTH)
    assert noul.status_code == 400 and noul.json()["param"] == "questions.q"  # yes/no labels are not one char token


def _metric(text: str, name: str) -> float:
    values = [line.split()[1] for line in text.splitlines() if line.split(" ", 1)[0] == name]
    assert values, f"{name} not in /metrics"
    return float(values[0])


def test_score_ids_outside_the_vocabulary_are_400(server):
    """Token ids are checked as arrays: a negative id, one past the vocabulary and
    one beyond int64 are each a 400 naming the field; the server goes on."""
    base = {"query": [5, 6, 7], "items": [[8], [9]], "label_token_ids": [1, 2]}
    for field, body in (("query", {**base, "query": [5, -1]}), ("items[1]", {**base, "items": [[8], [10**6]]}),
                        ("query", {**base, "query": [2**70]})):
        r = requests.post(f"{server}/v1/score", json=body, headers=AUTH)
        assert r.status_code == 400 and r.json()["param"] == field, r.text
    ok = requests.post(f"{server}/v1/score", json=base, headers=AUTH)
    assert ok.status_code == 200 and len(ok.json()["scores"]) == 2


def test_flush_cache_and_cached_tokens(server):
    """A growing history resumes from the state cache (checkpoints every 64
    tokens), reported as SGLang's usage.prompt_tokens_details.cached_tokens;
    after /flush_cache the same request computes everything again, to the same bits."""
    history = "Harbour log: the ferry left at nine, the gulls followed it west, the fog lifted by ten. " * 2
    question = [choice("a", 3), choice("b", 2, "Pick")]

    def decide(text):
        r = requests.post(f"{server}/v1/decisions", json={"input": text, "questions": question}, headers=AUTH)
        assert r.status_code == 200, r.text
        return r.json()

    decide(history)
    grown = decide(history + "Noon: rain.")
    assert grown["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64
    metrics = requests.get(f"{server}/metrics").text
    assert _metric(metrics, "flide_cached_tokens_total") >= 64
    assert _metric(metrics, "flide_state_cache_hits_total") >= 1
    assert _metric(metrics, "flide_state_cache_tokens") >= 64 and _metric(metrics, "flide_state_cache_nodes") >= 1
    assert 0 < _metric(metrics, "flide_state_cache_bytes") <= _metric(metrics, "flide_state_cache_budget_bytes")
    assert _metric(metrics, "flide_state_cache_enabled") == 1
    assert "flide_state_cache_evicted_nodes_total" in metrics
    score = {"query": history, "items": ["calm", "storm"], "label_token_ids": [1, 2, 3]}
    requests.post(f"{server}/v1/score", json=score, headers=AUTH)
    scored = requests.post(f"{server}/v1/score", json=score, headers=AUTH).json()
    assert scored["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64

    assert requests.post(f"{server}/flush_cache").status_code == 401  # behind the API key, like SGLang's
    flushed = requests.post(f"{server}/flush_cache", headers=AUTH)
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    assert _metric(requests.get(f"{server}/metrics").text, "flide_state_cache_tokens") == 0
    again = decide(history + "Noon: rain.")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["answers"] == grown["answers"]  # bitwise: resumed or recomputed, the same floats
    assert requests.get(f"{server}/flush_cache", headers=AUTH).status_code == 200  # SGLang takes GET too
    rescored = requests.post(f"{server}/v1/score", json=score, headers=AUTH).json()
    assert rescored["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert rescored["scores"] == scored["scores"]
    info = requests.get(f"{server}/server_info", headers=AUTH).json()
    assert info["disable_radix_cache"] is False and info["state_cache_bytes"] == 256 << 20  # the CPU default
    assert info["residual_dtype"] == "float32"
