"""The tokenizer manager's parsing half: requests are tokenised off the event
loop unless their body is small, and a text whose lower bound on tokens already passes the context length
is refused before anything tokenises it. The bound itself is checked against
real tokenizers (character-level, byte-level BPE with NFC) on hostile texts."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from flide_ext.protocol.errors import RequestError
from flide_ext.protocol.token_bound import SLACK_BYTES, TokenBound
from flide_ext.server.metrics import Metrics
from flide_ext.server.tokenizer_manager import BODY_BYTES, INLINE_BODY_BYTES, TokenizerManager
from test.helpers.checkpoints import write_char_tokenizer
from test.helpers.decisions import choice

CONTEXT = 400


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(write_char_tokenizer(tmp_path_factory.mktemp("chars")))


@pytest.fixture(scope="module")
def byte_level_tokenizer():
    """A byte-level BPE (GPT-2's scheme) with an NFC normalizer and a special
    token, trained here on a little mixed-script text."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog " * 20, "caf\u00e9 na\u00efve r\u00e9sum\u00e9 " * 20,
              "\ud55c\uad6d\uc5b4 \u65e5\u672c\u8a9e \u4e2d\u6587 " * 20, "    indented code();\n" * 20]
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def byte_tokenizer():
    """Byte-level, NFC, no merges: every byte of the normalised text is one
    token, so the bound is as tight as it gets and any error in it shows."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _hostile_texts(rng: random.Random):
    pieces = ["a", " ", "\n", "\t", "\x00", "\x07", "\x7f", "e\u0301", "\u0301", "\u1100\u1161\u11a8", "\ud55c",
              "\U0001f600", "\u00e9", "\ufb01", "<|endoftext|>", "<|user|>", "ab" * 20, " " * 40, "-" * 30, "\u200b"]
    for _ in range(60):
        yield "".join(rng.choice(pieces) for _ in range(rng.randint(1, 400)))


def test_the_bound_is_a_lower_bound(char_tokenizer, byte_level_tokenizer, byte_tokenizer):
    rng = random.Random(0)
    for tokenizer in (char_tokenizer, byte_level_tokenizer, byte_tokenizer):
        bound = TokenBound(tokenizer)
        assert bound.enabled
        positive = 0
        for text in _hostile_texts(rng):
            tokens = len(tokenizer.encode(text, add_special_tokens=False))
            at_least = bound.at_least(text)
            assert at_least <= tokens, (text, at_least, tokens)
            positive += at_least > 0
            if tokenizer is byte_tokenizer:  # one token a byte: the bound is the count, less the slack
                assert at_least >= tokens - SLACK_BYTES, (text, at_least, tokens)
        assert positive > 30  # not vacuous: most long texts get a positive bound
        # Inside a prompt: a template around the text (ending in a letter a
        # leading combining mark composes with) never makes fewer tokens.
        for text in _hostile_texts(rng):
            prompt = "<|user|>Question about e" + text + "\nAnswer:"
            assert bound.at_least(text) <= len(tokenizer.encode(prompt, add_special_tokens=False))


def test_the_bound_is_off_where_a_tokenizer_can_swallow_text():
    """WordPiece ([UNK] for a long word), a pre-tokenizer that removes
    whitespace, a normalizer that is not a Unicode normal form, an added token
    that strips the spaces around it: no bound."""
    vocab = {c: i for i, c in enumerate(["[UNK]", "a", "b", " "])}
    wordpiece = Tokenizer(models.WordPiece(vocab={**vocab, "##a": 4}, unk_token="[UNK]"))
    whitespace = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    whitespace.pre_tokenizer = pre_tokenizers.Whitespace()
    lowercase = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    lowercase.normalizer = normalizers.Lowercase()
    stripping = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[])))
    from tokenizers import AddedToken

    stripping.add_special_tokens({"additional_special_tokens": [AddedToken("<mask>", lstrip=True)]})
    plain = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, " ": 2}, merges=[]))
    for tokenizer in (wordpiece, whitespace, lowercase):
        assert not TokenBound(PreTrainedTokenizerFast(tokenizer_object=tokenizer)).enabled
    assert not TokenBound(stripping).enabled
    on = TokenBound(PreTrainedTokenizerFast(tokenizer_object=plain))
    assert on.enabled and on.at_least("ab" * 100) == 200 - 8  # one token a kept byte, less the slack


class SpyTokenizer:
    """A tokenizer that records the length of every text it tokenises, and the thread it ran on."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.texts, self.threads = [], set()

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def encode(self, text, **kwargs):
        self.texts.append(len(text))
        self.threads.add(threading.get_ident())
        return self._tokenizer.encode(text, **kwargs)


@pytest.fixture
def manager(char_tokenizer):
    spy = SpyTokenizer(char_tokenizer)
    tm = TokenizerManager(spy, CONTEXT, 100, "ipc:///nonexistent/flide-test", None, Metrics())
    yield tm
    tm.work.close(linger=0)


def _refusal(coroutine) -> RequestError:
    with pytest.raises(RequestError) as caught:
        asyncio.run(coroutine)
    return caught.value


