"""A scheduler that dies, stops, or is stopped with the server (flide_ext/server/liveness.py
and launch.py): every request is answered 503 with why, ``/health`` fails, the
server exits 1; SIGTERM and SIGINT mid-round stop both processes. And the
monitor's verdicts, from a fake process and a real heartbeat socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
import zmq

from flide_ext.server.io_struct import Heartbeat
from flide_ext.server.liveness import SchedulerMonitor
from test.helpers.processes import running, scheduler_of, start_server
from test.helpers.score_load import rounds, score_body, send

# A round of HEAVY stream tokens takes seconds on the CPU (the tiny char model;
# 3 x 1,900 took under 0.8 s on a fast machine); a light one milliseconds.
HEAVY = dict(prompts=8, tokens=1900)


def _serve(char_model_dir, tmp_path, *flags, **popen):
    command = [sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", str(char_model_dir),
               "--context-length", "2000", "--round-tokens", "16000", "--log-level", "debug", "--log-level-http", "info", *flags]
    return start_server(command, tmp_path, **popen)


def _in_flight(url: str, seed: int):
    # A heavy request (its round starts at once) and 7 light ones waiting behind it.
    rng = np.random.default_rng(seed)
    calls = [send(f"{url}/v1/score", score_body(rng, **HEAVY))]
    time.sleep(0.3)
    calls += [send(f"{url}/v1/score", score_body(rng, 1, 20 + i)) for i in range(7)]
    time.sleep(0.5)
    assert all(c.status is None for c in calls), "answered before the scheduler failed: make HEAVY heavier"
    return calls


def _health_fails(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=5).status_code != 200
    except requests.RequestException:  # already gone
        return True


def _fails_then_exits(proc, url, calls, failed_at: float, why: str, limit: float):
    for call in calls:
        call.wait(limit + 10)
        assert call.status == 503, (call.status, call.answer, call.error)
        assert why in call.answer["message"] and call.answer["code"] == 503, call.answer
        assert call.answered - failed_at < limit, call.answered - failed_at
    assert _health_fails(url)
    try:  # a new request, while the server still listens, is answered at once
        late = requests.post(f"{url}/v1/score", json={"query": [1], "items": [[2]], "label_token_ids": [1]}, timeout=5)
        assert late.status_code == 503 and why in late.json()["message"]
    except requests.ConnectionError:  # it has already stopped listening
        pass
    assert proc.wait(30) == 1
    return max(call.answered for call in calls) - failed_at


def test_killed_scheduler_fails_every_request_then_the_server_exits_1(char_model_dir, tmp_path):
    proc, url, log = _serve(char_model_dir, tmp_path)
    scheduler = scheduler_of(proc.pid)
    calls = _in_flight(url, 0)
    killed = time.perf_counter()
    scheduler.kill()
    took = _fails_then_exits(proc, url, calls, killed, "the scheduler process exited with code -9", limit=5.0)
    print(f"kill -9: 8 requests answered 503 within {took:.2f} s")
    last = log.read_text().strip().splitlines()[-1]
    assert last == "flide: error: the scheduler process exited with code -9; the server stopped", last


def test_stopped_scheduler_fails_every_request_then_the_server_exits_1(char_model_dir, tmp_path):
    """SIGSTOP: no heartbeat for --heartbeat-timeout seconds. A round longer than
    that timeout is no failure: the heartbeat comes from a thread of its own."""
    # A round of ~30,000 tokens: over 2 s even on a fast machine (15,200 took
    # 1.2 s on one, under the timeout).
    proc, url, log = _serve(char_model_dir, tmp_path, "--heartbeat-timeout", "1.5", "--round-tokens", "32000")
    scheduler = scheduler_of(proc.pid)
    long_round = send(f"{url}/v1/score", score_body(np.random.default_rng(1), prompts=16, tokens=1900)).wait()
    took = long_round.answered - long_round.sent
    assert long_round.status == 200 and took > 1.5, took
    assert requests.get(f"{url}/health", timeout=5).status_code == 200
    calls = _in_flight(url, 2)
    stopped = time.perf_counter()
    scheduler.suspend()
    try:
        took = _fails_then_exits(proc, url, calls, stopped, "sent no heartbeat", limit=1.5 + 3.0)
    finally:
        if running(scheduler.pid):
            scheduler.kill()
    print(f"SIGSTOP: 8 requests answered 503 within {took:.2f} s (--heartbeat-timeout 1.5)")
    assert not running(scheduler.pid)
    assert "no heartbeat" in log.read_text().strip().splitlines()[-1]


@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGINT",), ("SIGTERM", "SIGINT")])
def test_signals_mid_round_stop_both_processes(signals, char_model_dir, tmp_path):
    """SIGTERM to the server (a supervisor), SIGINT to its process group (a
    terminal's Ctrl-C), or both, while a round runs: the waiting request is
    answered 503, no process is left, and the server ends by the signal (by the
    later one when both came: uvicorn passes on what it caught, last first)."""
    proc, url, log = _serve(char_model_dir, tmp_path, start_new_session=True)
    scheduler = scheduler_of(proc.pid)
    call = send(f"{url}/v1/score", score_body(np.random.default_rng(3), **HEAVY))
    time.sleep(0.8)
    assert call.status is None and rounds(log.read_text()) == [], "the round ended before the signal"
    for name in signals:
        sig = getattr(signal, name)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        # Close together: with 0.2 s between them a fast machine had stopped
        # (by the first) before the second came.
        time.sleep(0.02)
    code = proc.wait(30)
    call.wait()
    assert code == -getattr(signal, signals[-1]), (code, log.read_text()[-2000:])
    assert call.status == 503 and "shutting down" in call.answer["message"], (call.status, call.answer, call.error)
    assert not running(scheduler.pid)
    assert rounds(log.read_text()) == []  # stopped mid-round, not after it


class _Process:
    exitcode = None


def test_monitor_verdicts():
    """Exit first (with its code), then silence past the heartbeat timeout, then
    a round past the watchdog limit; a heartbeat already queued is never a miss."""
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    process = _Process()
    monitor = SchedulerMonitor(process, pull, heartbeat_timeout=2.0, watchdog_timeout=10.0, on_failure=print)
    try:
        assert monitor.check(100.0, 101.0) == (100.0, None)
        last, why = monitor.check(100.0, 102.5)
        assert last == 100.0 and "no heartbeat for 2.5 s (--heartbeat-timeout 2)" in why
        push.send_pyobj(Heartbeat(round_seconds=3.0))
        time.sleep(0.2)  # delivered, not yet read: a busy event loop reads it late
        assert monitor.check(100.0, 500.0) == (500.0, None)
        push.send_pyobj(Heartbeat(None))
        push.send_pyobj(Heartbeat(round_seconds=10.5))
        time.sleep(0.2)
        last, why = monitor.check(500.0, 501.0)
        assert last == 501.0 and why == "a round has run 10.5 s, past the watchdog limit (--watchdog-timeout 10)"
        process.exitcode = -9
        assert monitor.check(501.0, 501.1)[1] == "the scheduler process exited with code -9"
    finally:
        context.destroy(linger=0)
