"""Decision workloads as entries of SGLang's bench_serving tables
(``sglang.benchmark.serving``): two backends and five datasets, so its own runner,
CLI, progress bar and JSON-lines output measure decision servers.

SGLang's bench_serving has no plugin hook (../shared/REFERENCES.md): a backend is an
``ASYNC_REQUEST_FUNCS`` entry plus an ``_BACKEND_API_PATHS`` route, a dataset a
``DATASET_MAPPING`` class, and ``--backend`` / ``--dataset-name`` take a fixed
``choices`` list. :func:`register` adds the entries; :func:`cli_parser_class` is the
``ArgumentParser`` its ``cli_main`` builds, extended with these names and the
``--decision-*`` options.

Backends (the route the row's body goes to; any server of that API):

* ``decision-score``: ``POST /v1/score`` (``ScoringRequest`` of token ids), Flide's or
  SGLang's;
* ``decision-text``: ``POST /v1/decisions`` (``DecisionRequest``: text state, questions).

Connections: bench_serving's request functions open a new aiohttp session, so a new
TCP connection, for every request; ``--decision-keep-alive`` sends every request of a
run over one session's kept-alive connections instead (as HTTP clients such as the
OpenAI SDK do), so a request's time holds no connection set-up once its client has
one open (each concurrent client opens its own on its first request; one idle for
:data:`KEEP_ALIVE_IDLE_S` is closed, as servers close theirs).

Datasets (seeded; a row's ``prompt`` is the request body, ``prompt_len`` its tokens,
``output_len`` 0: a decision generates nothing):

* ``race``, ``race_single``, ``multirc``, ``quality``: bench_decision's generators (the
  shapes of benchmark/kernels/workloads.py), query = the state, items = the questions;
* ``decisions``: text states of ``--decision-state-tokens`` tokens decoded from random
  ids of the tokenizer, ``--decision-questions`` choice questions of
  ``--decision-options`` options each (``decision-text`` only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .client import cached_tokens
from .traffic import fresh_requests, workload_names

BACKENDS = {"decision-score": "/v1/score", "decision-text": "/v1/decisions"}
TEXT_DATASET = "decisions"


@dataclass
class Tally:
    """Requests :func:`post_decision` sent and those that failed, with the first
    failure's text: bench_serving's own summary cannot be drawn when none succeeded."""

    sent: int = 0
    failed: int = 0
    first_error: Optional[str] = None

    def add(self, output) -> None:
        self.sent += 1
        if not output.success:
            self.failed += 1
            self.first_error = self.first_error or output.error


TALLY = Tally()

# One session for every request of a run (``--decision-keep-alive``), and the loop
# it belongs to; None: each request opens its own, as bench_serving's functions do.
KEEP_ALIVE = False
_shared: Optional[tuple] = None
# bench_serving's own session settings (sglang.benchmark.serving._create_bench_client_session).
_TIMEOUT_S, _READ_BUFSIZE = 6 * 60 * 60, 10 * 1024 ** 2
# Seconds an idle kept-alive connection is reused: below uvicorn's default keep-alive (5 s),
# which Flide's and SGLang's servers run with, so the client never sends on a connection the
# server is closing (aiohttp does not resend a POST whose connection drops).
KEEP_ALIVE_IDLE_S = 4.0


@contextlib.asynccontextmanager
async def _client_session():
    global _shared
    from sglang.benchmark import serving

    if not KEEP_ALIVE:
        async with serving._create_bench_client_session() as session:
            yield session
        return
    import aiohttp

    loop = asyncio.get_running_loop()
    if _shared is None or _shared[1] is not loop or _shared[0].closed:
        # No cap on connections: bench_serving's concurrency is the only limit.
        _shared = (aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEP_ALIVE_IDLE_S),
                                         timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S),
                                         read_bufsize=_READ_BUFSIZE), loop)
    yield _shared[0]


async def close_shared_session() -> None:
    """Close the kept-alive session of this loop's run, if one was opened."""
    global _shared
    if _shared is not None and _shared[1] is asyncio.get_running_loop():
        await _shared[0].close()
    _shared = None


def _row_tokens(body: dict) -> int:
    return len(body["query"]) + sum(len(i) for i in body["items"])


def questions_of(body: dict) -> int:
    """Questions a request body asks: its items (score) or its questions (decisions)."""
    return len(body["items"]) if "items" in body else len(body["questions"])


async def post_decision(request_func_input, pbar=None):
    """One decision request timed from send to the whole answer read: ``latency`` and
    ``ttft`` are that time (s), ``output_len`` 0; ``cached_tokens`` from the usage when
    the server reports it. A non-200 answer or one without ``scores`` / ``answers``
    is a failure carrying the server's text. The request goes over a new session's
    connection, or the run's kept-alive session (:data:`KEEP_ALIVE`)."""
    from sglang.benchmark import serving

    body = dict(request_func_input.prompt)
    body.update(request_func_input.extra_request_body)
    output = serving.RequestFuncOutput.init_new(request_func_input)
    async with _client_session() as session:
        start = time.perf_counter()
        output.start_time = start
        try:
            async with session.post(request_func_input.api_url, json=body,
                                    headers=serving.get_request_headers()) as response:
                text = await response.text()
                output.latency = output.ttft = time.perf_counter() - start
                answer = json.loads(text) if response.status == 200 else None
                if answer is not None and ("scores" in answer or "answers" in answer):
                    output.success = True
                    output.cached_tokens = cached_tokens(answer.get("usage")) or 0
                else:
                    output.error = f"{response.status} {response.reason}: {text[:500]}"
        except Exception:
            output.error = "".join(traceback.format_exception(*sys.exc_info()))
    TALLY.add(output)
    if pbar:
        pbar.update(1)
    return output


