"""The engine in a process of its own (`serve.engine_process=true`, the default), as vLLM runs its EngineCore: the
HTTP process parses, checks (its copy of the engine's `Admission`), shapes and sends; the engine process only steps.
They talk over one pipe: ops one way, one message per step the other (its deltas as plain tuples, which pickle
several times faster than dataclasses, and the engine's state). Neither waits on the other's GIL.

Start-up: the engine process loads the model and answers ("ready", admission) or ("error", line); `start_process`
waits for that, so a server listens only once its model is up, and a bad model is one line and exit 2. The engine
process ignores SIGINT and SIGTERM: the HTTP process drains and then stops it (a Ctrl-C reaches the whole process
group). If the HTTP process goes away, the engine process sees its pipe close, aborts everything and exits; if the
engine process dies, every live request ends with an error, new ones and /health get 503 (a router's or
Kubernetes' health check takes the server out), and `xrt serve` exits 1 when it is stopped."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from xrt.config import XrtConfig
from xrt.engine.outputs import StreamOutput
from xrt.engine.tokenizer import Tokenizer
from xrt.log import get_logger, set_level
from xrt.serve.client import EngineClient
from xrt.serve.core import Core, EngineState, Inbox, Op
from xrt.serve.metrics import Metrics

log = get_logger(__name__)


class EngineStartError(ValueError):
    """The engine process could not start (the model, the config): its one line."""


class ProcessEngine(EngineClient):
    def __init__(self, proc: Any, conn: Connection, ready: Any, metrics: Metrics, max_live: int) -> None:
        super().__init__(ready, metrics, max_live)
        self.proc = proc
        self.conn = conn
        self._closed = False
        self._reading = False

    def start(self, aloop: asyncio.AbstractEventLoop) -> None:
        self._aloop = aloop
        aloop.add_reader(self.conn.fileno(), self._readable)
        self._reading = True

    @property
    def alive(self) -> bool:
        return not self._closed and self.proc.is_alive()

    def _send(self, op: Op) -> None:
        if self._closed:
            return
        try:
            self.conn.send(op)
        except OSError:  # the engine process is gone: its pipe says so to the reader too
            self._gone()

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            self._gone()

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
        if self._reading and self._aloop is not None:
            self._aloop.remove_reader(self.conn.fileno())
            self._reading = False
        if not self._stopping and self.error is None:
            self.proc.join(1.0)
            self._failed(f"the engine process exited (exit code {self.proc.exitcode})")
        self._stopped()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._closed:
            return
        self._stopping = True
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        # Read what it still sends while it aborts and closes: a full pipe would otherwise hold it up.
        deadline = time.monotonic() + timeout_s
        try:
            while self.proc.is_alive() and time.monotonic() < deadline:
                if self.conn.poll(0.05):
                    self._handle(self.conn.recv())
        except (EOFError, OSError):
            pass
        self.proc.join(max(deadline - time.monotonic(), 0.1))
        if self.proc.is_alive():
            log.warning(f"the engine process did not stop within {timeout_s:g} s: killed")
            self.proc.kill()
            self.proc.join(5.0)
        if self._reading and self._aloop is not None:
            try:
                self._aloop.remove_reader(self.conn.fileno())
            except (RuntimeError, ValueError):  # the event loop has closed already
                pass
            self._reading = False
        self._closed = True
        self.conn.close()
        self._stopped()


def start_process(cfg: XrtConfig, tokenizer: Tokenizer | None, metrics: Metrics, max_live: int) -> ProcessEngine:
    """Starts the engine process and waits for its model to load; EngineStartError with its line if it cannot.
    tokenizer: one to use instead of the checkpoint's (it goes to the engine process pickled)."""
    ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA, threads, an event loop
    conn, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=engine_main, args=(cfg, tokenizer, child), name="xrt-engine")
    proc.start()
    child.close()
    try:
        while not conn.poll(0.2):
            if not proc.is_alive():
                raise EOFError
        msg = conn.recv()
    except (EOFError, OSError):
        proc.join(5.0)
        conn.close()
        raise EngineStartError(f"the engine process exited while starting (exit code {proc.exitcode})") from None
    except BaseException:  # Ctrl-C while the model loads
        proc.kill()
        proc.join(5.0)
        conn.close()
        raise
    if msg[0] != "ready":
        proc.join(30.0)
        conn.close()
        raise EngineStartError(msg[1])
    return ProcessEngine(proc, conn, msg[1], metrics, max_live)


# ---------------------------------------------------------------------------- in the engine process


def engine_main(cfg: XrtConfig, tokenizer: Tokenizer | None, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_level(cfg.log_level.value)
    from xrt.engine.llm import LLM

    try:
        llm = LLM(cfg, tokenizer=tokenizer)
    except Exception as e:  # noqa: BLE001 -- the HTTP process prints it, as `xrt serve` prints any bad model
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        known = isinstance(e, (ValueError, OSError))
        _send_quietly(conn, ("error", str(e) if known else f"{type(e).__name__}: {e}"))
        return
    try:
        conn.send(("ready", llm.engine.admission))
        inbox = Inbox()
        threading.Thread(target=_read_ops, args=(conn, inbox), name="xrt-engine-ops", daemon=True).start()
        Core(llm.engine, lambda items, state, at: _send_step(conn, items, state, at)).run(inbox)
        _send_quietly(conn, ("stopped",))
    except BaseException as e:  # noqa: BLE001 -- reported to the HTTP process (every client, /health)
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        _send_quietly(conn, ("failed", f"{type(e).__name__}: {e}"))
    finally:
        llm.close()
        conn.close()


def _read_ops(conn: Connection, inbox: Inbox) -> None:
    """Takes ops off the pipe as they come, so the HTTP process never waits on a full pipe while a step runs."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):  # the HTTP process has gone: end everything
        inbox.put(("stop",))


def _send_step(conn: Connection, items: list[tuple[int, StreamOutput]], state: EngineState, at: float) -> None:
    conn.send(("step", [(key, d.token_ids, d.text, d.output, d.scheduled_at, d.logprobs) for key, d in items],
               state, at))


def _send_quietly(conn: Connection, msg: tuple[Any, ...]) -> None:
    try:
        conn.send(msg)
    except OSError:  # the HTTP process has gone already
        pass
