"""When a request arrived: the time its latencies (TTFT, queue time, E2E) count from, stamped as early as the server
can see it, so /metrics holds as much of a client's wait as possible. With httptools (the serve extra's, uvicorn's
choice when installed) the stamp is taken by uvicorn's protocol as the request's first bytes are parsed, before the
rest of its headers and body are read, a task is made for it and the ASGI stack is entered; otherwise the
application's outermost layer (xrt.serve.front) takes it when it is called (later by that much)."""

from __future__ import annotations

import time
from typing import Any

ARRIVAL = "xrt.arrival"  # the key in the ASGI scope: time.perf_counter() at arrival


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn serves with h11, and xrt.serve.front stamps
    HttpToolsProtocol = None


def http_protocol() -> Any:
    """uvicorn's `http` setting: its httptools protocol stamping each request's arrival, or "auto"."""
    return "auto" if HttpToolsProtocol is None else _StampingHttpTools


if HttpToolsProtocol is not None:

    class _StampingHttpTools(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        def on_message_begin(self) -> None:
            # httptools calls this on the first bytes of a request, from the data_received that brought them.
            super().on_message_begin()
            self.scope[ARRIVAL] = time.perf_counter()  # type: ignore[index]