@dataclass
class ScoreWorkload:
    """``num_prompts`` fresh-state ``/v1/score`` bodies of one workload (seeded)."""

    name: str
    num_prompts: int
    seed: int
    scale: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ScoreWorkload":
        return cls(args.dataset_name, args.num_prompts, args.seed, args.decision_scale)

    def load(self, tokenizer, model_id: Optional[str] = None) -> list:
        from sglang.benchmark.datasets import DatasetRow

        bodies = fresh_requests(self.name, self.num_prompts, len(tokenizer), self.scale, self.seed)
        return [DatasetRow(prompt=b, prompt_len=_row_tokens(b), output_len=0) for b in bodies]


@dataclass
class TextDecisions:
    """``num_prompts`` ``/v1/decisions`` bodies: a text state decoded from seeded random
    token ids and ``questions`` choice questions of ``options`` options."""

    num_prompts: int
    seed: int
    state_tokens: int
    questions: int
    options: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "TextDecisions":
        return cls(args.num_prompts, args.seed, args.decision_state_tokens, args.decision_questions,
                   args.decision_options)

    def load(self, tokenizer, model_id: Optional[str] = None) -> list:
        from sglang.benchmark.datasets import DatasetRow

        rng = np.random.default_rng([self.seed, 7])
        rows = []
        for r in range(self.num_prompts):
            ids = rng.integers(0, len(tokenizer), self.state_tokens).tolist()
            state = tokenizer.decode(ids, skip_special_tokens=True).strip() or "state"
            questions = [{"id": f"q{q}", "type": "choice", "question": f"Which option fits part {q} of item {r}?",
                          "options": [{"name": f"option {o}"} for o in range(self.options)]}
                         for q in range(self.questions)]
            rows.append(DatasetRow(prompt={"input": state, "questions": questions},
                                   prompt_len=len(tokenizer.encode(state)), output_len=0))
        return rows


def datasets() -> dict:
    """Dataset name -> class, as ``DATASET_MAPPING`` holds them."""
    table = {name: type(f"{name}Workload", (ScoreWorkload,), {}) for name in workload_names()}
    table[TEXT_DATASET] = TextDecisions
    return table


def register() -> None:
    """Add the backends and datasets to SGLang's bench_serving tables (idempotent)."""
    from sglang.benchmark import serving
    from sglang.benchmark.datasets import DATASET_MAPPING

    for name, route in BACKENDS.items():
        serving.ASYNC_REQUEST_FUNCS[name] = post_decision
        serving._BACKEND_API_PATHS[name] = route
    DATASET_MAPPING.update(datasets())


def _extra_choices(flag: str) -> list:
    return list(BACKENDS) if flag == "--backend" else list(datasets()) if flag == "--dataset-name" else []


def cli_parser_class():
    """An ``ArgumentParser`` that takes the decision backends and datasets among
    ``--backend`` / ``--dataset-name``'s choices and adds the ``--decision-*`` options
    before parsing; a dataset and backend that do not go together are a usage error."""

    class DecisionParser(argparse.ArgumentParser):
        def add_argument(self, *names, **kwargs):
            extra = [c for n in names for c in _extra_choices(n)]
            if extra and kwargs.get("choices") is not None:
                # Those bench_serving does not list already (its backends' choices are its
                # request functions' table, where register() put them).
                kwargs["choices"] = [*kwargs["choices"], *(c for c in extra if c not in kwargs["choices"])]
            return super().add_argument(*names, **kwargs)

        def parse_args(self, args=None, namespace=None):
            group = self.add_argument_group("decision workloads (Flide)")
            group.add_argument("--decision-keep-alive", action="store_true",
                               help="send every request over one session's kept-alive connections "
                                    "(default: a new connection per request, as bench_serving's backends)")
            group.add_argument("--decision-scale", type=float, default=1.0,
                               help="score datasets: state and question lengths times this (default 1)")
            group.add_argument("--decision-state-tokens", type=int, default=375,
                               help="decisions dataset: random tokens decoded into each state (default 375)")
            group.add_argument("--decision-questions", type=int, default=4,
                               help="decisions dataset: questions per request (default 4)")
            group.add_argument("--decision-options", type=int, default=4,
                               help="decisions dataset: options per question, 2-26 (default 4)")
            parsed = super().parse_args(args, namespace)
            if parsed.decision_keep_alive and parsed.backend not in BACKENDS:
                self.error(f"--decision-keep-alive applies to the decision backends: {', '.join(BACKENDS)}")
            wanted = "decision-text" if parsed.dataset_name == TEXT_DATASET else "decision-score"
            if parsed.backend in BACKENDS and parsed.dataset_name not in datasets():
                self.error(f"--backend {parsed.backend} takes a decision dataset: {', '.join(datasets())}")
            if parsed.dataset_name in datasets() and parsed.backend != wanted:
                self.error(f"--dataset-name {parsed.dataset_name} goes with --backend {wanted}")
            if not parsed.decision_scale > 0:
                self.error("--decision-scale must be above 0")
            if min(parsed.decision_state_tokens, parsed.decision_questions) < 1 or \
                    not 2 <= parsed.decision_options <= 26:
                self.error("--decision-state-tokens and --decision-questions must be at least 1, "
                           "--decision-options 2-26")
            return parsed

    return DecisionParser
