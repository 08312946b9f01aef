"""The pipe between the HTTP process and the engine's (xrt.serve.wire, xrt.serve.in_process): frames come out whole
and in order however the bytes are cut, and the HTTP side's writes never block or fail when the engine side is not
reading (a burst of long prompts while a step runs): they are buffered, under the plain asyncio loop and uvloop
(which turns its file descriptors non-blocking, so a plain blocking send there fails once the socket is full). The
engine's side reads the pipe as the core's inbox (`PipeInbox`): never blocking in `take`, waking `wait` when an op
comes, one stop op when the HTTP side has gone."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")

from xrt.serve.in_process import PipeInbox, ProcessEngine  # noqa: E402
from xrt.serve.metrics import Metrics  # noqa: E402
from xrt.serve.wire import Frames, frame, recv, send  # noqa: E402


def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut() -> None:
    rng = random.Random(0)
    objs: list[Any] = [("add", i, list(range(rng.randrange(0, 3000)))) for i in range(50)] + [("stop",), {}, b""]
    data = b"".join(frame(o) for o in objs)
    frames, got, i = Frames(), [], 0
    while i < len(data):
        k = rng.choice([1, 2, 7, 8, 9, 100, 5000, 70000])
        got += frames.feed(data[i:i + k])
        i += k
    assert got == objs


def test_a_request_crosses_the_pipe_equal_with_its_ids_as_ints() -> None:
    """Request pickles its prompt ids as int64 bytes (one string, not an opcode per int); the engine's side gets
    back an equal Request whose ids are a list of ints, as the scheduler and the prefix cache take them."""
    from xrt.config import SamplingArgs
    from xrt.engine.request import Request

    ids = [random.Random(1).randrange(0, 151_936) for _ in range(1024)]
    sent = Request(ids, SamplingArgs(max_tokens=7, temperature=0.5, stop=["x"]), "a prompt")
    (got,) = Frames().feed(frame(("add", 3, sent)))
    assert got == ("add", 3, sent)
    request = got[2]
    assert type(request.prompt_token_ids) is list and all(type(i) is int for i in request.prompt_token_ids)
    assert request.sampling.stop == ["x"] and request.prompt == "a prompt"


def test_a_socket_pair_carries_frames_both_ways() -> None:
    a, b = socket.socketpair()
    with a, b:
        send(a, ("ready", [1, 2, 3]))
        assert recv(b) == ("ready", [1, 2, 3])
        a.close()
        with pytest.raises(EOFError):
            recv(b)


class _Alive:
    """Stands in for the engine's process: alive until told otherwise."""

    exitcode = None

    def is_alive(self) -> bool:
        return True

    def join(self, timeout: float | None = None) -> None:
        pass


def _loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


@pytest.mark.parametrize("loop", _loops())
def test_the_http_side_buffers_a_burst_the_engine_side_is_not_reading(loop: str) -> None:
    ours, theirs = socket.socketpair()
    ops = [("add", i, list(range(1000, 3000))) for i in range(400)]  # about 2 MB: many times what the socket holds
    got: list[Any] = []

    async def burst() -> None:
        engine = ProcessEngine(_Alive(), ours, None, Metrics("m"), max_live=1000)  # type: ignore[arg-type]
        await engine.start()
        for op in ops:  # one go, as handlers do between two steps: nothing reads the other end yet
            engine._send(op)
        assert engine.error is None and engine.alive

        def drain() -> None:
            time.sleep(0.2)  # the engine side is busy in a step
            for _ in ops:
                got.append(recv(theirs))

        reader = threading.Thread(target=drain)
        reader.start()
        while reader.is_alive():
            await asyncio.sleep(0.01)  # the event loop runs on, flushing what was buffered
        engine.transport.close()  # type: ignore[union-attr]

    if loop == "uvloop":
        import uvloop

        uvloop.run(burst())
    else:
        asyncio.run(burst())
    theirs.close()
    assert got == ops


def test_the_engines_inbox_takes_ops_whole_without_blocking_and_stops_when_the_pipe_closes() -> None:
    a, b = socket.socketpair()
    with a, b:
        inbox = PipeInbox(b, spin_s=0.001)
        assert inbox.take() == []  # nothing there: no wait
        ops = [("add", i, list(range(i * 500))) for i in range(6)]
        data = b"".join(frame(op) for op in ops)
        a.sendall(data[:1000])  # an op cut anywhere waits for the rest of it
        taken = inbox.take()
        a.sendall(data[1000:])
        while len(taken) < len(ops):
            inbox.wait(5.0)
            taken += inbox.take()
        assert taken == ops
        # An idle core sleeps in wait until an op comes (after its spin), not for its whole timeout.
        threading.Timer(0.2, lambda: a.sendall(frame(("abort", [3])))).start()
        start = time.monotonic()
        inbox.wait(30.0)
        assert time.monotonic() - start < 10.0 and inbox.take() == [("abort", [3])]
        a.close()  # the HTTP process has gone
        inbox.wait(30.0)
        assert inbox.take() == [("stop",)] and inbox.take() == []
        start = time.monotonic()
        inbox.wait(30.0)  # a closed pipe never puts the core to sleep
        assert time.monotonic() - start < 10.0
