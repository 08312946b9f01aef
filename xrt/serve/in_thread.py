"""The engine on a thread of the HTTP process (`serve.engine_process=false`): ops go into the core's inbox directly,
and each step's deltas come back through `loop.call_soon_threadsafe` (one call per step). The two share one GIL: a
step's Python waits while handlers run and the other way round, which many streams feel (`in_process` does not)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from xrt.engine.llm import LLM
from xrt.engine.outputs import StreamOutput
from xrt.log import get_logger
from xrt.serve.client import EngineClient
from xrt.serve.core import Core, EngineState, Inbox, Op
from xrt.serve.metrics import Metrics

log = get_logger(__name__)


class ThreadEngine(EngineClient):
    def __init__(self, llm: LLM, metrics: Metrics, max_live: int) -> None:
        super().__init__(llm.engine.admission, metrics, max_live)
        self.llm = llm
        self.engine = llm.engine
        self._inbox = Inbox()
        self._thread = threading.Thread(target=self._run, name="xrt-engine-core", daemon=True)
        self._closed = False

    async def start(self) -> None:
        self._aloop = asyncio.get_running_loop()
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _send(self, op: Op) -> None:
        self._inbox.put(op)

    def close(self, timeout_s: float = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._inbox.put(("stop",))
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.llm.close()

    def _run(self) -> None:
        try:
            Core(self.engine, self._emit).run(self._inbox)
        except BaseException as e:  # noqa: BLE001 -- reported to every client and on /health, never silent
            log.error(f"engine stopped: {type(e).__name__}: {e}")
            self._post(self._failed, f"{type(e).__name__}: {e}")
            return
        self._post(self._stopped)

    def _emit(self, items: list[tuple[int, StreamOutput]], state: EngineState, at: float) -> None:
        self._post(self._dispatch, items, state, at)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._aloop is not None
        try:
            self._aloop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop has closed: nobody is waiting any more
            pass
