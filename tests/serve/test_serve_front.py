"""The application's outermost layer (xrt.serve.front): the generation endpoints reach their handlers without the
application behind it, an APIError becomes the OpenAI error shape, everything else (another method, another path,
a server under a root_path, the lifespan) goes to the application, and every HTTP request is stamped with its
arrival unless the protocol stamped it. Driven through httpx's ASGI transport, no socket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from fastapi import Request  # noqa: E402
from fastapi.responses import JSONResponse, Response  # noqa: E402

from xrt.serve.arrival import ARRIVAL  # noqa: E402
from xrt.serve.errors import APIError  # noqa: E402
from xrt.serve.front import Front  # noqa: E402


class Behind:
    """The application behind the front: records what reached it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append((scope["type"], scope.get("method"), scope.get("path")))
        await JSONResponse({"behind": True, "arrival": scope.get(ARRIVAL)})(scope, receive, send)


async def handler(request: Request) -> Response:
    body = await request.json()
    if body.get("bad"):
        raise APIError(400, "bad: not allowed", "bad")
    return JSONResponse({"front": True, "echo": body, "arrival": request.scope[ARRIVAL]})


def call(front: Front, method: str, path: str, root_path: str = "", **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=front, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def test_the_generation_routes_reach_their_handlers_and_nothing_else_does() -> None:
    behind = Behind()
    front = Front(behind, {("POST", "/v1/completions"): handler})

    r = call(front, "POST", "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 200 and r.json()["front"] and r.json()["echo"] == {"prompt": "hi"}
    assert isinstance(r.json()["arrival"], float)  # stamped by the front: the transport does not
    assert behind.seen == []

    r = call(front, "POST", "/v1/completions", json={"bad": 1})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "bad: not allowed" and r.json()["error"]["param"] == "bad"
    assert behind.seen == []

    for method, path in [("GET", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/metrics")]:
        r = call(front, method, path)
        assert r.json()["behind"] and isinstance(r.json()["arrival"], float)
    # Under a root_path the route the router matches is not scope["path"]: the application routes it.
    r = call(front, "POST", "/v1/completions", root_path="/api", json={})
    assert r.json()["behind"]
    assert behind.seen == [("http", "GET", "/v1/completions"), ("http", "POST", "/v1/chat/completions"),
                           ("http", "GET", "/metrics"), ("http", "POST", "/v1/completions")]


def test_an_arrival_the_protocol_stamped_is_kept() -> None:
    seen: list[float] = []

    async def stamped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[ARRIVAL] = 12.5  # as uvicorn's httptools protocol stamps the first bytes
        await Front(Behind(), {("POST", "/v1/completions"): record})(scope, receive, send)

    async def record(request: Request) -> Response:
        seen.append(request.scope[ARRIVAL])
        return Response(status_code=204)

    async def go() -> int:
        transport = httpx.ASGITransport(app=stamped)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return (await client.post("/v1/completions", json={})).status_code

    assert asyncio.run(go()) == 204 and seen == [12.5]
