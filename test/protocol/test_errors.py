"""Bad input gets a clear error naming the field, and nothing else in the round
is affected."""

from __future__ import annotations

import pytest

from flide_ext import Engine, ModelLoadError, RequestError
from test.helpers.decisions import choice


def score(qid="s", n=3):
    return {"id": qid, "type": "score", "question": "How much?", "levels": [f"level {i}" for i in range(n)]}


GOOD = [
    {"input": "The cat sat on the mat.", "questions": [choice("a"), choice("b", 4, "Pick"), score("c")]},
    {"input": "Rain is wet.", "questions": [choice("x", 2)]},
]

BAD = {
    "no questions": ({"input": "text", "questions": []}, "questions"),
    "duplicate ids": ({"input": "text", "questions": [choice("a"), choice("a")]}, "questions"),
    "too many options": ({"input": "text", "questions": [choice("a", 27)]}, "questions[0].options"),
    "unknown question type": ({"input": "text", "questions": [{"id": "a", "type": "rank", "question": "?"}]}, "questions[0]"),
    "empty input": ({"input": "  ", "questions": [choice("a")]}, "input"),
    "label not one token": ({"input": "text", "questions": [choice("a"), {"id": "y", "type": "yes_no", "question": "Is it?"}]}, "questions[1]"),
    "prompt over the context length": ({"input": "long " * 40, "questions": [choice("a")]}, "input"),
    "unknown field": ({"input": "text", "questions": [choice("a")], "temprature": 0.5}, "temprature"),
    "bad temperature": ({"input": "text", "questions": [choice("a")], "temperature": 0}, "temperature"),
    "images": ({"input": "text", "questions": [choice("a")], "images": ["data:image/png;base64,AAAA"]}, "images"),
    "not an object": ("just a string", "request"),
    "input of the wrong type": ({"input": 0, "questions": [choice("a")]}, "input"),
    "lone surrogate in input": ({"input": "abc \ud800", "questions": [choice("a")]}, "input"),
    "lone surrogate in an option": ({"input": "x", "questions": [
        {"id": "a", "type": "choice", "question": "?", "options": [{"name": "\ud800"}, {"name": "b"}]}]},
        "questions[0].options[0].name"),
    "lone surrogate in an id": ({"input": "x", "questions": [choice("\udcff")]}, "questions[0].id"),
    "set in a JSON input": ({"input": {"a": {1}}, "questions": [choice("a")]}, "input"),
    "deeply nested input": ({"input": __import__("functools").reduce(lambda acc, _: [acc], range(3000), "x"),
                             "questions": [choice("a")]}, None),
    "template renders nothing": ({"input": "x", "questions": [choice("a")],
                                  "chat_template_kwargs": {"chat_template": "{% if false %}{% endif %}"}},
                                 "chat_template_kwargs"),
}


@pytest.fixture(scope="module")
def engine(char_model_dir):
    # The character tokenizer makes "yes"/"no" three and two tokens: not valid labels.
    return Engine(str(char_model_dir), context_length=160)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_names_the_field(case, engine):
    request, field = BAD[case]
    with pytest.raises(RequestError) as info:
        engine.decide(request)
    assert info.value.field == field or (field is None and info.value.field in ("input", "request")), str(info.value)
    assert info.value.message
    good = engine.decide_batch([request, GOOD[1]])
    assert isinstance(good[0], RequestError) and not isinstance(good[1], RequestError)


def test_bad_requests_leave_the_round_unharmed(engine):
    alone = engine.decide_batch(GOOD)
    assert all(not isinstance(r, RequestError) for r in alone)
    mixed = [BAD["duplicate ids"][0], GOOD[0], BAD["label not one token"][0], BAD["prompt over the context length"][0], GOOD[1]]
    results = engine.decide_batch(mixed)
    assert [isinstance(r, RequestError) for r in results] == [True, False, True, True, False]
    for got, want in zip([results[1], results[4]], alone):
        assert got.model_dump() == want.model_dump()
    assert results.stats.requests == 2


