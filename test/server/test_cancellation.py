"""Abandoned and timed-out requests are withdrawn before their round (never
computed), a running round whose clients all left is cut short, a full queue
answers 503, and 64 clients x 1,000 requests lose nothing
(flide_ext/server/cancellation.py, the scheduler's Abort and withdrawals, the
manager's --max-queued-requests). And the cancellation helper alone."""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time

import numpy as np
import pytest
import requests

from flide_ext.server.cancellation import ClientDisconnected, RequestTimedOut, while_client_waits
from test.helpers.checkpoints import write_char_tokenizer, write_tiny_checkpoint
from test.helpers.processes import scheduler_of, start_server, wait_for_cpu
from test.helpers.score_load import (Abandoned, cut_layer_seconds, cut_layers, cut_rounds, logged_rounds, rounds,
                                     score_body, send, send_and_leave, stream_tokens)

QUEUE = 64  # --max-queued-requests: as many as the 64 clients below, who are never refused
# A round of seconds on the CPU: the probe comes ~1 s after it starts (6 x 1,900
# took 0.8 s on a fast machine).
HEAVY = dict(prompts=12, tokens=1900)
PROBE = dict(prompts=1, tokens=1200)  # a round of a few tenths of a second


def _serve(char_model_dir, log_dir, *flags):
    command = [sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", str(char_model_dir),
               "--context-length", "2000", "--round-tokens", "24000", "--log-level", "debug", "--log-level-http", "info", *flags]
    return start_server(command, log_dir)


@pytest.fixture(scope="module")
def server(char_model_dir, tmp_path_factory):
    proc, url, log = _serve(char_model_dir, tmp_path_factory.mktemp("cancel"), "--max-queued-requests", str(QUEUE))
    yield url, log, proc
    proc.terminate()
    proc.wait(30)


def _score(url):
    return f"{url}/v1/score"


def test_a_probe_behind_three_abandoned_heavy_requests_is_not_delayed_by_them(server):
    """A heavy request runs; three more heavy ones arrive and their clients
    leave; a probe arrives. The abandoned ones never run: the probe's round
    follows the running one, and waits for less than half a heavy round."""
    url, log, _ = server
    rng = np.random.default_rng(10)
    # Each request below is one round, logged just after its answers are sent:
    # rounds are counted from the log once it shows them.
    start = len(rounds(log.read_text()))  # no request is in flight
    # Warm (a CPU process's first long rounds are slower), then the probe alone.
    assert send(_score(url), score_body(rng, **HEAVY)).wait().status == 200
    alone = [send(_score(url), score_body(rng, **PROBE)).wait() for _ in range(3)]
    assert all(c.status == 200 for c in alone)
    unloaded = statistics.median(c.answered - c.sent for c in alone)
    mark = len(logged_rounds(log, start + 4))
    running = send(_score(url), score_body(rng, **HEAVY))
    time.sleep(0.3)
    leavers = [threading.Thread(target=send_and_leave, args=(url, score_body(rng, 3, 1800), 0.3)) for _ in range(3)]
    for t in leavers:
        t.start()
    for t in leavers:
        t.join()
    time.sleep(0.3)  # the server sees them go
    probe = send(_score(url), score_body(rng, **PROBE))
    running.wait()
    probe.wait()
    assert running.status == 200 and probe.status == 200, (running.answer, probe.answer)
    assert probe.sent < running.answered, "the heavy round ended before the probe came: make HEAVY heavier"
    behind = probe.answered - running.answered
    heavy = running.answered - running.sent  # at least one heavy round: what each abandoned one would cost
    print(f"probe: {behind:.3f} s after the running round's answer, {unloaded:.3f} s alone, heavy {heavy:.3f} s")
    # Bounded by a heavy round, not by the probe alone: a busy CPU slows a
    # probe of tenths of a second by as much again, but not by seconds.
    assert behind - unloaded < heavy / 2, (behind, unloaded, heavy)
    # The rounds run since: the heavy one and the probe's; no abandoned one.
    since = logged_rounds(log, start + 6)[mark:]
    assert rounds(since) == [(1, stream_tokens(running.body)), (1, stream_tokens(probe.body))]


