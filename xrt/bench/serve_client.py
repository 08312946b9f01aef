"""The serve scenario's load generator, a process of its own (`python -m xrt.bench.serve_client`: its spec as JSON on
stdin, its results as JSON on stdout), so that an event loop parsing every stream's chunks never takes the GIL
from the process that serves (vLLM's `bench serve` is a separate client process for the same reason).

It knows nothing of xrt's engine. It asks /v1/models for the model when not told, sends the warm-up requests (all at
once, untimed; one failing stops the run), then each request at its offset from the start, at most
`max_concurrency` in flight (0: no limit; a request waiting for a slot is not timed yet, as in vLLM), as a streamed
/v1/completions request with a token-id prompt, greedy and `ignore_eos`. Each is timed as vLLM's client times it:
TTFT to the first chunk carrying a choice, one ITL per later such chunk, E2EL to the end of the stream; its output
tokens come from the usage chunk (`stream_options.include_usage`). The server's own TTFT, queue and prefill
histograms are read from its /metrics before and after the timed requests, so the clocks can be compared, and
the HTTP round trip of GET /v1/models just before them. Its HTTP client is aiohttp, as `vllm bench serve`'s is: its C
parser reads a stream's chunks in a fraction of httpx's time, which is the client's own share of every TTFT and ITL
(bench/results/h200-issue24-s3). Imports aiohttp (uvloop when installed), the standard library and xrt.progress, no
torch, so it starts in a fraction of a second."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any

import aiohttp

from xrt.log import set_level
from xrt.progress import Progress

CONNECT_TIMEOUT_S = 60.0
# Between two reads of one stream. A request queued behind thousands of others gets its first byte late, so this
# only catches a server that stopped answering.
READ_TIMEOUT_S = 3600.0
# The server's histograms read around the timed requests, by vLLM's names (which xrt serve's /metrics keeps): its
# TTFT, and the engine's part of it (arrival to the first step, that step to the first token).
SERVER_HISTOGRAMS = {"time_to_first_token_seconds": "ttft", "request_queue_time_seconds": "queue",
                     "request_prefill_time_seconds": "prefill"}
RTT_SAMPLES = 21
ERROR_CHARS = 300  # of a response body that is not the OpenAI error shape


class LoadError(Exception):
    """The run cannot go on (no model to ask for, a warm-up request failed); one line."""


def _headers(api_key: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _error_text(status: int, body: bytes) -> str:
    """`HTTP 400: <the OpenAI error's message>`, or the start of a body that is not one."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:ERROR_CHARS]
    return f"HTTP {status}: {message}"


def body(model: str, prompt: list[int], max_tokens: int) -> bytes:
    return json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }).encode()


async def send(client: aiohttp.ClientSession, url: str, headers: dict[str, str], payload: bytes, prompt_len: int,
               t0: float) -> dict[str, Any]:
    """One streamed request; its timings in seconds (`start` from t0) and what went wrong, if anything."""
    start = time.perf_counter()
    ttft: float | None = None
    itl: list[float] = []
    last = start
    output_tokens: int | None = None
    cached: int | None = None
    error: str | None = None
    done = False
    end = start
    try:
        async with client.post(url, data=payload, headers=headers) as response:
            if response.status != 200:
                error = _error_text(response.status, await response.read())
            else:
                async for line in response.content:  # one SSE line at a time
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        # Read on to the end of the body, never leave it: a response left unread closes its
                        # connection, and the next request would wait for a new one.
                        done = True
                        end = time.perf_counter()
                        continue
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        error = f"stream error: {chunk['error'].get('message', chunk['error'])}"
                        break
                    if chunk.get("choices"):
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - start
                        else:
                            itl.append(now - last)
                        last = now
                    elif chunk.get("usage"):
                        usage = chunk["usage"]
                        output_tokens = usage.get("completion_tokens")
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:  # ValueError: a chunk not JSON
        error = f"{type(e).__name__}: {e}"
    latency = (end if done else time.perf_counter()) - start
    if error is None and not done:
        error = "the stream ended before data: [DONE]"
    if error is None and ttft is None:
        error = "no chunk carried a choice"
    if error is None and output_tokens is None:
        output_tokens = 1 + len(itl)  # a server that sends no usage: one token per chunk
    return {"ok": error is None, "error": error, "start": start - t0, "ttft": ttft, "itl": itl, "latency": latency,
            "prompt_len": prompt_len, "output_tokens": output_tokens, "cached_tokens": cached}


