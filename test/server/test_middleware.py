"""The HTTP server's ASGI middleware: the API key and the per-route metrics."""

import httpx
import pytest
from fastapi import FastAPI

from flide_ext.server.http_server import ApiKeyAndMetrics
from flide_ext.server.metrics import Metrics


def _client(metrics: Metrics, api_key=None) -> httpx.AsyncClient:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.post("/v1/score")
    async def score():
        return {"scores": []}

    @app.post("/boom")
    async def boom():
        raise RuntimeError("broken route")

    app.add_middleware(ApiKeyAndMetrics, api_key=api_key, metrics=metrics)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://flide")


def _count(metrics: Metrics, route: str, status: int) -> float:
    value = metrics.registry.get_sample_value("flide_requests_total", {"route": route, "status": str(status)})
    return value or 0.0


@pytest.mark.anyio
async def test_key_refused_in_sglangs_error_format_and_counted():
    metrics = Metrics()
    async with _client(metrics, api_key="k") as client:
        refused = await client.post("/v1/score")
        assert refused.status_code == 401
        assert refused.json()["param"] == "authorization" and refused.json()["type"] == "AuthenticationError"
        ok = await client.post("/v1/score", headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200 and ok.json() == {"scores": []}
        assert (await client.get("/health")).status_code == 200  # probes need no key
    assert _count(metrics, "/v1/score", 401) == 1 and _count(metrics, "/v1/score", 200) == 1
    assert _count(metrics, "/health", 200) == 1
    count = metrics.registry.get_sample_value("flide_request_latency_seconds_count", {"route": "/v1/score"})
    assert count == 2


@pytest.mark.anyio
async def test_a_failing_route_is_counted_as_500():
    metrics = Metrics()
    async with _client(metrics) as client:
        assert (await client.post("/boom")).status_code == 500
        assert (await client.post("/v1/score")).status_code == 200  # and the app goes on
    assert _count(metrics, "/boom", 500) == 1 and _count(metrics, "/v1/score", 200) == 1


@pytest.fixture
def anyio_backend():
    return "asyncio"
