"""Server-sent events whose requests end when the client does. A task watches the connection for
`http.disconnect` from the first byte on, so a client that leaves while its request is still queued, or between
tokens, aborts it at once (`on_close`), not at the next write; the same `on_close` runs however the response
ends (finished, the client gone, the handler cancelled at the end of a shutdown's grace period). `on_sent` runs
after each event's write has returned (its bytes handed to the connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse

# ASGI's callables (starlette.types', spelt out: starlette is fastapi's, not a dependency of xrt's own).
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class EventStream(StreamingResponse):
    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None],
                 on_sent: Callable[[], None] | None = None) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._events = events
        self._on_close = on_close
        self._on_sent = on_sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for text in self._events:
                await send({"type": "http.response.body", "body": text.encode("utf-8"), "more_body": True})
                if self._on_sent is not None:
                    self._on_sent()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # servers of ASGI spec 2.4 raise on a write to a closed connection
            pass
        except asyncio.CancelledError:
            # uvicorn's shutdown backstop cancelled the handler: its requests are aborted below, and the server is
            # going away; ending here keeps a traceback of the cancellation out of its log.
            pass
        finally:
            watcher.cancel()
            self._on_close()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._on_close()
