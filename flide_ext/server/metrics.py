"""Prometheus metrics of the Flide server (``GET /metrics``)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# The state cache's gauges: (metric, Engine.cache_stats() key, help).
CACHE_GAUGES = (
    ("flide_state_cache_enabled", "enabled", "1 when the state cache is on (0: --disable-radix-cache)"),
    ("flide_state_cache_nodes", "nodes", "Checkpoints (radix-tree nodes) in the state cache"),
    ("flide_state_cache_tokens", "cached_tokens", "Tokens (K/V rows) the state cache holds"),
    ("flide_state_cache_slots", "slots", "GDN state slots the state cache holds"),
    ("flide_state_cache_bytes", "bytes", "Bytes of K/V rows and GDN slots the state cache holds"),
    ("flide_state_cache_budget_bytes", "budget_bytes", "The state cache's memory budget"),
    ("flide_state_cache_max_tokens", "max_tokens", "Most tokens (K/V rows) the state cache can hold"),
    ("flide_state_cache_max_slots", "max_slots", "Most GDN state slots the state cache can hold"),
)
# Counters since the server started (a flush does not reset them).
CACHE_COUNTERS = (
    ("flide_state_cache_hits", "hits", "Requests that resumed from the state cache"),
    ("flide_state_cache_evicted_nodes", "evicted_nodes", "Checkpoints evicted from the state cache"),
)


class _CacheCollector:
    """Reports the latest ``Engine.cache_stats()`` the scheduler sent."""

    def __init__(self):
        self.stats: dict = {}

    def collect(self):
        for name, key, doc in CACHE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=float(self.stats.get(key, 0)))
        for name, key, doc in CACHE_COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(self.stats.get(key, 0)))


class RequestClock:
    """The stages of one HTTP request, in seconds: each :meth:`lap` charges the
    time since the last one to a stage."""

    def __init__(self):
        self.last = time.perf_counter()
        self.stages: dict = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self.last
        self.last = now


# A request's stages, in order: tokenize (body parsed, checked, rendered and
# tokenised, its tree sized: up to sending it to the scheduler), queue (from then
# until its round starts, the wait in the scheduler's socket included), plan /
# forward / finish (its round's, RoundStats), transport (the rest of the round
# trip: the answer's way back, pickling, the event loop), respond (the answer made
# into the response body).
STAGES = ("tokenize", "queue", "plan", "forward", "finish", "transport", "respond")


class Metrics:
    """Requests by route and status, latency histograms, and token counts: what
    flat streams computed against what one sequence per question would have,
    and what the state cache saved (``flide_cached_tokens_total``, SGLang's
    ``sglang:cached_tokens_total``), with the cache's size and budget."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("flide_requests_total", "HTTP requests answered", ["route", "status"], registry=self.registry)
        self.latency = Histogram(
            "flide_request_latency_seconds", "End-to-end request latency", ["route"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.prompt_tokens = Counter("flide_prompt_tokens_total", "Sum of per-question prompt tokens", registry=self.registry)
        self.stream_tokens = Counter("flide_stream_tokens_total", "Tokens computed in flat streams", registry=self.registry)
        self.saved_tokens = Counter("flide_tokens_saved_total",
                                    "Prompt tokens not computed (forked, or resumed from the state cache)",
                                    registry=self.registry)
        self.cached_tokens = Counter("flide_cached_tokens_total", "Prompt tokens resumed from the state cache",
                                     registry=self.registry)
        # SGLang's sglang:per_stage_req_latency_seconds, with Flide's stages (STAGES).
        self.stage_latency = Histogram(
            "flide_per_stage_req_latency_seconds", "Request latency by stage", ["stage"], registry=self.registry,
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        # SGLang's sglang:num_queue_reqs: what --max-queued-requests bounds.
        self.queued = Gauge("flide_queued_requests", "Requests sent to the scheduler and not yet answered",
                            registry=self.registry)
        # SGLang's sglang:num_aborted_requests_total; and the rounds cut short for them.
        self.aborted = Counter("flide_aborted_requests_total",
                               "Requests withdrawn from the scheduler: the client left or --request-timeout passed",
                               registry=self.registry)
        self.cancelled_rounds = Counter("flide_cancelled_rounds_total",
                                        "Rounds stopped before their end because every one of their requests "
                                        "was withdrawn", registry=self.registry)
        self._cache = _CacheCollector()
        self.registry.register(self._cache)

    def tokens(self, prompt: int, stream: int, cached: int = 0) -> None:
        self.prompt_tokens.inc(prompt)
        self.stream_tokens.inc(stream)
        self.saved_tokens.inc(max(0, prompt - stream))
        self.cached_tokens.inc(cached)

    def cache(self, stats: dict) -> None:
        """The state cache's latest ``Engine.cache_stats()``."""
        self._cache.stats = dict(stats)

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def stages(self, clock: RequestClock) -> None:
        """Observe a finished request's stages (a request refused before the
        scheduler has only some)."""
        for stage, seconds in clock.stages.items():
            self.stage_latency.labels(stage).observe(max(seconds, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
