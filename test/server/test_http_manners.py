"""The real server (``flide serve``) over raw sockets: request bodies too large
or too slow are refused (413, 408) and their connections closed while every
other request is answered; unknown paths share one metrics series; request
ids reach the log; the probes; a large request does not hold up ``/health``."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import pytest
import requests

from test.helpers.processes import free_port, quiet_env, wait_for_health

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_READ_TIMEOUT = 1.0
SMALL = json.dumps({"query": "Sky is ", "items": ["blue", "red"], "label_token_ids": [1, 2]}).encode()


@pytest.fixture(scope="module")
def served(char_model_dir, tmp_path_factory):
    """(url, log path) of a server with a short body read timeout."""
    import subprocess

    log = tmp_path_factory.mktemp("manners") / "server.log"
    port = free_port()
    command = [sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", str(char_model_dir),
               "--api-key", KEY, "--context-length", "400", "--body-read-timeout", str(BODY_READ_TIMEOUT),
               "--port", str(port)]
    proc = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=quiet_env())
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url, proc, log)
    yield url, log
    proc.terminate()
    proc.wait(30)


async def _request(port: int, head: str, body: bytes = b"") -> tuple[int, dict, bytes]:
    """One request on its own connection -> (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + body)
    status, headers, answer = await _response(reader)
    writer.close()
    return status, headers, answer


async def _response(reader) -> tuple[int, dict, bytes]:
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return int(lines[0].split()[1]), headers, body


def _post(path: str, length: int | None = None, extra: str = "") -> str:
    framing = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: flide\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\n{extra}{framing}\r\n")


async def _others_answered(port: int) -> None:
    # What the server owes every other client meanwhile.
    health = await _request(port, "GET /health HTTP/1.1\r\nHost: flide\r\n\r\n")
    scored = await _request(port, _post("/v1/score", len(SMALL)), SMALL)
    assert health[0] == 200 and scored[0] == 200, (health, scored)
    assert len(json.loads(scored[2])["scores"]) == 2


async def _answer_and_close(reader, start: float) -> tuple[float, int, bytes, bool]:
    """-> (seconds from ``start`` to the answer, status, body, whether the server then closed the connection)."""
    status, _, body = await _response(reader)
    seconds = time.perf_counter() - start
    try:
        closed = await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionError:
        closed = True
    return seconds, status, body, closed


