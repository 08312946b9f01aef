"""The serve scenario's client (xrt.bench.serve_client.run) against a stub OpenAI server on 127.0.0.1 that counts
what it is sent: at most bench.max_concurrency requests in flight (the stub's own count), every request sent once
with the asked prompt and max_tokens, one ITL per chunk after the first, output tokens from the usage chunk, and
failures (an error status, a stream cut short, an error event) recorded per request, not raised; a warm-up that
fails, or a server with no model, stops the run with one line."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("aiohttp")

import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, Response, StreamingResponse  # noqa: E402

from xrt.bench.serve_client import LoadError, run  # noqa: E402

# The first prompt id picks what the stub does with a request.
BAD_REQUEST, CUT_SHORT, ERROR_EVENT = 1, 2, 3
HOLD_S = 10.0  # a stream waits this long at most for `hold` streams to be in flight together (against a hang)


class Stub:
    def __init__(self, hold: int = 0, models: bool = True) -> None:
        self.hold, self.models = hold, models
        self.in_flight = self.peak = 0
        self.bodies: list[dict[str, Any]] = []
        self.peers: list[Any] = []  # the client address (host, port) each request came from: its connection
        self.app = FastAPI()
        self.app.get("/v1/models")(self.list_models)
        self.app.post("/v1/completions")(self.completions)
        self.app.get("/metrics")(self.metrics)

    async def metrics(self) -> Response:
        """A TTFT histogram in vLLM's namespace, two label sets: 10 ms per request sent, split between them; a queue
        time histogram, 2 ms per request; a histogram the client does not read."""
        n = len(self.bodies)
        lines = ["# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
                 "# TYPE vllm:time_to_first_token_seconds histogram"]
        for half, label in ((n // 2, "a"), (n - n // 2, "b")):
            lines += [f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="{label}"}} {half}.0',
                      f'vllm:time_to_first_token_seconds_count{{model_name="{label}"}} {half}.0',
                      f'vllm:time_to_first_token_seconds_sum{{model_name="{label}"}} {0.01 * half}']
        lines += [f"vllm:request_queue_time_seconds_count {n}.0", f"vllm:request_queue_time_seconds_sum {0.002 * n}",
                  f"vllm:e2e_request_latency_seconds_count {n}.0", f"vllm:e2e_request_latency_seconds_sum {n}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    async def list_models(self) -> Response:
        if not self.models:
            return JSONResponse({"error": {"message": "nope"}}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": "stub-model"}]})

    async def completions(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.bodies.append(body)
        self.peers.append(tuple(request.client))
        kind = body["prompt"][0]
        if kind == BAD_REQUEST:
            return JSONResponse({"error": {"message": "max_tokens: too many"}}, status_code=400)
        return StreamingResponse(self._stream(body, kind), media_type="text/event-stream")

    async def _stream(self, body: dict[str, Any], kind: int) -> AsyncIterator[str]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.full = getattr(self, "full", None) or asyncio.Event()  # made on the server's event loop
        if self.in_flight >= self.hold:
            self.full.set()
        try:
            try:
                await asyncio.wait_for(self.full.wait(), HOLD_S)
            except asyncio.TimeoutError:
                pass
            for i in range(body["max_tokens"]):
                if kind == ERROR_EVENT and i == 1:
                    yield f"data: {json.dumps({'error': {'message': 'engine error: x'}})}\n\n"
                    return
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': 't'}], 'usage': None})}\n\n"
                await asyncio.sleep(0.001)
                if kind == CUT_SHORT and i == 0:
                    return
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"],
                     "prompt_tokens_details": {"cached_tokens": 2}}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            await asyncio.sleep(0.02)  # the body ends in a later write, as xrt serve's does
        finally:
            self.in_flight -= 1


@pytest.fixture
def serve_stub(request: pytest.FixtureRequest) -> Iterator[tuple[Stub, str]]:
    stub = Stub(**getattr(request, "param", {}))
    server = uvicorn.Server(uvicorn.Config(stub.app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield stub, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def spec(url: str, prompts: list[list[int]], max_tokens: list[int], concurrency: int = 0, **extra: Any) -> dict:
    return {"base_url": url, "api_key": "", "model": "", "prompts": prompts, "max_tokens": max_tokens,
            "offsets": [0.0] * len(prompts), "max_concurrency": concurrency, "warmup_prompts": [],
            "warmup_max_tokens": 2, **extra}


@pytest.mark.parametrize("serve_stub", [{"hold": 3}], indirect=True)
def test_at_most_max_concurrency_requests_are_in_flight(serve_stub: tuple[Stub, str]) -> None:
    stub, url = serve_stub
    prompts = [[10 + i, 7] for i in range(12)]
    out = asyncio.run(run(spec(url, prompts, [3] * 12, concurrency=3)))
    assert stub.peak == 3  # the stub holds each stream until three are in flight: the cap is reached, never passed
    assert sorted(b["prompt"][0] for b in stub.bodies) == [10 + i for i in range(12)]  # each sent once
    assert all(r["ok"] for r in out["requests"]) and out["model"] == "stub-model"


@pytest.mark.parametrize("serve_stub", [{"hold": 120}], indirect=True)
def test_without_a_limit_every_request_is_in_flight_at_once(serve_stub: tuple[Stub, str]) -> None:
    stub, url = serve_stub
    out = asyncio.run(run(spec(url, [[10 + i] for i in range(120)], [2] * 120)))
    assert stub.peak == 120  # past the 100 connections aiohttp's pool holds by default
    assert all(r["ok"] for r in out["requests"])


def test_each_request_is_timed_by_its_chunks_and_failures_are_recorded(serve_stub: tuple[Stub, str]) -> None:
    stub, url = serve_stub
    prompts = [[20, 5, 5], [BAD_REQUEST, 5], [CUT_SHORT, 5], [ERROR_EVENT, 5], [21]]
    out = asyncio.run(run(spec(url, prompts, [4, 4, 4, 4, 1])))
    ok, bad, cut, event, single = out["requests"]
    sent = {b["prompt"][0]: b for b in stub.bodies}
    assert sent[20] == {"model": "stub-model", "prompt": [20, 5, 5], "max_tokens": 4, "temperature": 0.0,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    assert ok["ok"] and ok["output_tokens"] == 4 and ok["prompt_len"] == 3 and ok["cached_tokens"] == 2
    assert len(ok["itl"]) == 3 and 0 < ok["ttft"] <= ok["latency"]  # 4 chunks: a TTFT and 3 gaps
    assert ok["ttft"] + sum(ok["itl"]) <= ok["latency"]
    assert single["ok"] and single["itl"] == [] and single["output_tokens"] == 1
    assert (bad["ok"], bad["error"]) == (False, "HTTP 400: max_tokens: too many")
    assert (cut["ok"], cut["error"]) == (False, "the stream ended before data: [DONE]")
    assert (event["ok"], event["error"]) == (False, "stream error: engine error: x")
    assert out["duration"] >= max(r["start"] + r["latency"] for r in out["requests"])


def test_the_servers_histograms_are_read_over_the_timed_requests_only(serve_stub: tuple[Stub, str]) -> None:
    _, url = serve_stub
    out = asyncio.run(run(spec(url, [[20 + i] for i in range(5)], [2] * 5, warmup_prompts=[[30], [31], [32]])))
    # the 3 warm-up requests left out; no prefill histogram on this server; the e2e one not read
    assert out["server"] == {"ttft": {"sum": pytest.approx(0.05), "count": 5.0},
                             "queue": {"sum": pytest.approx(0.01), "count": 5.0}}


def test_a_failed_warm_up_stops_the_run(serve_stub: tuple[Stub, str]) -> None:
    stub, url = serve_stub
    with pytest.raises(LoadError, match="the warm-up request to .* failed: HTTP 400: max_tokens: too many"):
        asyncio.run(run(spec(url, [[20]], [2], warmup_prompts=[[BAD_REQUEST]])))
    assert [b["prompt"] for b in stub.bodies] == [[BAD_REQUEST]]  # nothing timed was sent


@pytest.mark.parametrize("serve_stub", [{"models": False}], indirect=True)
def test_a_server_that_lists_no_model_is_one_line(serve_stub: tuple[Stub, str]) -> None:
    _, url = serve_stub
    with pytest.raises(LoadError, match=r"bench.url: GET .*/v1/models: HTTP 401: nope"):
        asyncio.run(run(spec(url, [[20]], [2])))


def test_one_request_after_another_reuses_one_connection(serve_stub: tuple[Stub, str]) -> None:
    """Each stream is read to its end, so its connection goes back to the pool: the next request does not wait for a
    new connection (at concurrency 1 that wait would be in every TTFT)."""
    stub, url = serve_stub
    out = asyncio.run(run(spec(url, [[30 + i] for i in range(6)], [3] * 6, concurrency=1)))
    assert all(r["ok"] for r in out["requests"])
    assert len(stub.peers) == 6 and len(set(stub.peers)) == 1
