"""The engine in a process of its own (`serve.engine_process=true`, the default), as vLLM runs its EngineCore: the
HTTP process parses, checks (its copy of the engine's `Admission`), shapes and sends; the engine process only steps.
They talk over one socket pair (xrt.serve.wire's frames): ops one way, one message per step the other (its deltas
as plain tuples, which pickle several times faster than dataclasses, the engine's state, the step's end time). The
HTTP side reads and writes it through an asyncio transport, so a burst of requests never blocks its event loop on a
full pipe (what the engine has not read yet waits in that transport's buffer); the engine's core reads the pipe
itself between steps (`PipeInbox`), and when it goes idle polls it for `serve.idle_spin_ms` before it sleeps in
`select`, so the next request of a client that sends one after another is taken without waking a process. The HTTP
side does the same (`serve.http_spin_ms`): its event loop polls while requests are live and that long after the
last, so a step's message is read without a wake-up. Neither waits on the other's GIL.

Start-up: the engine process loads the model, freezes its start-up heap (`serve.freeze_gc`, xrt.serve.gc_heap) and
answers ("ready", admission, objects frozen) or ("error", line); `start_process`
waits for that, so a server listens only once its model is up, and a bad model is one line and exit 2. The engine
process ignores SIGINT and SIGTERM: the HTTP process drains and then stops it (a Ctrl-C reaches the whole process
group). If the HTTP process goes away, the engine process sees its pipe close, aborts everything and exits; if the
engine process dies, every live request ends with an error, new ones and /health get 503 (a router's or
Kubernetes' health check takes the server out), and `xrt serve` exits 1 when it is stopped."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import select
import signal
import socket
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from xrt.config import XrtConfig
from xrt.engine.admission import Admission
from xrt.engine.outputs import StreamOutput
from xrt.engine.request import Request
from xrt.engine.tokenizer import Tokenizer
from xrt.log import get_logger, set_level
from xrt.serve.client import EngineClient
from xrt.serve.core import Core, EngineState, Op
from xrt.serve.gc_heap import freeze_heap
from xrt.serve.jobs import Job
from xrt.serve.metrics import Metrics
from xrt.serve.wire import Frames, frame, recv, send

log = get_logger(__name__)

READ_BYTES = 1 << 20  # at most, per read of the pipe on the engine's side


class EngineStartError(ValueError):
    """The engine process could not start (the model, the config): its one line."""


class _Pipe(asyncio.Protocol):
    def __init__(self, engine: ProcessEngine) -> None:
        self.engine = engine
        self.frames = Frames()

    def data_received(self, data: bytes) -> None:
        for msg in self.frames.feed(data):
            self.engine._handle(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self.engine._gone()


class ProcessEngine(EngineClient):
    def __init__(self, proc: Any, sock: socket.socket, admission: Admission, metrics: Metrics, max_live: int,
                 spin_s: float = 0.0) -> None:
        """spin_s: serve.http_spin_ms, in seconds."""
        super().__init__(admission, metrics, max_live)
        self.proc = proc
        self.sock = sock
        self.transport: asyncio.Transport | None = None
        self._closed = False
        self.spin_s = spin_s
        self._spinner: asyncio.Task[None] | None = None
        self.frozen_objects = 0  # how many the engine's process froze after start-up (serve.freeze_gc)

    def submit(self, requests: list[Request], received: float | None = None, stream: bool = False) -> Job:
        job = super().submit(requests, received, stream)
        if self.spin_s > 0 and (self._spinner is None or self._spinner.done()):
            self._spinner = asyncio.ensure_future(self._spin())
        return job

    async def _spin(self) -> None:
        """Keeps the event loop polling (a ready task: its select never sleeps) while choices are live and spin_s
        past the last one, so the pipe's next step and the socket's next request are read without a wake-up."""
        idle_until = None
        while not self._stopping:
            if self._choices:
                idle_until = None
            elif idle_until is None:
                idle_until = time.perf_counter() + self.spin_s
            elif time.perf_counter() > idle_until:
                return
            await asyncio.sleep(0)

    async def start(self) -> None:
        self._aloop = asyncio.get_running_loop()
        transport, _ = await self._aloop.create_unix_connection(lambda: _Pipe(self), sock=self.sock)
        self.transport = transport  # type: ignore[assignment]

    @property
    def alive(self) -> bool:
        return not self._closed and self.transport is not None and not self.transport.is_closing()

    def _send(self, op: Op) -> None:
        if self.transport is None or self.transport.is_closing():
            self._gone()
            return
        self.transport.write(frame(op))

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "step":
            self._dispatch([(key, StreamOutput(key, *rest)) for key, *rest in msg[1]], msg[2], msg[3])
        elif kind == "failed":
            log.error(f"engine stopped: {msg[1]}")
            self._failed(msg[1])
        elif kind == "stopped":
            self._stopped()

    def _gone(self) -> None:
        """The pipe closed: the engine process exited, asked to or not."""
        if not self._stopping and self.error is None:
            self.proc.join(1.0)
            code = self.proc.exitcode
            self._failed("the engine process exited" + ("" if code is None else f" (exit code {code})"))
        self._stopped()

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(("stop",)))
        # The pipe stays read while the engine aborts and closes: its last messages never back up.
        deadline = time.monotonic() + timeout_s
        while self.proc.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.close()

    def close(self, timeout_s: float = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        if self.transport is None and self.proc.is_alive():  # never started serving: say stop directly
            try:
                send(self.sock, ("stop",))
            except OSError:
                pass
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            log.warning(f"the engine process did not stop within {timeout_s:g} s: killed")
            self.proc.kill()
            self.proc.join(5.0)
        if self.transport is not None:
            self.transport.close()
        else:
            self.sock.close()
        self._stopped()


def start_process(cfg: XrtConfig, tokenizer: Tokenizer | None, metrics: Metrics, max_live: int) -> ProcessEngine:
    """Starts the engine process and waits for its model to load; EngineStartError with its line if it cannot.
    tokenizer: one to use instead of the checkpoint's (it goes to the engine process pickled)."""
    ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA, threads, an event loop
    # A multiprocessing pipe only to hand the engine process its end of a socket pair; the frames are xrt's.
    ours, theirs = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=engine_main, args=(cfg, tokenizer, theirs), name="xrt-engine")
    proc.start()
    theirs.close()
    sock = _socket_of(ours)
    try:
        while not select.select([sock], [], [], 0.2)[0]:
            if not proc.is_alive():
                raise EOFError
        msg = recv(sock)
    except (EOFError, OSError):
        proc.join(5.0)
        sock.close()
        raise EngineStartError(f"the engine process exited while starting (exit code {proc.exitcode})") from None
    except BaseException:  # Ctrl-C while the model loads
        proc.kill()
        proc.join(5.0)
        sock.close()
        raise
    if msg[0] != "ready":
        proc.join(30.0)
        sock.close()
        raise EngineStartError(msg[1])
    engine = ProcessEngine(proc, sock, msg[1], metrics, max_live, cfg.serve.http_spin_ms / 1e3)
    engine.frozen_objects = msg[2]
    log.debug(f"the engine's process froze {msg[2]} objects of its start-up (serve.freeze_gc)")
    return engine


