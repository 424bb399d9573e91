"""The HTTP floor under a decision request: what a request costs SGLang's
bench_serving client and a server's HTTP layer before any model work.

Probes routes that never reach a scheduler (``GET /health``, ``GET /v1/models``)
and, when given, a ``/v1/score`` body of a workload's size that the server
refuses while validating it (no ``label_token_ids``), each timed as
``bench_serving``'s request functions time a request: a fresh aiohttp session
(``sglang.benchmark.serving._create_bench_client_session``) per request, from
send to the whole answer read; and again over one kept-alive session, which
shows what the per-request connection costs. Any server of SGLang's routes
(Flide's, SGLang's) is measured the same way.

Usage:
    python benchmark/serving/http_floor.py --url http://127.0.0.1:30000 --label flide \\
        --requests 200 --score-tokens 465 --out floor.json

Prints one line per probe (p50 and p90 in ms) and writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import aiohttp

PROBES = ("health", "models", "refused_score")


def _request(probe: str, url: str, tokens: int):
    if probe == "health":
        return "GET", f"{url}/health", None
    if probe == "models":
        return "GET", f"{url}/v1/models", None
    # A RACE-sized body refused while it is validated: no label_token_ids.
    return "POST", f"{url}/v1/score", {"query": list(range(3, 3 + tokens)), "items": [[5, 6, 7]],
                                       "apply_softmax": True}


async def _time(probe: str, url: str, tokens: int, count: int, fresh: bool) -> list[float]:
    from sglang.benchmark.serving import _create_bench_client_session

    method, target, body = _request(probe, url, tokens)
    spans = []
    kept = None if fresh else _create_bench_client_session()
    try:
        for _ in range(count):
            session = _create_bench_client_session() if fresh else kept
            try:
                start = time.perf_counter()
                async with session.request(method, target, json=body) as response:
                    await response.read()
                spans.append(time.perf_counter() - start)
            finally:
                if fresh:
                    await session.close()
    finally:
        if kept is not None:
            await kept.close()
    return spans


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--label", default="server")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per probe (after 10 untimed)")
    parser.add_argument("--score-tokens", type=int, default=0,
                        help="also probe a refused /v1/score body of this many query tokens (0: not)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    probes = PROBES if args.score_tokens > 0 else PROBES[:2]
    rows = []
    try:
        for probe in probes:
            for fresh in (True, False):
                asyncio.run(_time(probe, args.url, args.score_tokens, 10, fresh))
                spans = sorted(asyncio.run(_time(probe, args.url, args.score_tokens, args.requests, fresh)))
                row = {"label": args.label, "probe": probe, "session": "per request" if fresh else "kept",
                       "requests": len(spans), "p50_ms": 1e3 * statistics.median(spans),
                       "p90_ms": 1e3 * spans[int(0.9 * (len(spans) - 1))]}
                rows.append(row)
                print(f"{args.label} {probe:14s} session {row['session']:11s} p50 {row['p50_ms']:.3f} ms, "
                      f"p90 {row['p90_ms']:.3f} ms")
    except aiohttp.ClientError as e:
        print(f"http_floor.py: {args.url}: {e}", file=sys.stderr)
        return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"url": args.url, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
