"""Starting the ranks of a tensor-parallel run and stopping them. `Ranks.spawn` (rank 0 is this process):
a TCP store on a free port, tp - 1 worker processes from the spawn context (safe after CUDA is initialised),
a watchdog over them, the process groups. `Ranks.torchrun`: the ranks torchrun started, nothing spawned.
`Ranks.close` ends the workers: SHUTDOWN over the channel when it is in a known state, then terminate
whatever is left; it is idempotent and also runs when the runner is collected and at interpreter exit."""

from __future__ import annotations

import multiprocessing
import threading
import time
from multiprocessing.process import BaseProcess

import torch.distributed as dist

from xrt.config import XrtConfig
from xrt.distributed.channel import KeepAlive, StepChannel
from xrt.distributed.env import TorchrunEnv
from xrt.distributed.errors import WorkerFailed
from xrt.distributed.groups import (
    Groups,
    close_groups,
    init_groups,
    joined,
    master_store,
    reported_failure,
    torchrun_groups,
)
from xrt.distributed.watchdog import Watchdog
from xrt.distributed.wire import Kind
from xrt.executor.graphs.capture import CaptureStrategy
from xrt.log import get_logger

log = get_logger(__name__)

# How long rank 0 waits, after one of its collectives failed, for a worker's failure to show up (the worker
# reports, then exits; the collective can fail first).
FAILURE_WAIT_S = 5.0
# Shutdown: how long the workers get to leave on their own, then after SIGTERM.
EXIT_WAIT_S = 5.0


