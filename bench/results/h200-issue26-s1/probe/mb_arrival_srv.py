import sys, time
sys.path.insert(0, ".")  # run from the repository root
import uvicorn
from fastapi import FastAPI
from starlette.responses import Response
from xrt.serve.arrival import Arrival, ARRIVAL, http_protocol
app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
app.add_middleware(Arrival)
async def comp(request):
    await request.body()
    return Response(status_code=200, headers={"x-arrival": repr(request.scope[ARRIVAL]), "x-handler": repr(time.perf_counter())})
app.add_route("/v1/completions", comp, methods=["POST"])
uvicorn.run(app, http=http_protocol(), port=18779, log_level="warning", access_log=False)
