"""The HTTP side of the engine: `EngineClient` takes a handler's choices (`submit`, 503 beyond the queue bound) and
aborts (`abort`, `abort_all`), sends them to the core as ops, and hands each step's deltas to the jobs' queues on
the event loop's thread (`_dispatch`), where the metrics read the engine's times, and a whole answer's latencies:
a token counts as delivered when the server can send it, the way from the engine (a pipe, the GIL) included (a
stream's tokens when their chunk is written: xrt.serve.app). Its transports (`in_thread`, `in_process`)
say how ops reach the core and deltas come back; everything else about a request's life is here, the same for
both."""

from __future__ import annotations

import asyncio
import itertools
import time

from xrt.engine.admission import Admission
from xrt.engine.outputs import StreamOutput
from xrt.engine.request import Request
from xrt.serve.core import EngineState, Op
from xrt.serve.errors import APIError
from xrt.serve.jobs import Choice, Job
from xrt.serve.metrics import Metrics


class EngineFailed(Exception):
    """The engine stopped on an error: every live request ends with it."""


class EngineClient:
    def __init__(self, admission: Admission, metrics: Metrics, max_live: int) -> None:
        """max_live: most choices live at once; one more is refused with 503 (scheduler.max_num_seqs running plus
        serve.max_queued waiting)."""
        self.admission = admission
        self.metrics = metrics
        self.max_live = max_live
        self.error: str | None = None  # why the engine stopped, once it has
        self._choices: dict[int, Choice] = {}  # live, by key (event loop thread only)
        self._keys = itertools.count()
        self._stopping = False
        self._aloop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ what a transport provides

    async def start(self) -> None:
        """Deltas are dispatched on the running event loop from now on (the server's lifespan starts it)."""
        raise NotImplementedError

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Aborts what is left and stops the engine, the event loop still running (the lifespan's end)."""
        self.close(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stops the engine (its pages, tiers and ranks released) from outside an event loop too; idempotent."""
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def _send(self, op: Op) -> None:
        """Hands an op to the core (on the event loop's thread)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the handlers' side

    @property
    def running(self) -> bool:
        return self.error is None and not self._stopping and self.alive

    @property
    def live(self) -> int:
        """Choices submitted and not finished."""
        return len(self._choices)

    def submit(self, requests: list[Request], received: float | None = None, stream: bool = False) -> Job:
        """Queues a request's choices (on the event loop's thread); APIError 503 beyond the queue bound.
        received: perf_counter() when the server got the request, the arrival its latencies count from (reading
        and checking the body is part of what a client waits for). stream: its handler times its tokens as it
        writes them (Metrics.delivered); otherwise they are timed here, as they reach the event loop."""
        if not self.running:
            raise APIError(503, "the server is shutting down" if self.error is None else
                           f"the engine stopped on an error: {self.error}")
        if self.live + len(requests) > self.max_live:
            raise APIError(503, f"the server holds {self.live} requests, its limit is {self.max_live} "
                           "(scheduler.max_num_seqs running + serve.max_queued waiting); retry later",
                           code="queue_full")
        job = Job(asyncio.Queue(), stream=stream)
        now = time.perf_counter() if received is None else received
        job.choices = [Choice(job, i, r, now, next(self._keys)) for i, r in enumerate(requests)]
        job.unfinished = len(requests)
        for c in job.choices:
            self._choices[c.key] = c
            self._send(("add", c.key, c.request))
        return job

    def abort(self, job: Job) -> None:
        """Ends a job's unfinished choices (a client that left, a cancelled handler); idempotent."""
        if job.done or job.aborted:
            return
        job.aborted = True
        keys = [c.key for c in job.choices if c.key in self._choices]
        if keys and self.error is None:
            self._send(("abort", keys))

    def abort_all(self) -> None:
        """Ends every live request (the end of a shutdown's grace period); from any thread: each client still gets
        its last chunk (finish_reason "abort")."""
        if self._aloop is not None:
            try:
                self._aloop.call_soon_threadsafe(self._send, ("abort_all",))
            except RuntimeError:  # the event loop has closed: nothing is live any more
                pass

    # ------------------------------------------------------------------ deltas in, on the event loop's thread

    def _dispatch(self, items: list[tuple[int, StreamOutput]], state: EngineState, at: float) -> None:
        # A whole answer's latencies are read here, when the event loop has the tokens, not when the step ended: the
        # way from the engine is part of what a client waits for (a stream's, when each chunk is written).
        now = time.perf_counter()
        self.metrics.engine_state(state)
        for key, delta in items:
            choice = self._choices.get(key)
            if choice is None:
                continue
            self.metrics.engine_part(choice, delta, at)
            if not choice.job.stream:
                self.metrics.delivered(choice, len(delta.token_ids), delta.output is not None, now)
            if delta.output is not None:
                del self._choices[key]
                choice.job.unfinished -= 1
            choice.job.queue.put_nowait((choice.index, delta))

    def _failed(self, why: str) -> None:
        """The engine has stopped on an error: every live choice ends with it, and new requests get 503."""
        if self.error is None:
            self.error = why
        error = EngineFailed(why)
        for choice in self._choices.values():
            choice.job.unfinished -= 1
            choice.job.queue.put_nowait((choice.index, error))
        self._choices.clear()

    def _stopped(self) -> None:
        """The core has stopped (asked to): what it did not end cannot end any more."""
        if self._choices:
            self._failed("the engine stopped")
