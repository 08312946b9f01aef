"""The step channel: rank 0 broadcasts each message to every other rank over a gloo group of its own.

A message is one fixed frame (`FRAME` int64: kind, payload length, then as much of the payload as fits),
then, only when the payload is longer, one more broadcast of the rest, whose length the frame gave: a
decode step costs one broadcast and a prompt batch of any size two, with no size limit and no pickle.
A receiver waits at most the group's timeout (`parallel.timeout_s`) for the next message, so a rank 0
that hangs cannot leave its workers waiting forever; rank 0 keeps an idle channel alive (`KeepAlive`), so
the timeout bounds a hang, not the time between two requests."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from xrt.distributed.wire import Kind

# A decode step of up to ~100 sequences fits one frame; a larger message takes a second broadcast.
FRAME = 1024
_HEAD = 2


class StepChannel:
    def __init__(self, group: dist.ProcessGroup) -> None:
        self._group = group
        self._frame = torch.zeros(FRAME, dtype=torch.int64)
        self._view = self._frame.numpy()
        self._lock = threading.Lock()  # rank 0: the engine's thread and the keep-alive thread both send
        self.last_send = time.monotonic()

    def send(self, kind: Kind, payload: np.ndarray | None = None) -> None:
        n = 0 if payload is None else len(payload)
        inline = min(n, FRAME - _HEAD)
        with self._lock:
            f = self._view
            f[0], f[1] = int(kind), n
            if inline:
                f[_HEAD : _HEAD + inline] = payload[:inline]  # type: ignore[index]
            dist.broadcast(self._frame, src=0, group=self._group)
            if n > inline:
                rest = np.ascontiguousarray(payload[inline:], dtype=np.int64)  # type: ignore[index]
                dist.broadcast(torch.from_numpy(rest), src=0, group=self._group)
            self.last_send = time.monotonic()

    def recv(self) -> tuple[Kind, np.ndarray]:
        """The next message; the payload is a view valid until the next recv."""
        dist.broadcast(self._frame, src=0, group=self._group)
        f = self._view
        kind, n = Kind(int(f[0])), int(f[1])
        inline = min(n, FRAME - _HEAD)
        if n == inline:
            return kind, f[_HEAD : _HEAD + n]
        rest = torch.empty(n - inline, dtype=torch.int64)
        dist.broadcast(rest, src=0, group=self._group)
        return kind, np.concatenate((f[_HEAD : _HEAD + inline], rest.numpy()))


class KeepAlive:
    """On rank 0: a KEEPALIVE whenever nothing was sent for `period_s`, so an idle run (an `LLM` waiting for
    its next `generate`) does not time its workers out. Stops at the first failed send: a channel that
    failed is the run's failure, which the engine's thread reports."""

    def __init__(self, channel: StepChannel, period_s: float) -> None:
        self._channel = channel
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xrt-tp-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            idle = time.monotonic() - self._channel.last_send
            if self._stop.wait(max(self._period - idle, 0.01)):
                return
            if time.monotonic() - self._channel.last_send >= self._period:
                try:
                    self._channel.send(Kind.KEEPALIVE)
                except Exception:  # noqa: BLE001  see the class docstring
                    return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
