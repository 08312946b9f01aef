"""The application's outermost ASGI layer. It stamps a request's arrival where the protocol did not (h11, another
server: xrt.serve.arrival), and hands the generation endpoints (`POST /v1/completions`, `POST
/v1/chat/completions`) straight to their handlers; everything else (the other routes, a wrong method on these
paths, the lifespan) goes through FastAPI. Starlette's stack (its error and exception middleware, the router's
walk over the routes, the per-route exception wrapper) is time inside every TTFT, and these handlers need none of
it: they read the Request themselves, turn every failure into an APIError (xrt.serve.app._guarded), and answer
it here in the OpenAI error shape as the application's handler would."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from xrt.serve.arrival import ARRIVAL
from xrt.serve.errors import APIError
from xrt.serve.sse import Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Front:
    def __init__(self, app: ASGIApp, routes: dict[tuple[str, str], Handler]) -> None:
        """routes: (method, path) -> handler, for requests the server gets at its root (no root_path)."""
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if ARRIVAL not in scope:
                scope[ARRIVAL] = time.perf_counter()
            handler = None if scope.get("root_path") else self.routes.get((scope["method"], scope["path"]))
            if handler is not None:
                request = Request(scope, receive, send)
                try:
                    response = await handler(request)
                except APIError as e:
                    response = JSONResponse(e.body(), status_code=e.status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
