import asyncio, time, json, statistics, uvloop, aiohttp
async def main():
    payload = json.dumps({"prompt": list(range(1000))}).encode()
    a, h, r = [], [], []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for i in range(400):
            t0 = time.perf_counter()
            async with s.post("http://127.0.0.1:18779/v1/completions", data=payload, headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
            t1 = time.perf_counter()
            a.append(float(resp.headers["x-arrival"]) - t0); h.append(float(resp.headers["x-handler"]) - t0); r.append(t1 - t0)
            await asyncio.sleep(0.001)
    m = lambda x: round(statistics.median(x[50:]) * 1e6, 1)
    print("call->arrival", m(a), "us; call->handler", m(h), "us; round trip", m(r), "us")
uvloop.run(main())
