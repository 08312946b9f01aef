"""`python -m xrt serve`: an OpenAI-compatible HTTP server over one LLMEngine.

The engine's side: `core.py` (`Core`: the engine stepping while requests are live, ops taken between steps, each
step's deltas out with the engine's state). The HTTP side: `client.py` (`EngineClient`: submit / abort, the queue
bound, each HTTP request's deltas onto its asyncio queue, the metrics' clocks) over one of two transports,
`in_process.py` (the default: the engine in a process of its own, a pipe between) or `in_thread.py` (a thread of
the HTTP process). `app.py` is the FastAPI application (routes, auth, the arrival stamp); `protocol.py` the request
bodies, `prepare.py` a body to engine requests (checked by the engine's `Admission`), `responses.py` the OpenAI
response and chunk shapes, `sse.py` the event stream that aborts its requests when the client leaves, `metrics.py`
Prometheus `/metrics`, `errors.py` the OpenAI error JSON, `server.py` uvicorn (SIGTERM drains and exits 0; a
background server for tests). The CLI entry is `xrt/cli/serve_cmd.py`. Imports engine and config only, never below
them."""
