"""The HTTP side of bench_serving: ``POST /v1/score`` in SGLang's wire format
(``ScoringRequest`` with token ids -> ``ScoringResponse``), ``/health``,
``/flush_cache``, ``/metrics`` (Prometheus text) and ``nvidia-smi``.

The same client measures any server of that API (Flide's, SGLang's), so every
engine-specific field is optional: usage's cached-token counts, the metrics,
the cache flush.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import aiohttp
import requests

# Prometheus samples kept from /metrics: prefix-cache counters (SGLang's
# ``sglang:cached_tokens_total`` ...) and the prompt / computed token counters.
METRIC_PATTERNS = ("cache", "prompt_tokens", "stream_tokens", "tokens_saved", "per_stage_req_latency", "request_latency")


class ServerUnreachable(RuntimeError):
    """No server answers at the URL (one line for the command's error)."""


@dataclass
class Answer:
    """One ``/v1/score`` exchange, timed from the first byte sent to the last read."""

    status: int
    latency_s: float
    start_s: float  # perf_counter at send
    scores: Optional[list] = None
    usage: Optional[dict] = None
    error: Optional[str] = None
    raw: Optional[dict] = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.scores is not None


def find_key(obj: Any, key: str) -> Optional[int]:
    """The first value of ``key`` anywhere inside nested dicts/lists (``None`` when absent)."""
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], (int, float)):
            return obj[key]
        values = obj.values()
    elif isinstance(obj, list):
        values = obj
    else:
        return None
    for value in values:
        found = find_key(value, key)
        if found is not None:
            return found
    return None


def cached_tokens(usage: Optional[dict]) -> Optional[int]:
    """``usage.prompt_tokens_details.cached_tokens``, else ``cached_tokens`` anywhere in
    usage; ``None`` when the server does not report it."""
    if not usage:
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"]
    return find_key(usage, "cached_tokens")


def score_body(query: list, items: list, label_ids: list) -> dict:
    """A ``ScoringRequest`` of token ids: probabilities over ``label_ids`` after each item."""
    return {"query": list(query), "items": [list(i) for i in items], "label_token_ids": list(label_ids),
            "apply_softmax": True}


def check_against_sglang(body: dict, response: Optional[dict]) -> list[str]:
    """Validate one body (and its answer) with SGLang's own pydantic models, when
    SGLang is importable; returns what did not validate."""
    try:
        from sglang.srt.entrypoints.openai.protocol import ScoringRequest, ScoringResponse
    except Exception:  # noqa: BLE001 - SGLang is optional on the client side
        return []
    problems = []
    try:
        ScoringRequest.model_validate(body)
    except Exception as e:  # noqa: BLE001
        problems.append(f"request: {e}".splitlines()[0])
    if response is not None:
        try:
            ScoringResponse.model_validate(response)
        except Exception as e:  # noqa: BLE001
            problems.append(f"response: {e}".splitlines()[0])
    return problems


class ScoreClient:
    """An aiohttp session for ``POST {url}/v1/score`` (use as ``async with``)."""

    def __init__(self, url: str, headers: dict, timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout_s = timeout_s
        self.session: Optional[aiohttp.ClientSession] = None

    async def __aenter__(self):
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            read_bufsize=10 * 2**20)
        return self

    async def __aexit__(self, *exc):
        await self.session.close()

    async def score(self, body: dict) -> Answer:
        data = json.dumps(body).encode()  # serialised before the clock starts
        for attempt in (0, 1):
            start = time.perf_counter()
            try:
                async with self.session.post(f"{self.url}/v1/score", data=data, headers=self.headers) as r:
                    text = await r.text()
                    latency = time.perf_counter() - start
                    status = r.status
                break
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
                # A kept-alive connection the server closed meanwhile: sent again once,
                # on a new connection, and timed from then (scoring has no side effects).
                if attempt:
                    return Answer(0, time.perf_counter() - start, start, error=f"{type(e).__name__}: {e}")
            except (aiohttp.ClientError, TimeoutError) as e:
                return Answer(0, time.perf_counter() - start, start, error=f"{type(e).__name__}: {e}")
        if status != 200:
            return Answer(status, latency, start, error=text[:500])
        try:
            parsed = json.loads(text)  # Python's float repr round-trips: scores compare bitwise
        except json.JSONDecodeError as e:
            return Answer(status, latency, start, error=f"not JSON: {e}")
        scores = parsed.get("scores") if isinstance(parsed, dict) else None
        if not isinstance(scores, list):
            return Answer(status, latency, start, error=f"no scores in the answer: {text[:200]}")
        return Answer(status, latency, start, scores, parsed.get("usage"), raw=parsed)


def check_health(url: str, headers: dict, wait_s: float = 0.0) -> None:
    """Return once ``GET /health`` answers 200, polling up to ``wait_s`` seconds.

    Raises:
        ServerUnreachable: nothing answers, or /health never says 200.
    """
    deadline = time.time() + wait_s
    while True:
        try:
            r = requests.get(f"{url}/health", headers=headers, timeout=10)
            if r.status_code == 200:
                return
            problem = f"/health answered HTTP {r.status_code}"
        except requests.RequestException as e:
            errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(e))
            problem = f"cannot connect ({type(e).__name__}: {errno.group(1) if errno else str(e)[:120]})"
        if time.time() >= deadline:
            raise ServerUnreachable(f"no server at {url}: {problem}")
        time.sleep(1.0)


def flush_cache(url: str, headers: dict) -> int:
    """``POST /flush_cache`` (SGLang's route, which empties its radix cache): the HTTP
    status, 0 when the request failed. SGLang refuses a flush while requests run."""
    try:
        return requests.post(f"{url}/flush_cache", headers=headers, timeout=60).status_code
    except requests.RequestException:
        return 0


def scrape_metrics(url: str, headers: dict, patterns=METRIC_PATTERNS) -> dict:
    """``GET /metrics``: ``{"status", "samples": {"name{labels}": value}}`` for the
    samples whose name holds one of ``patterns`` (histogram buckets left out);
    samples are ``None`` when the route is absent or not Prometheus text."""
    try:
        r = requests.get(f"{url}/metrics", headers=headers, timeout=30)
    except requests.RequestException as e:
        return {"status": 0, "error": str(e)[:200], "samples": None}
    if r.status_code != 200:
        return {"status": r.status_code, "samples": None}
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    try:
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                if s.name.endswith(("_bucket", "_created")) or not any(p in s.name for p in patterns):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    except ValueError as e:
        return {"status": r.status_code, "error": f"not Prometheus text: {e}"[:200], "samples": None}
    return {"status": r.status_code, "samples": samples}


def metric_deltas(before: dict, after: dict) -> Optional[dict]:
    """After minus before for every sample both scrapes have."""
    a, b = before.get("samples"), after.get("samples")
    if a is None or b is None:
        return None
    return {k: b[k] - a.get(k, 0.0) for k in b}


def gpu_memory_mib() -> Optional[list]:
    """``nvidia-smi --query-gpu=memory.used`` per GPU in MiB; ``None`` without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return [int(line.strip()) for line in out.stdout.splitlines() if line.strip()]
    except ValueError:
        return None