async def _upload_50_mb(port: int, chunked: bool) -> tuple[float, int, dict, bool]:
    """-> (seconds to the answer's status line, status, error body, connection closed after)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(_post("/v1/score", None if chunked else 50 << 20).encode())
    chunk = b" " * (1 << 20)

    async def upload():
        try:
            for _ in range(50):
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
        except ConnectionError:
            pass  # the server closed the connection: expected, once it has answered

    uploading = asyncio.create_task(upload())
    seconds, status, body, closed = await _answer_and_close(reader, start)
    await uploading
    writer.close()
    return seconds, status, json.loads(body), closed


def test_a_50_mb_body_is_refused_within_a_second(served):
    url, _ = served
    port = int(url.rsplit(":", 1)[1])

    async def run():
        results = []
        for chunked in (False, True):
            refused, _ = await asyncio.gather(_upload_50_mb(port, chunked), _others_answered(port))
            results.append(refused)
        return results

    for seconds, status, body, closed in asyncio.run(run()):
        assert status == 413 and seconds < 1.0, (status, seconds)
        assert body["param"] == "body" and "32 MiB" in body["message"] and "--max-body-mb" in body["message"]
        assert closed
    assert requests.get(f"{url}/health", timeout=5).status_code == 200


def test_200_slow_uploads_time_out_and_others_are_answered(served):
    url, _ = served
    port = int(url.rsplit(":", 1)[1])

    async def slow():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.perf_counter()
        writer.write(_post("/v1/score", 1000).encode() + b"{")

        async def drip():  # a byte every 0.2 s: 1,000 bytes would take 200 s
            try:
                while True:
                    await asyncio.sleep(0.2)
                    writer.write(b" ")
                    await writer.drain()
            except ConnectionError:
                pass

        dripping = asyncio.create_task(drip())
        seconds, status, body, closed = await _answer_and_close(reader, start)
        dripping.cancel()
        writer.close()
        return status, seconds, json.loads(body), closed

    async def run():
        uploads = [asyncio.create_task(slow()) for _ in range(200)]
        await asyncio.sleep(0.3)
        await _others_answered(port)
        pending_meanwhile = sum(not u.done() for u in uploads)
        return pending_meanwhile, await asyncio.gather(*uploads)

    start = time.perf_counter()
    pending_meanwhile, results = asyncio.run(run())
    total = time.perf_counter() - start
    assert pending_meanwhile == 200  # the others were answered while all 200 still uploaded
    for status, seconds, body, closed in results:
        assert status == 408 and BODY_READ_TIMEOUT <= seconds < BODY_READ_TIMEOUT + 5, (status, seconds)
        assert body["param"] == "body" and "--body-read-timeout" in body["message"]
        assert closed
    assert total < 20, total


def test_unknown_paths_share_one_series(served):
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    rng = random.Random(3)
    paths = [f"/{rng.getrandbits(48):x}/{rng.getrandbits(16):x}" for _ in range(300)]

    def unmatched() -> float:
        text = requests.get(f"{url}/metrics", timeout=10).text
        lines = [line for line in text.splitlines() if line.startswith('flide_requests_total{route="unmatched"')]
        return sum(float(line.split()[1]) for line in lines)

    before = unmatched()

    async def pipelined(chunk):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(f"GET {p} HTTP/1.1\r\nHost: flide\r\n\r\n".encode() for p in chunk))
        statuses = [(await _response(reader))[0] for _ in chunk]
        writer.close()
        return statuses

    async def run():
        return await asyncio.gather(*(pipelined(paths[i::4]) for i in range(4)))

    statuses = {s for chunk in asyncio.run(run()) for s in chunk}
    assert statuses == {401}  # unknown paths are behind the key too, as in SGLang
    text = requests.get(f"{url}/metrics", timeout=10).text
    assert unmatched() - before == 300 and not any(p in text for p in paths)


def test_unknown_routes_and_methods_get_sglangs_error_naming_what_is_served(served):
    url, _ = served
    missing = requests.post(f"{url}/generate", json={}, headers={**AUTH, "X-Request-Id": "manners-404"}, timeout=10)
    assert missing.status_code == 404
    body = missing.json()
    assert body["object"] == "error" and body["type"] == "NotFoundError" and body["code"] == 404
    assert body["rid"] == "manners-404" and body["message"].startswith("POST /generate is not served in decision mode")
    for route in ("POST /v1/decisions", "POST /v1/systemone", "POST /v1/score", "GET /health", "GET/POST /flush_cache"):
        assert route in body["message"]
    wrong = requests.delete(f"{url}/v1/score", headers=AUTH, timeout=10)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["type"] == "MethodNotAllowedError"
    assert wrong.json()["message"] == "/v1/score takes POST, not DELETE"


def test_request_ids_are_echoed_and_logged(served):
    url, log = served
    ok = requests.post(f"{url}/v1/score", data=SMALL, headers={**AUTH, "Content-Type": "application/json",
                                                               "X-Request-Id": "manners-ok"})
    assert ok.status_code == 200 and ok.headers["X-Request-Id"] == "manners-ok"
    bad = requests.post(f"{url}/v1/score", json={"query": "x", "items": [], "label_token_ids": [1]},
                        headers={**AUTH, "X-Request-Id": "manners-bad"})
    assert bad.status_code == 400 and bad.json()["rid"] == "manners-bad" and bad.json()["param"] == "items"
    plain = requests.post(f"{url}/v1/score", data=SMALL, headers={**AUTH, "Content-Type": "text/plain"})
    assert plain.status_code == 400 and plain.json()["rid"] == plain.headers["X-Request-Id"]
    deadline = time.time() + 10
    while time.time() < deadline:  # the access line is written once the response has gone out
        text = log.read_text()
        if "rid=manners-bad" in text:
            break
        time.sleep(0.1)
    assert '"POST /v1/score HTTP/1.1" 200 OK rid=manners-ok' in text
    assert '"POST /v1/score HTTP/1.1" 400 Bad Request rid=manners-bad' in text


def test_probes_are_open_and_go_through_the_scheduler(served):
    url, _ = served
    for path in ("/health", "/ready", "/health_generate"):
        assert requests.get(f"{url}{path}", timeout=30).status_code == 200, path
    assert requests.get(f"{url}/v1/models", timeout=5).status_code == 401


def test_a_large_request_does_not_hold_up_health(served):
    """1,000 items of 2,500 characters each are tokenised (each under the
    pre-check's bound) in a worker thread, for a second or more; /health is
    answered meanwhile. The request is then refused: its prompts do not fit the
    context."""
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    big = json.dumps({"query": "q", "items": ["abcde" * 500] * 1000, "label_token_ids": [1]}).encode()

    async def run():
        large = asyncio.create_task(_request(port, _post("/v1/score", len(big)), big))
        await asyncio.sleep(0.3)
        assert not large.done(), "the large request finished too soon to show anything"
        health = await _request(port, "GET /health HTTP/1.1\r\nHost: flide\r\n\r\n")
        return health, large.done(), await large

    health, large_done_then, (status, _, body) = asyncio.run(run())
    assert health[0] == 200 and not large_done_then
    assert status == 400 and json.loads(body)["param"].startswith("items")


def test_a_client_that_leaves_mid_body_is_a_withdrawn_request_not_a_server_error(served):
    """A client that closes its connection before its body has all arrived is
    answered as one that leaves while its request waits (400, nobody reads it):
    not a 500 with a traceback in the log, as if the server had failed."""
    url, log = served
    port = int(url.rsplit(":", 1)[1])
    series = 'flide_requests_total{route="/v1/score",status="%d"}'

    def count(status):
        for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith(series % status):
                return float(line.split()[-1])
        return 0.0

    before = {status: count(status) for status in (400, 500)}
    mark = len(log.read_text())

    async def leave():
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/v1/score", 1000).encode() + b'{"query": [1, 2')
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    async def run():
        await asyncio.gather(*(leave() for _ in range(3)))

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while count(400) < before[400] + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (count(400), count(500)) == (before[400] + 3, before[500])
    assert "Traceback" not in log.read_text()[mark:]
    assert requests.get(f"{url}/health", timeout=5).status_code == 200