def test_huge_texts_are_refused_before_they_are_tokenised(manager):
    huge = "word " * 200_000  # 1 MB
    cases = [
        (manager.decide({"input": huge, "questions": [choice("a")]}), "input"),
        (manager.decide_systemone({"state": huge, "model": "m",
                                   "questions": {"q": {"type": "choice", "instructions": "?",
                                                       "criteria": {"A": None, "B": None}}}}), "state"),
        (manager.score_request({"query": huge, "items": ["a"], "label_token_ids": [1]}), "query"),
    ]
    # A question's own texts (its question, options, levels) count with the input's.
    cases += [
        (manager.decide({"input": "hi", "questions": [choice("a"), choice("b", question=huge)]}), "questions[1]"),
        (manager.decide({"input": "hi", "questions": [{"id": "s", "type": "score", "question": "?",
                                                       "levels": ["low", huge]}]}), "questions[0]"),
        (manager.decide({"input": "i" * 2000, "questions": [choice("a", question="q" * 4000)]}), "questions[0]"),
    ]
    for coroutine, field in cases:
        error = _refusal(coroutine)
        assert error.field == field and "at least" in error.message and f"{CONTEXT} tokens" in error.message
    assert manager.tokenizer.texts == []
    # The query's own tokens count against an item's bound: a 300-token query and
    # a 2,000-byte item (at least 153 tokens) cannot fit 400 tokens.
    error = _refusal(manager.score_request({"query": "q" * 300, "items": ["ok", "i" * 2000], "label_token_ids": [1]}))
    assert error.field == "items[1]" and manager.tokenizer.texts == [300, 2]


def test_tokenising_runs_off_the_event_loop(manager):
    """A text under the bound but over the context length is tokenised (in a
    worker thread), then refused by its real token count."""

    async def decide():
        loop_thread = threading.get_ident()
        with pytest.raises(RequestError) as caught:
            await manager.decide({"input": "word " * 200, "questions": [choice("a")]})
        return loop_thread, caught.value

    loop_thread, error = asyncio.run(decide())
    assert error.field == "input" and "does not fit the context length" in error.message
    assert manager.tokenizer.texts and loop_thread not in manager.tokenizer.threads


@pytest.mark.parametrize("body_bytes", [1_000, INLINE_BODY_BYTES, INLINE_BODY_BYTES + 1])
def test_small_bodies_are_tokenised_on_the_event_loop(manager, body_bytes):
    """The HTTP server names the body's size: up to INLINE_BODY_BYTES it is
    tokenised on the event loop's thread (no hop to a worker and back), past it
    in a worker thread."""

    async def decide():
        BODY_BYTES.set(body_bytes)
        with pytest.raises(RequestError) as caught:
            await manager.decide({"input": "word " * 200, "questions": [choice("a")]})
        return threading.get_ident(), caught.value

    loop_thread, error = asyncio.run(decide())
    assert error.field == "input" and "does not fit the context length" in error.message
    assert len(manager.tokenizer.threads) == 1
    assert (loop_thread in manager.tokenizer.threads) == (body_bytes <= INLINE_BODY_BYTES)


def test_a_failed_scheduler_reaches_requests_past_zmqs_queue_limit(char_tokenizer, tmp_path):
    """ZMQ holds at most 1,000 unsent messages by default, and a send past that
    waited for a scheduler that never reads: those requests hung after fail().
    With 1,500 requests sent to a scheduler that reads nothing, every one is
    answered SchedulerUnavailable once the manager fails."""
    import numpy as np
    import zmq
    import zmq.asyncio

    from flide_ext.server.tokenizer_manager import SchedulerUnavailable

    async def run():
        silent = zmq.Context()  # the stopped scheduler: bound, never read
        work = silent.socket(zmq.PULL)
        work.setsockopt(zmq.RCVHWM, 1)
        work.bind(f"ipc://{tmp_path}/work")
        done = zmq.asyncio.Context.instance().socket(zmq.PULL)
        done.bind(f"ipc://{tmp_path}/done")
        manager = TokenizerManager(char_tokenizer, CONTEXT, 100, f"ipc://{tmp_path}/work", done, Metrics())
        prompt = [np.arange(1, 9, dtype=np.int64)]
        tasks = [asyncio.ensure_future(manager.score(prompt, [[1, 2]])) for _ in range(1500)]
        await asyncio.sleep(0.5)  # every send done or waiting
        manager.fail("the scheduler sent no heartbeat")
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        done.close(linger=0)
        work.close(linger=0)
        silent.term()
        return results

    results = asyncio.run(run())
    assert len(results) == 1500 and all(isinstance(r, SchedulerUnavailable) for r in results), \
        {type(r).__name__ for r in results}


def test_item_ids_are_checked_at_once_and_the_first_bad_item_is_named(manager):
    """Every item's ids are checked against the vocabulary (100 here) in one pass;
    a bad id is refused naming the first item that holds one, before any work."""
    base = {"query": [5, 6], "label_token_ids": [1]}
    cases = (([[8], [9, -1], [10**6]], "items[1]"), ([[8]] * 40 + [[100]], "items[40]"),
             ([[8], [], [2**70]], "items[2]"))
    for items, field in cases:
        error = _refusal(manager.score_request({**base, "items": items}))
        assert error.field == field and "token ids must be integers in [0, 100)" in error.message
    # An empty item is a prompt of the query alone; an empty query and item is refused as empty.
    error = _refusal(manager.score_request({**base, "query": [], "items": [[8], []]}))
    assert error.field == "items[1]" and "is empty" in error.message