def _socket_of(conn: Connection) -> socket.socket:
    """The socket under a duplex multiprocessing pipe (a socket pair on POSIX), which then closes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn.fileno()))
    conn.close()
    return sock


# ---------------------------------------------------------------------------- in the engine process


def engine_main(cfg: XrtConfig, tokenizer: Tokenizer | None, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_level(cfg.log_level.value)
    sock = _socket_of(conn)
    from xrt.engine.llm import LLM

    try:
        llm = LLM(cfg, tokenizer=tokenizer)
    except Exception as e:  # noqa: BLE001 -- the HTTP process prints it, as `xrt serve` prints any bad model
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        known = isinstance(e, (ValueError, OSError))
        _send_quietly(sock, ("error", str(e) if known else f"{type(e).__name__}: {e}"))
        sock.close()
        return
    try:
        # Frozen once the model is up (graphs captured, kernels compiled): what serving makes is all a collection walks.
        frozen = freeze_heap() if cfg.serve.freeze_gc else 0
        send(sock, ("ready", llm.engine.admission, frozen))
        inbox = PipeInbox(sock, cfg.serve.idle_spin_ms / 1e3)
        Core(llm.engine, lambda items, state, at: _send_step(sock, items, state, at)).run(inbox)
        _send_quietly(sock, ("stopped",))
    except BaseException as e:  # noqa: BLE001 -- reported to the HTTP process (every client, /health)
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        _send_quietly(sock, ("failed", f"{type(e).__name__}: {e}"))
    finally:
        llm.close()
        sock.close()


class PipeInbox:
    """The pipe from the HTTP process as the core's inbox (`Inbox`'s take / wait), read by the core's own thread. The
    socket stays blocking for the step messages `send` writes; reads never block (MSG_DONTWAIT) but in `wait`."""

    def __init__(self, sock: socket.socket, spin_s: float) -> None:
        self.sock = sock
        self.spin_s = spin_s
        self.frames = Frames()
        self._ops: list[Op] = []
        self._closed = False
        self._spun = False  # this idle spell has had its spin: a core that sleeps on wakes only from select

    def _read(self) -> bool:
        """Parses whatever the pipe holds now into ops; True if it held anything (or has closed)."""
        got = False
        while not self._closed:
            try:
                data = self.sock.recv(READ_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:  # the HTTP process has gone: end everything
                self._closed = True
                self._ops.append(("stop",))
                return True
            self._ops.extend(self.frames.feed(data))
            got = True
        return got

    def take(self) -> list[Op]:
        self._read()
        ops, self._ops = self._ops, []
        if ops:
            self._spun = False
        return ops

    def wait(self, timeout_s: float) -> None:
        if self._ops or self._closed:
            return
        if not self._spun:
            self._spun = True
            deadline = time.perf_counter() + self.spin_s
            while time.perf_counter() < deadline:
                if self._read():
                    return
        select.select([self.sock], [], [], timeout_s)


def _send_step(sock: socket.socket, items: list[tuple[int, StreamOutput]], state: EngineState, at: float) -> None:
    send(sock, ("step", [(key, d.token_ids, d.text, d.output, d.scheduled_at, d.logprobs) for key, d in items],
                state, at))


def _send_quietly(sock: socket.socket, msg: tuple[Any, ...]) -> None:
    try:
        send(sock, msg)
    except OSError:  # the HTTP process has gone already
        pass
