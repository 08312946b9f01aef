"""The NIXL side of L2 (l2.py): an agent per role with L1's buffer registered, and the transfers it runs.

The L1 buffer is registered with each agent once. A batch of chunks is one NIXL transfer (one descriptor per
chunk on each side: the slot's bytes in L1, the whole of its file, or with the OBJ backend the whole of its
object, registered as an OBJ segment whose metaInfo is the object's key), posted and then polled with
`check_xfer_state` until DONE or ERR; the poll spins briefly and then sleeps with a growing interval (NIXL's
Python API has no blocking wait).

A transfer may carry a deadline (policy.py): past it the caller stops waiting and recomputes. The transfer
cannot be taken back from NIXL while it runs, so a late transfer is handed to a thread that waits for it, then
releases its NIXL resources and runs the caller's cleanup (its slots and files); until then the agent is busy
and later transfers with a deadline fail at once (L2Busy) instead of queueing behind it.

NIXL agents are made without their own locking (NIXL_THREAD_SYNC_NONE, the default without a listener thread),
so each agent has a lock, held across a transfer (by the waiting thread, for a late one)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from xrt.kvstore.l1 import L1Cache
from xrt.log import get_logger

log = get_logger(__name__)
# Spin this long before sleeping between polls: a POSIX batch of a few chunks is often done within it.
SPIN_S = 200e-6
MAX_POLL_SLEEP_S = 2e-3
# the agents' roles: WRITE stores, READ loads at admission, PREFETCH loads ahead of admission (prefetch.py)
ROLES = ("WRITE", "READ", "PREFETCH")


class L2Error(RuntimeError):
    """A transfer that did not complete (ERR state, or NIXL raised)."""


class L2Late(L2Error):
    """A transfer still running at its deadline: left to a thread that frees its resources when it ends."""


class L2Busy(L2Late):
    """A transfer with a deadline not started: the agent is still finishing a late one."""


class L2Agent:
    """One NIXL agent with the L1 buffer registered, and the lock its callers take. Its role's transfers
    write files (objects, with OBJ) from L1 (WRITE) or read them into L1 (the others)."""

    def __init__(self, api: Any, name: str, role: str, backend: str, params: dict[str, str], l1: L1Cache) -> None:
        self.lock = threading.Lock()
        self.backend = backend
        self.op = "WRITE" if role == "WRITE" else "READ"
        self.segment = "OBJ" if backend == "OBJ" else "FILE"  # what a transfer's targets are: objects, or fds
        self.agent = api.nixl_agent(name, api.nixl_agent_config(backends=[]))
        self.agent.create_backend(backend, params)
        buf = l1.buffer
        self.dev = max(buf.get_device(), 0)
        self.mem = "VRAM" if buf.is_cuda else "DRAM"
        self.base = buf.data_ptr()
        self.reg: Any = self.agent.register_memory([(self.base, buf.numel(), self.dev, "")], self.mem,
                                                   backends=[backend])

    def transfer(self, offsets: Sequence[int], fds: Sequence[int] | Sequence[str], nbytes: int,
                 deadline: float | None = None, on_late: Callable[[], None] | None = None) -> None:
        """One NIXL transfer: the nbytes at each offset of the L1 buffer <-> the whole of its file (an fd) or,
        with OBJ, of its object (a key in the backend's bucket). Raises
        L2Error unless DONE. With a deadline (a perf_counter time), raises L2Late once it passes, or L2Busy at
        once when the agent is still busy with an earlier late transfer; `on_late` then runs on the thread that
        waits the transfer out, after its NIXL resources are released."""
        if deadline is None:
            self.lock.acquire()
        elif not self.lock.acquire(blocking=False):
            raise L2Busy(f"NIXL {self.backend} {self.op}: the agent is still finishing a late transfer")
        handed_off = False
        try:
            handed_off = self._transfer_locked(offsets, fds, nbytes, deadline, on_late)
        finally:
            if not handed_off:
                self.lock.release()
        if handed_off:
            raise L2Late(f"NIXL {self.backend} {self.op} of {len(fds)} chunks not done by its deadline")

    def _transfer_locked(self, offsets: Sequence[int], fds: Sequence[int] | Sequence[str], nbytes: int,
                         deadline: float | None, on_late: Callable[[], None] | None) -> bool:
        """The transfer, the lock held. True when it passed its deadline: a thread now owns it, its
        resources and the lock (`_finish_late`)."""
        n, agent, op = nbytes, self.agent, self.op
        if self.segment == "OBJ":
            # an object is named by its registration's metaInfo; the device id only tells this transfer's
            # descriptors apart (registered and released with it, so 0..n-1 never collide)
            segments = [(0, n, i, str(name)) for i, name in enumerate(fds)]
        else:
            segments = [(0, n, int(fd), "") for fd in fds]
        seg = self.segment
        file_reg = agent.register_memory(segments, seg, backends=[self.backend])
        handle = None
        late = False
        try:
            local = agent.get_xfer_descs([(self.base + offset, n, self.dev) for offset in offsets], self.mem)
            remote = agent.get_xfer_descs([(0, n, dev) for _, _, dev, _ in segments], seg)
            handle = agent.initialize_xfer(op, local, remote, agent.name, backends=[self.backend])
            state = agent.transfer(handle)
            start, pause = time.perf_counter(), 20e-6
            while state == "PROC":
                now = time.perf_counter()
                if deadline is not None and now > deadline:
                    late = True
                    self._finish_late(handle, file_reg, on_late)
                    return True
                if now - start > SPIN_S:
                    time.sleep(pause)
                    pause = min(2 * pause, MAX_POLL_SLEEP_S)
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise L2Error(f"NIXL {self.backend} {op} of {len(fds)} chunks ended in state {state}")
        except L2Error:
            raise
        except Exception as e:  # NIXL raises its own nixl*Error types from the bindings
            raise L2Error(f"NIXL {self.backend} {op} of {len(fds)} chunks failed: {e}") from e
        finally:
            if not late:
                if handle is not None:
                    handle.release()
                agent.deregister_memory(file_reg, backends=[self.backend])
        return False

    def _finish_late(self, handle: Any, file_reg: Any, on_late: Callable[[], None] | None) -> None:
        """Wait out a transfer past its deadline on a thread, then release it, run on_late (the caller's
        cleanup: its files and slots) and the agent's lock."""

        def wait() -> None:
            try:
                while self.agent.check_xfer_state(handle) == "PROC":
                    time.sleep(MAX_POLL_SLEEP_S)
            except Exception as e:  # noqa: BLE001  logged: the cleanup below must still run
                log.warning("L2: a late %s transfer failed while finishing: %s", self.backend, e)
            finally:
                with contextlib.suppress(Exception):
                    handle.release()
                with contextlib.suppress(Exception):
                    self.agent.deregister_memory(file_reg, backends=[self.backend])
                try:
                    if on_late is not None:
                        on_late()
                finally:
                    self.lock.release()

        threading.Thread(target=wait, name="xrt-kv-l2-late", daemon=True).start()

    def close(self) -> None:
        """Deregister the L1 buffer, once a late transfer has finished (its thread holds the lock)."""
        with self.lock:
            if self.reg is not None:
                self.agent.deregister_memory(self.reg, backends=[self.backend])
                self.reg = None
