"""Token-id ``/v1/score`` requests of chosen sizes, sent from threads or
abandoned by their clients, and the rounds a server logged (the scheduler's
``Decision round.`` lines, and ``Decision round cancelled.`` for a round cut
short because all its clients left)."""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import requests

ROUND_LINE = re.compile(r"Decision round\. #req: (\d+), #question: (\d+), #stream-token: (\d+)")
CUT_LINE = re.compile(r"Decision round cancelled\. #req: (\d+), #question: (\d+), #stream-token: (\d+), "
                      r"layers: (\d+)/\d+, ran: ([\d.]+) ms")


def score_body(rng: np.random.Generator, prompts: int, tokens: int, vocab: int = 128) -> dict:
    """A ``/v1/score`` body of ``prompts`` random items of ``tokens`` ids each and
    no query: no two such bodies share a prefix, so none resumes from the state
    cache, and its round has ``prompts * tokens`` stream tokens."""
    items = [rng.integers(3, vocab, tokens).tolist() for _ in range(prompts)]
    return {"query": [], "items": items, "label_token_ids": [1, 2]}


def stream_tokens(body: dict) -> int:
    return sum(len(item) for item in body["items"])


def rounds(log_text: str) -> list[tuple[int, int]]:
    """``(#req, #stream-token)`` of each round logged in ``log_text``, in order."""
    return [(int(m[1]), int(m[3])) for m in ROUND_LINE.finditer(log_text)]


def cut_rounds(log_text: str) -> list[tuple[int, int]]:
    """``(#req, #stream-token)`` of each cut round logged in ``log_text``, in order."""
    return [(int(m[1]), int(m[3])) for m in CUT_LINE.finditer(log_text)]


def cut_layers(log_text: str) -> list[int]:
    """Layers each cut round logged in ``log_text`` ran before it stopped, in order."""
    return [int(m[4]) for m in CUT_LINE.finditer(log_text)]


def cut_layer_seconds(log_text: str) -> list[float]:
    """Seconds per layer each cut round logged in ``log_text`` took (its time over
    the layers it ran), in order."""
    return [float(m[5]) / 1e3 / max(int(m[4]), 1) for m in CUT_LINE.finditer(log_text)]


def logged_rounds(log, count: int, timeout: float = 60.0, of=rounds) -> str:
    """The server log's text once it shows ``count`` rounds (each is logged just
    after its answers are sent), or ``count`` cut rounds with ``of=cut_rounds``."""
    deadline = time.time() + timeout
    while len(of(text := log.read_text())) < count and time.time() < deadline:
        time.sleep(0.05)
    return text


@dataclass
class Call:
    """One request sent from a thread: its status, body and when it was answered."""

    body: dict
    status: Optional[int] = None
    answer: Optional[dict] = None
    error: Optional[str] = None
    sent: float = 0.0
    answered: float = 0.0
    thread: Optional[threading.Thread] = None

    def wait(self, timeout: float = 120.0) -> "Call":
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "no answer"
        return self


def send(url: str, body: dict, headers: Optional[dict] = None) -> Call:
    """POST ``body`` to ``url`` from a thread; :meth:`Call.wait` for its answer."""
    call = Call(body)

    def run():
        call.sent = time.perf_counter()
        try:
            r = requests.post(url, json=body, headers=headers, timeout=120)
            call.status, call.answer = r.status_code, r.json()
        except requests.RequestException as e:
            call.error = str(e)
        call.answered = time.perf_counter()

    call.thread = threading.Thread(target=run, daemon=True)
    call.thread.start()
    return call


class Abandoned:
    """``body`` sent as a POST /v1/score to ``url`` over a plain socket, whose
    client goes away without reading the answer when :meth:`leave` is called."""

    def __init__(self, url: str, body: dict):
        import json

        self.body = body
        host, port = url.removeprefix("http://").split(":")
        data = json.dumps(body).encode()
        head = (f"POST /v1/score HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        self.conn = socket.create_connection((host, int(port)))
        self.conn.sendall(head + data)

    def leave(self) -> None:
        self.conn.close()


def send_and_leave(url: str, body: dict, stay: float) -> None:
    """Send ``body`` as a POST to ``url`` over a plain socket, and close the
    connection after ``stay`` seconds without reading the answer."""
    client = Abandoned(url, body)
    time.sleep(stay)
    client.leave()
