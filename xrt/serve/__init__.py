"""`python -m xrt serve`: an OpenAI-compatible HTTP server over one LLMEngine.

`loop.py` runs the engine on its own thread (`EngineLoop`: requests join and leave between steps, each HTTP request
gets its deltas on an asyncio queue); `app.py` is the FastAPI application (routes, auth, the queue bound);
`protocol.py` the request bodies, `prepare.py` a body to engine requests, `responses.py` the OpenAI response and
chunk shapes, `sse.py` the event stream that aborts its requests when the client leaves, `metrics.py` Prometheus
`/metrics`, `errors.py` the OpenAI error JSON, `server.py` uvicorn (SIGTERM drains and exits 0; a background
server for tests). The CLI entry is `xrt/cli/serve_cmd.py`. Imports engine and config only, never below them."""
