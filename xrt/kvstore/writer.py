"""The L2 writer: a background thread taking published L1 chunks off a bounded queue and storing them in
L2 in batches (one NIXL transfer each), so a decode step never waits for storage.

A full queue refuses the chunk (`offer` returns False; the caller counts it dropped and keeps it L1-only).
A batch that fails is logged and counted (`TierStats.store_errors`); after MAX_CONSECUTIVE_ERRORS failed
batches in a row the L2 store is turned off, loudly (an error line; queued chunks are released, later ones
refused), rather than failing every batch for the rest of the run. A thread that dies of anything else is
noticed by `ensure_running` (the tiered manager calls it on every commit), logged, counted
(`writer_restarts`) and started again: never silently dead, as HiCache's prefetch thread could be."""

from __future__ import annotations

import queue
import threading
import time

from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.stats import TierStats
from xrt.log import get_logger

log = get_logger(__name__)
# chunks waiting for the writer, at least; up to half of L1's slots (a queued chunk only holds its L1 slot, so
# one long prompt's chunks, e.g. 128 of a 32k prompt, all fit); past this, new chunks are stored in L1 only
QUEUE_CHUNKS = 64
# chunks per NIXL write transfer
BATCH = 8
MAX_CONSECUTIVE_ERRORS = 8

Item = tuple[bytes, int, int | None]  # (key, L1 slot referenced for the writer, crc or None)


class L2Writer:
    def __init__(self, l2: L2Store, l1: L1Cache, stats: TierStats) -> None:
        self.l2, self.l1, self.stats = l2, l1, stats
        stats.l2_direct_io = int(l2.direct)  # how loads read (fixed at the store's start-up, nearly always)
        stats.l2_off = f"L2 stored nothing: {l2.error}" if l2.error else ""
        self.queue: queue.Queue[Item | None] = queue.Queue(max(QUEUE_CHUNKS, l1.num_slots // 2))
        self.off: str | None = None  # why the store was turned off
        self._errors_in_a_row = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xrt-kv-l2", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return self.queue.qsize()

    def offer(self, item: Item) -> bool:
        """Queue a chunk for L2; False (nothing queued: the caller releases its slot) when the queue is full
        or the store is off."""
        if self.off is not None:
            return False
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            return False
        self.stats.store_queue_max = max(self.stats.store_queue_max, self.queue.qsize())
        return True

    def offer_published(self, key: bytes) -> None:
        """Queue a chunk just published in L1, its slot referenced until written (L1 eviction must not reuse
        it); a full queue (or a store turned off) leaves it L1-only, counted as dropped."""
        got = self.l1.acquire(key)
        if got is not None and not self.offer((key, got[0], got[1])):
            self.l1.release(got[0])
            self.stats.dropped_l2 += 1

    def ensure_running(self) -> None:
        """Start the thread again if it died (it logs why before it goes)."""
        if self._stopping or self._thread is None or self._thread.is_alive():
            return
        self.stats.writer_restarts += 1
        log.error("L2 writer thread died; started again (restart %d)", self.stats.writer_restarts)
        self._start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            batch = [item]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            items = [b for b in batch if b is not None]
            try:
                if items and self.off is None:
                    self._store(items)
            except BaseException:
                log.exception("L2 writer thread failed")
                raise
            finally:
                for _, slot, _ in items:
                    self.l1.release(slot)
                for _ in batch:
                    self.queue.task_done()
            if stop:
                return

    def _store(self, items: list[Item]) -> None:
        start = time.perf_counter()
        try:
            stored = self.l2.store(items)
        except Exception as e:  # a bug or NIXL failure must not kill the writer: the chunks stay L1-only
            log.warning("L2 writer: %s", e)
            stored = None
        if stored is None or self.l2.last_store_failed:
            self.stats.store_errors += 1
            self._errors_in_a_row += 1
            if self._errors_in_a_row >= MAX_CONSECUTIVE_ERRORS:
                self.off = f"{self._errors_in_a_row} store batches failed in a row"
                self.stats.l2_off = f"L2 stored nothing more once {self.off} (storing turned off)"
                log.error("L2 tier: %s; storing turned off for this run (loads continue)", self.off)
            return
        self._errors_in_a_row = 0
        self.stats.l2_direct_io = int(self.l2.direct)  # a first load may have found O_DIRECT refused since
        self.stats.stored_l2 += len(stored)
        self.stats.stored_bytes_l2 += len(stored) * self.l2.chunk_bytes
        self.stats.store_s_l2 += time.perf_counter() - start

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued chunk is written (or refused), at most timeout_s (None: no limit); False when
        the queue was not through by then (logged: a writer stuck or far behind never hangs its caller)."""
        self.ensure_running()
        with self.queue.all_tasks_done:
            done = self.queue.all_tasks_done.wait_for(lambda: not self.queue.unfinished_tasks, timeout_s)
        if not done:
            log.error("L2 writer: %d chunks still queued after %.0f s; not waiting longer (they stay L1-only)",
                      self.queue.unfinished_tasks, timeout_s)
        return done

    def close(self, timeout_s: float | None = None) -> None:
        """flush (at most timeout_s), then stop the thread (a daemon: one still stuck after that is left behind)."""
        done = self.flush(timeout_s)
        self._stopping = True
        try:
            self.queue.put(None, timeout=timeout_s if done else 0.01)
        except queue.Full:
            return
        if self._thread is not None:
            self._thread.join(None if done else 0.01)  # done: nothing left but the stop item
            self._thread = None
