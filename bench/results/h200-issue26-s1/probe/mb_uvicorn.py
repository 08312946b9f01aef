import asyncio, time, statistics, threading, json, sys
import uvicorn, aiohttp
from fastapi import FastAPI
from starlette.responses import Response
from xrt.serve.arrival import Arrival, ARRIVAL, http_protocol
app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(Arrival)
D = []
async def comp(request):
    D.append(time.perf_counter() - request.scope[ARRIVAL])
    await request.body()
    return Response(status_code=200)
app.add_route("/v1/completions", comp, methods=["POST"])
cfg = uvicorn.Config(app, http=http_protocol(), port=18777, log_level="warning", access_log=False, loop=sys.argv[1])
srv = uvicorn.Server(cfg)
th = threading.Thread(target=srv.run, daemon=True); th.start()
time.sleep(1.5)
async def main():
    payload = json.dumps({"prompt": list(range(1000))}).encode()
    async with aiohttp.ClientSession() as s:
        for i in range(300):
            async with s.post("http://127.0.0.1:18777/v1/completions", data=payload) as r:
                await r.read()
            await asyncio.sleep(0.002)
asyncio.run(main())
print(sys.argv[1], "arrival -> handler us median", statistics.median(D[50:]) * 1e6)
srv.should_exit = True; th.join()