# A model as deep as a small real one (the test model has 2 layers): a round is
# cut between two layers, so one layer's time is what a cut may keep the next
# round waiting. DEEP_HEAVY's round is long against a DEEP_PROBE round (a layer
# of it takes about as long as the whole probe), so a round left to run to its
# end would delay the probe by many layers, far more than a busy CPU's noise.
DEEP_LAYERS = 16
DEEP_HEAVY = dict(prompts=4, tokens=1900)  # seconds on the CPU
DEEP_PROBE = dict(prompts=1, tokens=600)


def _wait_metric(url: str, line_start: str, value: float, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _metric(url, line_start) != value:
        assert time.monotonic() < deadline, f"{line_start.strip()} is {_metric(url, line_start)}, not {value}"
        time.sleep(0.02)


def test_a_running_round_whose_clients_all_left_is_cut_and_the_probe_is_not_delayed(tmp_path):
    """A heavy request's round runs; three more heavy ones arrive and their
    clients leave; then the first one's client leaves too, and a probe comes.
    The running round is cut in its first half (logged, counted in /metrics),
    the three never run, and the probe waits for less than a third of the
    layers the cut round had left: a cut is taken between layers, so it may
    wait for one, and a round run to its end would keep it waiting for all."""
    model = write_tiny_checkpoint(tmp_path / "deep", "llama", seed=7, vocab_size=128, num_hidden_layers=DEEP_LAYERS)
    write_char_tokenizer(model)
    proc, url, log = _serve(model, tmp_path)
    try:
        rng = np.random.default_rng(14)
        # Warm (a CPU process's first long rounds are slower), then the probe alone.
        assert send(_score(url), score_body(rng, **DEEP_HEAVY)).wait().status == 200
        alone = [send(_score(url), score_body(rng, **DEEP_PROBE)).wait() for _ in range(3)]
        assert all(c.status == 200 for c in alone)
        unloaded = statistics.median(c.answered - c.sent for c in alone)
        mark = len(logged_rounds(log, 4))
        aborted = _metric(url, "flide_aborted_requests_total ")

        first = Abandoned(url, score_body(rng, **DEEP_HEAVY))
        wait_for_cpu(scheduler_of(proc.pid), 0.3)  # its round computes: the others cannot join it
        others = [Abandoned(url, score_body(rng, **DEEP_HEAVY)) for _ in range(3)]
        _wait_metric(url, "flide_queued_requests ", 4)  # all four are with the scheduler
        for client in others:
            client.leave()
        _wait_metric(url, "flide_aborted_requests_total ", aborted + 3)  # their Aborts are sent
        first.leave()
        probe = send(_score(url), score_body(rng, **DEEP_PROBE)).wait()
        assert probe.status == 200, probe.answer
        behind = probe.answered - probe.sent
        print(f"probe behind a cut round and 3 abandoned ones: {behind:.3f} s, {unloaded:.3f} s alone")

        text = logged_rounds(log, 5)[mark:]
        assert rounds(text) == [(1, stream_tokens(probe.body))], "an abandoned request's round ran (to its end)"
        assert cut_rounds(text) == [(1, stream_tokens(first.body))]
        assert _metric(url, "flide_cancelled_rounds_total ") == 1
        assert _metric(url, "flide_aborted_requests_total ") == aborted + 4
        (ran,) = cut_layers(text)
        assert ran <= DEEP_LAYERS // 2, f"cut after {ran} of {DEEP_LAYERS} layers: the leave came late"
        (layer,) = cut_layer_seconds(text)
        # Bounded by the layers left, not by the probe alone: a busy CPU slows
        # a probe of tenths of a second by as much again, but not by many layers.
        left = DEEP_LAYERS - ran
        assert behind - unloaded < left / 3 * layer, (behind, unloaded, layer, ran)
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_full_queue_answers_503_at_once(server):
    """--max-queued-requests counts requests sent to the scheduler and not yet
    answered (the ``flide_queued_requests`` gauge): one more is refused at once
    with SGLang's message, and served again once the queue drains."""
    url, _, proc = server
    rng = np.random.default_rng(11)
    # A suspended scheduler answers nothing, so the queue fills however slow the
    # machine is; it is resumed well inside --heartbeat-timeout (30 s).
    scheduler = scheduler_of(proc.pid)
    scheduler.suspend()
    try:
        calls = [send(_score(url), score_body(rng, 1, 5 + i % 50)) for i in range(QUEUE)]
        deadline = time.monotonic() + 15
        while _metric(url, "flide_queued_requests ") < QUEUE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _metric(url, "flide_queued_requests ") == QUEUE
        refused = requests.post(_score(url), json=score_body(rng, 1, 5), timeout=30)
        assert all(c.status is None for c in calls)
    finally:
        scheduler.resume()
    assert refused.status_code == 503, refused.text
    body = refused.json()
    assert body.pop("rid") == refused.headers["x-request-id"]  # every error body names its request
    assert body == {"object": "error", "message": "The request queue is full.",
                    "type": "ServiceUnavailableError", "param": None, "code": 503}
    assert all(c.wait().status == 200 for c in calls)
    assert _metric(url, "flide_queued_requests ") == 0
    assert requests.post(_score(url), json=score_body(rng, 1, 5), timeout=30).status_code == 200


def _metric(url: str, line_start: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(line_start):
            return float(line.split()[-1])
    return 0.0


def test_64_clients_1000_score_requests_lose_nothing(server, char_model_dir):
    """Each of 1,000 distinct tiny /v1/score requests from 64 clients gets its
    own answer (the Engine's for it, and no two alike), exactly once."""
    import aiohttp

    from flide_ext import Engine

    url, _, _ = server
    rng = np.random.default_rng(12)
    bodies = [{"query": rng.integers(3, 128, 4).tolist(), "items": [[int(a)], [int(b)]], "label_token_ids": [1, 2, 3],
               "apply_softmax": True} for a, b in rng.integers(3, 128, (1000, 2))]
    engine = Engine(str(char_model_dir), context_length=2000)
    want = engine.score_tokens_batch([{"prompts": [b["query"] + item for item in b["items"]],
                                       "label_token_ids": [1, 2, 3]} for b in bodies])
    assert len({tuple(np.round(np.ravel(a.probabilities), 5)) for a in want}) == len(bodies)  # a swap would show
    counted = 'flide_requests_total{route="/v1/score",status="200"}'
    before = _metric(url, counted)
    results = [None] * len(bodies)

    async def run():
        queue = list(range(len(bodies)))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            async def client():
                while queue:
                    i = queue.pop()
                    async with session.post(_score(url), json=bodies[i]) as r:
                        results[i] = (r.status, await r.json())

            await asyncio.gather(*(client() for _ in range(64)))

    started = time.perf_counter()
    asyncio.run(run())
    took = time.perf_counter() - started
    print(f"64 clients x 1,000 /v1/score requests: {took:.1f} s")
    for (status, body), answer in zip(results, want):
        assert status == 200, body
        got = np.array(body["scores"])
        assert np.abs(got - np.array(answer.probabilities)).max() <= 1e-6
    assert _metric(url, counted) - before == len(bodies)


def test_a_timed_out_request_is_504_and_never_answered_by_a_round(char_model_dir, tmp_path):
    """Two requests pass --request-timeout: the running one's round is cut, and
    the waiting one never runs, or is cut as soon as its round starts (its
    timeout may come just after the first cut)."""
    proc, url, log = _serve(char_model_dir, tmp_path, "--request-timeout", "0.5")
    try:
        rng = np.random.default_rng(13)
        running = send(_score(url), score_body(rng, **HEAVY))
        time.sleep(0.1)
        waiting = send(_score(url), score_body(rng, 1, 777)).wait()
        took = waiting.answered - waiting.sent
        assert waiting.status == 504, waiting.answer
        assert waiting.answer["type"] == "TimeoutError" and "--request-timeout (0.5 s)" in waiting.answer["message"]
        assert 0.5 <= took < 0.5 + 2.0, took
        assert running.wait().status == 504  # answered at its timeout; nobody waits for its round now
        logged_rounds(log, 1, of=cut_rounds)
        probe = send(_score(url), score_body(rng, 1, 50)).wait()
        assert probe.status == 200, probe.answer
        text = logged_rounds(log, 1)  # the probe's: the scheduler logged every cut before it
        assert rounds(text) == [(1, 50)]
        cuts = cut_rounds(text)
        assert cuts[0] == (1, stream_tokens(running.body))
        assert cuts[1:] in ([], [(1, 777)]), cuts
    finally:
        proc.terminate()
        proc.wait(30)


# -- while_client_waits alone ------------------------------------------------------


class _Work:
    """An answer that takes ``seconds``, noting whether it was cancelled."""

    def __init__(self, seconds: float):
        self.seconds, self.cancelled = seconds, False

    async def __call__(self):
        try:
            await asyncio.sleep(self.seconds)
            return "answer"
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def _client(leaves_after=None):
    async def receive():
        if leaves_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(leaves_after)
        return {"type": "http.disconnect"}

    return receive


def test_the_answer_when_it_comes_first():
    work = _Work(0.01)
    assert asyncio.run(while_client_waits(_client(), work(), timeout=5)) == "answer" and not work.cancelled


def test_a_client_that_leaves_cancels_the_work():
    work = _Work(10)
    with pytest.raises(ClientDisconnected):
        asyncio.run(while_client_waits(_client(leaves_after=0.05), work(), timeout=None))
    assert work.cancelled


def test_a_timeout_cancels_the_work():
    work = _Work(10)
    started = time.perf_counter()
    with pytest.raises(RequestTimedOut, match=r"--request-timeout \(0.1 s\)"):
        asyncio.run(while_client_waits(_client(), work(), timeout=0.1))
    assert work.cancelled and time.perf_counter() - started < 5


def test_the_works_own_timeout_error_is_not_the_request_timeout():
    async def work():
        raise TimeoutError("the work's own")

    with pytest.raises(TimeoutError, match="the work's own"):
        asyncio.run(while_client_waits(_client(), work(), timeout=5))


def test_a_caller_cancelled_from_outside_is_not_a_client_that_left():
    """The work runs in the caller's task: cancelling the caller (a server
    stopping) cancels the work and is a cancellation, not a disconnect."""
    work = _Work(10)

    async def run():
        caller = asyncio.ensure_future(while_client_waits(_client(), work(), timeout=None))
        await asyncio.sleep(0.05)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    asyncio.run(run())
    assert work.cancelled


def test_a_disconnect_after_the_answer_cancels_nothing():
    """The client leaving once its answer came: the caller goes on (sending the
    answer) and is not cancelled later by the watcher."""
    async def run():
        answer = await while_client_waits(_client(leaves_after=0.01), _Work(0.0)(), timeout=None)
        await asyncio.sleep(0.05)  # the watcher has seen the disconnect by now
        return answer

    assert asyncio.run(run()) == "answer"


def test_a_withdrawn_health_probe_is_no_aborted_request(char_model_dir, tmp_path):
    """``/health_generate`` withdraws its probe once any answer comes (a busy
    server's): no client left and no --request-timeout passed, so
    ``flide_aborted_requests_total`` (as SGLang's counter, which its probe
    never moves) counts only the score request withdrawn here."""
    import zmq
    import zmq.asyncio
    from transformers import AutoTokenizer

    from flide_ext.server.metrics import Metrics
    from flide_ext.server.tokenizer_manager import TokenizerManager

    async def run():
        silent = zmq.Context()  # a busy scheduler: it reads nothing meanwhile
        work = silent.socket(zmq.PULL)
        work.bind(f"ipc://{tmp_path}/work")
        done = zmq.asyncio.Context.instance().socket(zmq.PULL)
        done.bind(f"ipc://{tmp_path}/done")
        metrics = Metrics()
        manager = TokenizerManager(AutoTokenizer.from_pretrained(char_model_dir), 2000, 128,
                                   f"ipc://{tmp_path}/work", done, metrics, abort_addr=f"ipc://{tmp_path}/abort")
        probe = asyncio.ensure_future(manager.probe())
        score = asyncio.ensure_future(manager.score([np.arange(3, 9)], [[1, 2]]))
        await asyncio.sleep(0.2)  # both sent
        probe.cancel()  # what /health_generate does once the scheduler answered anything
        score.cancel()  # its client left
        await asyncio.gather(probe, score, return_exceptions=True)
        done.close(linger=0)
        work.close(linger=0)
        silent.destroy(linger=0)
        return metrics.registry.get_sample_value("flide_aborted_requests_total"), manager.slots.count

    aborted, queued = asyncio.run(run())
    assert (aborted, queued) == (1, 0)