class Ranks:
    """The other ranks of a run, as rank 0 holds them."""

    def __init__(self, cfg: XrtConfig, groups: Groups | None, processes: dict[int, BaseProcess],
                 watchdog: Watchdog | None, owns_groups: bool) -> None:
        self.cfg = cfg
        self.groups = groups
        self.processes = processes
        self.watchdog = watchdog
        self.owns_groups = owns_groups
        self.channel: StepChannel | None = None
        self.keepalive: KeepAlive | None = None
        self.broken: str | None = None  # why the ranks are out of step (a failure, an interrupted call)
        self.closed = False

    # -- starting ---------------------------------------------------------------------------------

    @classmethod
    def spawn(cls, cfg: XrtConfig, capture: CaptureStrategy | None) -> Ranks:
        if dist.is_initialized():
            raise ValueError(
                "parallel.tp: torch.distributed is already initialised in this process (is another "
                "tensor-parallel LLM still open? `del` it first)"
            )
        from xrt.distributed.spawn_guard import check_spawn
        from xrt.distributed.worker import spawned_main

        size = cfg.parallel.tp
        check_spawn(size)
        store = master_store(cfg)
        ctx = multiprocessing.get_context("spawn")
        processes: dict[int, BaseProcess] = {}
        ranks = cls(cfg, None, processes, None, owns_groups=True)
        try:
            for rank in range(1, size):
                p = ctx.Process(target=spawned_main, args=(cfg, rank, store.port, capture),
                                name=f"xrt-tp-rank{rank}", daemon=True)
                p.start()
                processes[rank] = p
            ranks.watchdog = Watchdog(processes, store, ranks._stop_workers)
            ranks._wait_joined(store, size - 1)
            ranks.groups = init_groups(cfg, 0, 0, store)
        except BaseException:
            ranks.close()
            raise
        log.debug(f"tensor parallelism: {size} ranks, store {cfg.parallel.master_addr}:{store.port}, "
                  f"{ranks.groups.backend}")
        return ranks

    @classmethod
    def torchrun(cls, cfg: XrtConfig, env: TorchrunEnv) -> Ranks:
        return cls(cfg, torchrun_groups(cfg, env), {}, None, owns_groups=False)

    def _wait_joined(self, store: dist.Store, n: int) -> None:
        """Until every spawned rank reached the store, watching them meanwhile (a worker that dies while it
        starts fails the run now, not when the rendezvous times out)."""
        deadline = time.monotonic() + self.cfg.parallel.timeout_s
        while joined(store) < n:
            if self.watchdog is not None and self.watchdog.failure:
                raise WorkerFailed(self.watchdog.failure)
            if time.monotonic() > deadline:
                raise WorkerFailed(
                    f"tensor-parallel ranks: {joined(store)} of {n} workers reached the rendezvous in "
                    f"parallel.timeout_s={self.cfg.parallel.timeout_s:g} s"
                )
            time.sleep(0.02)

    def open_channel(self) -> StepChannel:
        assert self.groups is not None
        self.channel = StepChannel(self.groups.channel)
        self.keepalive = KeepAlive(self.channel, self.cfg.parallel.timeout_s / 4)
        return self.channel

    # -- failing ----------------------------------------------------------------------------------

    def failure(self) -> str | None:
        return self.watchdog.failure if self.watchdog is not None else None

    def failed(self, e: BaseException) -> BaseException:
        """What to raise for `e`, raised by a call that involved the other ranks: a WorkerFailed naming the
        rank when one failed, else `e`. The ranks are out of step from now on either way."""
        found = None
        # A collective or channel error (RuntimeError: gloo, NCCL, store) may be a worker's failure showing.
        if isinstance(e, RuntimeError) and not isinstance(e, WorkerFailed):
            found = self._find_failure(FAILURE_WAIT_S)
        elif isinstance(e, WorkerFailed):
            found = str(e)
        self.broken = found or f"rank 0: {type(e).__name__}: {e}"
        return WorkerFailed(found) if found and not isinstance(e, WorkerFailed) else e

    def _find_failure(self, wait_s: float) -> str | None:
        if self.watchdog is not None:
            return self.watchdog.wait_failure(wait_s)
        groups = self.groups
        if groups is None:
            return None
        deadline = time.monotonic() + wait_s
        while True:  # torchrun: no processes to watch; the failing rank left its error in the store
            for rank in range(1, groups.size):
                text = reported_failure(groups.store, rank)
                if text:
                    return f"tensor-parallel rank {rank} failed: {text}"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def _stop_workers(self, failed_rank: int) -> None:
        """The watchdog's reaction to a failure: the others go too, which makes rank 0's pending wait fail."""
        self.broken = self.broken or (self.watchdog.failure if self.watchdog else None)
        for rank, p in self.processes.items():
            if rank != failed_rank and p.is_alive():
                p.terminate()
        if self.groups is not None and self.groups.backend == "nccl":
            # A NCCL collective does not notice a dead peer; aborting the communicators ends rank 0's wait.
            try:
                dist.distributed_c10d._abort_process_group(self.groups.model)
            except Exception:  # noqa: BLE001  best effort: the timeout still bounds the wait
                pass

    # -- stopping ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.keepalive is not None:
            self.keepalive.stop()
        healthy = self.broken is None and self.failure() is None
        if self.channel is not None and healthy:
            self._send_shutdown()
        if self.watchdog is not None:
            self.watchdog.stop()
        self._end_processes(wait_s=EXIT_WAIT_S if healthy else 0.0)
        if self.owns_groups:
            close_groups()

    def _send_shutdown(self) -> None:
        # In a thread: a worker that no longer listens must not hold rank 0 until the channel's timeout.
        channel = self.channel
        assert channel is not None

        def send() -> None:
            try:
                channel.send(Kind.SHUTDOWN)
            except Exception:  # noqa: BLE001  the workers are terminated below anyway
                pass

        t = threading.Thread(target=send, name="xrt-tp-shutdown", daemon=True)
        t.start()
        t.join(EXIT_WAIT_S)

    def _end_processes(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        for p in self.processes.values():
            p.join(max(deadline - time.monotonic(), 0.0))
        for sig in ("terminate", "kill"):
            alive = [p for p in self.processes.values() if p.is_alive()]
            if not alive:
                return
            for p in alive:
                getattr(p, sig)()
            end = time.monotonic() + EXIT_WAIT_S
            for p in alive:
                p.join(max(end - time.monotonic(), 0.0))
