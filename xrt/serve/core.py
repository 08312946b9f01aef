"""The engine's side of a server. `Core` owns the LLMEngine and runs `step_stream()` while any request is live; the
HTTP side's ops (add, abort, abort every request, stop) wait in its inbox (`OpSource`) and are taken between steps,
so no step waits on a client; each step's deltas, keyed by the HTTP side's choice keys, go to `emit` with a snapshot
of the engine's state for /metrics and the time the step ended. It knows no transport: `in_thread` runs it on a
thread of the HTTP process, `in_process` in a process of its own, and the two differ only in how ops arrive and
deltas leave.

Every added key ends with exactly one last delta (its `output` set; finish_reason "abort" when it was aborted), unless
the core itself fails: then the HTTP side ends what it holds."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from xrt.engine.engine import LLMEngine
from xrt.engine.outputs import StreamOutput

# ("add", key, Request) | ("abort", [key, ...]) | ("abort_all",) | ("stop",)
Op = tuple[Any, ...]

# How long the idle core sleeps between looks at its inbox when nothing wakes it (an op wakes it at once).
IDLE_WAIT_S = 1.0
# The tiers' counters (a dict of tens of entries) go with a step's state at most this often, and whenever the engine
# goes idle: a scrape sees them a fraction of a second late at worst, and a busy step never builds them.
TIERS_EVERY_S = 0.5


class EngineState(NamedTuple):
    """What /metrics shows of the engine between its steps."""

    running: int
    waiting: int
    kv_usage: float
    tiers: dict[str, Any] | None  # TierCounters.as_dict(), None without tiers


class OpSource(Protocol):
    """Where the core takes its ops: `Inbox` (the engine on a thread), in_process.PipeInbox (in a process)."""

    def take(self) -> list[Op]:
        """The ops that have come since the last take, without waiting."""
        ...

    def wait(self, timeout_s: float) -> None:
        """Returns when an op may have come, or after timeout_s."""
        ...


class Inbox:
    """Ops from the HTTP side; put from any thread, taken by the core's."""

    def __init__(self) -> None:
        self._ops: deque[Op] = deque()
        self._wake = threading.Event()

    def put(self, op: Op) -> None:
        self._ops.append(op)
        self._wake.set()

    def take(self) -> list[Op]:
        self._wake.clear()  # before the ops are read: a put after this sets it again
        ops = []
        while self._ops:
            ops.append(self._ops.popleft())
        return ops

    def wait(self, timeout_s: float) -> None:
        self._wake.wait(timeout_s)


# (deltas by key, the engine's state, perf_counter() when the step that made them ended: the same clock in every
# process of the machine, so the HTTP side tells the engine's time from the way back)
Emit = Callable[[list[tuple[int, StreamOutput]], EngineState, float], None]


class Core:
    def __init__(self, engine: LLMEngine, emit: Emit) -> None:
        self.engine = engine
        self.emit = emit
        self._key_of: dict[int, int] = {}  # engine request id -> the HTTP side's choice key
        self._id_of: dict[int, int] = {}  # and back
        self._state: EngineState | None = None
        self._tiers: dict[str, Any] | None = None
        self._tiers_at = 0.0

    def run(self, inbox: OpSource) -> None:
        """Until a stop op has come and every request has ended (a stop aborts them). An exception leaves it: the
        transport reports it."""
        engine = self.engine
        stopping = False
        while True:
            for op in inbox.take():
                stopping = self._apply(op) or stopping
            if engine.has_unfinished():
                deltas = engine.step_stream()
                self._deliver(deltas, time.perf_counter())
                continue
            # Gone idle: the state as it rests (pages freed, tiers written).
            self._publish([], time.perf_counter(), fresh_tiers=True)
            if stopping:
                return
            inbox.wait(IDLE_WAIT_S)

    def _apply(self, op: Op) -> bool:
        """Applies one op; True for a stop."""
        kind = op[0]
        if kind == "add":
            _, key, request = op
            request_id = self.engine.queue(request, stream=True)
            self._key_of[request_id] = key
            self._id_of[key] = request_id
        elif kind == "abort":
            for key in op[1]:
                request_id = self._id_of.get(key)
                if request_id is not None:
                    self.engine.abort(request_id)
        elif kind in ("abort_all", "stop"):
            for request_id in list(self._key_of):
                self.engine.abort(request_id)
            return kind == "stop"
        else:
            raise ValueError(f"engine core: unknown op {kind!r}")
        return False

    def _deliver(self, deltas: list[StreamOutput], at: float) -> None:
        items = []
        for d in deltas:
            key = self._key_of.get(d.request_id)
            if key is None:
                continue
            if d.finished:
                del self._key_of[d.request_id]
                del self._id_of[key]
            items.append((key, d))
        self._publish(items, at, fresh_tiers=False)

    def _publish(self, items: list[tuple[int, StreamOutput]], at: float, fresh_tiers: bool) -> None:
        engine = self.engine
        now = time.monotonic()
        if fresh_tiers or now - self._tiers_at >= TIERS_EVERY_S:
            counters = engine.tier_stats(flush=False)
            self._tiers = None if counters is None else counters.as_dict()
            self._tiers_at = now
        state = EngineState(engine.num_requests_running, engine.num_requests_waiting, engine.kv_cache_usage,
                            self._tiers)
        if items or state != self._state:
            self._state = state
            self.emit(items, state, at)