TOKEN_BAD = {
    "empty prompt": ({"prompts": [[1, 2], []], "label_token_ids": [3, 4]}, "prompts[1]"),
    "no prompts": ({"prompts": [], "label_token_ids": [3]}, "prompts"),
    "token outside vocabulary": ({"prompts": [[1, 99999]], "label_token_ids": [3]}, "prompts[0]"),
    "negative token": ({"prompts": [[1, -1]], "label_token_ids": [3]}, "prompts[0]"),
    "label outside vocabulary": ({"prompts": [[1, 2]], "label_token_ids": [3, 128]}, "label_token_ids"),
    "repeated label": ({"prompts": [[1, 2]], "label_token_ids": [[3, 3]]}, "label_token_ids[0]"),
    "empty labels": ({"prompts": [[1, 2]], "label_token_ids": []}, "label_token_ids"),
    "label lists do not match prompts": ({"prompts": [[1], [2]], "label_token_ids": [[3, 4]]}, "label_token_ids"),
    "prompt over the context length": ({"prompts": [[1] * 160], "label_token_ids": [3]}, "prompts[0]"),
    "label not an integer": ({"prompts": [[1, 2]], "label_token_ids": ["A"]}, "label_token_ids"),
    "booleans as token ids": ({"prompts": [[True, False]], "label_token_ids": [3]}, "prompts[0]"),
    "a float as a token id": ({"prompts": [[1, 2.0]], "label_token_ids": [3]}, "prompts[0]"),
}


@pytest.mark.parametrize("case", sorted(TOKEN_BAD))
def test_bad_token_request_names_the_field(case, engine):
    request, field = TOKEN_BAD[case]
    with pytest.raises(RequestError) as info:
        engine.score_tokens(request)
    assert info.value.field.startswith(field), str(info.value)


def test_bad_token_requests_leave_the_round_unharmed(engine):
    good = [{"prompts": [[5, 6, 7, 8], [5, 6, 9]], "label_token_ids": [1, 2, 3]}, {"prompts": [[40] * 30], "label_token_ids": [[7, 8]]}]
    alone = engine.score_tokens_batch(good)
    mixed = engine.score_tokens_batch([TOKEN_BAD["empty prompt"][0], good[0], TOKEN_BAD["repeated label"][0], good[1]])
    assert isinstance(mixed[0], RequestError) and isinstance(mixed[2], RequestError)
    assert mixed[1] == alone[0] and mixed[3] == alone[1]


def test_unknown_model_path(tmp_path):
    with pytest.raises(ModelLoadError, match="neither a checkpoint directory nor a built-in model"):
        Engine(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        Engine(str(tmp_path))


def test_unknown_dtype_device_and_context(char_model_dir):
    with pytest.raises(ValueError, match="dtype 'float8'"):
        Engine(str(char_model_dir), dtype="float8")
    with pytest.raises(ModelLoadError, match="device"):
        Engine(str(char_model_dir), device="bogus")
    with pytest.raises(ValueError, match="context_length"):
        Engine(str(char_model_dir), context_length=-5)


def test_damaged_weights(char_model_dir, tmp_path):
    import shutil

    shutil.copytree(char_model_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        Engine(str(tmp_path / "m"))


def test_threads_share_an_engine_safely(engine):
    from concurrent.futures import ThreadPoolExecutor

    requests = [{"prompts": [[5, 6, 7, i], [5, 6, 8]], "label_token_ids": [1, 2]} for i in range(12)]
    sequential = [engine.score_tokens(r) for r in requests]
    with ThreadPoolExecutor(4) as pool:
        single = list(pool.map(engine.score_tokens, requests))
        batches = list(pool.map(lambda r: engine.score_tokens_batch([r, r])[1], requests))
    assert single == sequential and batches == sequential
