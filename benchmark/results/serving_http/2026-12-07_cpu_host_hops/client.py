import asyncio, aiohttp, time, statistics, sys, random
url = sys.argv[1]; n = int(sys.argv[2])
rng = random.Random(0)
async def main():
    spans = []
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            body = {"query": [rng.randrange(3, 120) for _ in range(465)], "items": [[rng.randrange(3, 120) for _ in range(8)]],
                    "label_token_ids": [33, 34, 35, 36], "apply_softmax": True}
            t = time.perf_counter()
            async with s.post(url + "/v1/score", json=body) as r:
                await r.read(); assert r.status == 200, await r.text()
            spans.append(time.perf_counter() - t)
    spans = spans[20:]
    print(f"client p50 {statistics.median(spans)*1e3:.3f} ms  p10 {sorted(spans)[len(spans)//10]*1e3:.3f}")
asyncio.run(main())