async def _get(client: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with client.get(url, headers=headers) as response:
        return response.status, await response.read()


async def _model(client: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> str:
    try:
        status, content = await _get(client, f"{base}/v1/models", headers)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise LoadError(f"bench.url: GET {base}/v1/models: {type(e).__name__}: {e}") from None
    if status != 200:
        raise LoadError(f"bench.url: GET {base}/v1/models: {_error_text(status, content)}")
    try:
        return str(json.loads(content)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise LoadError(f"bench.url: GET {base}/v1/models: no model listed") from None


async def round_trip(client: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> float | None:
    """The median of RTT_SAMPLES sequential GET /v1/models, in seconds: what this client and the server's HTTP layer
    cost a request without the engine, the "plus HTTP" of a served TTFT against the offline one. None if refused."""
    times = []
    for _ in range(RTT_SAMPLES):
        start = time.perf_counter()
        try:
            status, _ = await _get(client, f"{base}/v1/models", headers)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None
        if status != 200:
            return None
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def histograms(client: aiohttp.ClientSession, base: str) -> dict[str, dict[str, float]] | None:
    """sum and count of the SERVER_HISTOGRAMS on the server's /metrics (one scrape), each over its label sets,
    whatever the namespace (`xrt:`, `vllm:`); a histogram the server lacks is left out; None when it has no
    /metrics."""
    try:
        status, content = await _get(client, f"{base}/metrics")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    if status != 200:
        return None
    found: dict[str, dict[str, float]] = {}
    for line in content.decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric = series.split("{")[0].rsplit(":", 1)[-1]
        name, _, part = metric.rpartition("_")
        if part in ("sum", "count") and name in SERVER_HISTOGRAMS:
            totals = found.setdefault(SERVER_HISTOGRAMS[name], {"sum": 0.0, "count": 0.0})
            totals[part] += float(value)
    return found


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: base_url, api_key, model ("" : ask /v1/models), prompts, max_tokens and offsets (one each per request),
    max_concurrency, warmup_prompts and warmup_max_tokens."""
    base = spec["base_url"].rstrip("/")
    url = f"{base}/v1/completions"
    headers = _headers(spec.get("api_key", ""))
    connector = aiohttp.TCPConnector(limit=0)  # no bound on connections (a session holds 100 by default)
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
    # read_bufsize: one SSE line (an event) may hold a long text or many logprobs.
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=2**20) as client:
        model = spec.get("model") or await _model(client, base, headers)
        warm = [send(client, url, headers, body(model, p, spec["warmup_max_tokens"]), len(p), time.perf_counter())
                for p in spec["warmup_prompts"]]
        for r in await asyncio.gather(*warm):
            if not r["ok"]:
                raise LoadError(f"the warm-up request to {url} failed: {r['error']}")
        payloads = [body(model, p, n) for p, n in zip(spec["prompts"], spec["max_tokens"], strict=True)]
        slots = asyncio.Semaphore(spec["max_concurrency"]) if spec["max_concurrency"] else None
        with Progress(len(payloads), "serve benchmark", "request", final=False) as bar:

            async def one(i: int, t0: float) -> dict[str, Any]:
                await asyncio.sleep(max(0.0, t0 + spec["offsets"][i] - time.perf_counter()))
                if slots is None:
                    r = await send(client, url, headers, payloads[i], len(spec["prompts"][i]), t0)
                else:
                    async with slots:
                        r = await send(client, url, headers, payloads[i], len(spec["prompts"][i]), t0)
                bar.update(1)
                return r

            rtt = await round_trip(client, base, headers)
            before = await histograms(client, base)
            t0 = time.perf_counter()
            requests = await asyncio.gather(*(one(i, t0) for i in range(len(payloads))))
            duration = time.perf_counter() - t0
        after = await histograms(client, base)
    gained = None if before is None or after is None else {
        name: {k: v - before.get(name, {}).get(k, 0.0) for k, v in totals.items()} for name, totals in after.items()}
    return {"model": model, "duration": duration, "requests": requests, "server": gained,
            "http_rtt": rtt}


def _event_loop_run(main: Any) -> Any:
    """uvloop's event loop when installed (the serve extra has it): less of the client's own time in each TTFT."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> int:
    spec = json.load(sys.stdin)
    set_level(spec.get("log_level", "info"))
    try:
        result = _event_loop_run(run(spec))
    except LoadError as e:
        result = {"error": str(e)}
    except Exception as e:  # noqa: BLE001 -- one line for the parent's error; the traceback only with XRT_DEBUG
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        result = {"error": f"the serve benchmark's client failed: {type(e).__name__}: {e}"}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
