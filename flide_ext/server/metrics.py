"""Prometheus metrics of the Flide server (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class Metrics:
    """Requests by route and status, latency histograms, and token counts: what
    flat streams computed against what one sequence per question would have."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("flide_requests_total", "HTTP requests answered", ["route", "status"], registry=self.registry)
        self.latency = Histogram(
            "flide_request_latency_seconds", "End-to-end request latency", ["route"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.prompt_tokens = Counter("flide_prompt_tokens_total", "Sum of per-question prompt tokens", registry=self.registry)
        self.stream_tokens = Counter("flide_stream_tokens_total", "Tokens computed in flat streams", registry=self.registry)
        self.saved_tokens = Counter("flide_tokens_saved_total", "Prompt tokens not computed thanks to forking", registry=self.registry)

    def tokens(self, prompt: int, stream: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.stream_tokens.inc(stream)
        self.saved_tokens.inc(max(0, prompt - stream))

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
