"""L2 -> L1 ahead of admission: loads that overlap other requests' compute.

A request queued behind others (or behind the step the engine is running) does not need its prefix until the
scheduler admits it. When it is queued, the tiered manager submits the keys of its L2-only prefix chunks here;
a background thread reads them (batches of `cache.l2.load_batch_mb`, its own NIXL agent, role PREFETCH) into
L1 slots, verifies and publishes them. At admission those chunks are L1 hits, or still being written: the
lookup then waits for them only as long as recomputing them would take (tiered.py), so a prefetch can only
make TTFT shorter. On a busy engine the read is hidden behind the running batch entirely, which is where L2
pays off even when a synchronous load would be slower than recomputing.

A job stops at its first chunk that fails (the rest would not be contiguous with the prefix) and never takes
more than half of L1's slots, so a prompt longer than L1 does not evict its own first chunks. The keys it
loaded are remembered (`take_loaded`), so the per-request counts say those tokens came from L2."""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict

from xrt.kvstore.l1 import L1Cache, L1Full
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.stats import TierStats
from xrt.log import get_logger

log = get_logger(__name__)
# jobs (one per queued request) waiting for the prefetch thread; past this, requests are not prefetched
QUEUE_JOBS = 256
# keys loaded by prefetches and not yet claimed by an admission; the oldest are forgotten past this
LOADED_KEYS = 1 << 16
# how long a load waits for a prefetch of its chunk in flight without a deadline (load_policy=always)
PREFETCH_WAIT_S = 600.0


def leading_run(l1: L1Cache, keys: list[bytes], in_l2: list[bool]) -> tuple[list[bytes], list[bytes]]:
    """(the leading run of `keys` held in L1, being written there, or in L2; those of them to read from L2): what
    a queued request's prefetch can bring up contiguously with what is held already."""
    run, todo = [], []
    for key, stored in zip(keys, in_l2, strict=True):
        in_l1 = l1.contains(key) or l1.writing(key)
        if not (in_l1 or stored):
            break
        run.append(key)
        if not in_l1:
            todo.append(key)
    return run, todo


class Prefetcher:
    def __init__(self, l1: L1Cache, l2: L2Store, stats: TierStats, load_batch: int) -> None:
        self.l1, self.l2, self.stats = l1, l2, stats
        self.load_batch = load_batch
        self.max_chunks = max(1, l1.num_slots // 2)
        self.jobs: queue.Queue[list[bytes] | None] = queue.Queue(QUEUE_JOBS)
        self._loaded: OrderedDict[bytes, None] = OrderedDict()
        self._loaded_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="xrt-kv-prefetch", daemon=True)
        self._thread.start()

    def submit(self, keys: list[bytes]) -> bool:
        """Prefetch these L2 chunk keys, in prefix order; False when the queue is full (nothing queued)."""
        if not keys or not self._thread.is_alive():
            return False
        try:
            self.jobs.put_nowait(keys[: self.max_chunks])
        except queue.Full:
            return False
        return True

    def take_loaded(self, key: bytes) -> bool:
        """Whether a prefetch loaded `key` (and it is not claimed yet): its tokens count as L2's."""
        with self._loaded_lock:
            return self._loaded.pop(key, 0) is None

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                self._fetch(job)
            except Exception as e:  # noqa: BLE001  a failed prefetch is a miss, never a dead thread
                self.stats.prefetch_errors += 1
                log.warning("L2 prefetch failed: %s", e)
            finally:
                self.jobs.task_done()

    def _fetch(self, keys: list[bytes]) -> None:
        for b in range(0, len(keys), self.load_batch):
            items: list[tuple[bytes, int]] = []
            for key in keys[b : b + self.load_batch]:
                if self.l1.contains(key):
                    continue
                try:
                    slot = self.l1.reserve(key)
                except L1Full:
                    break
                if slot is not None:  # None: in L1 already, or being written there by someone else
                    items.append((key, slot))
            if not items:
                continue
            start = time.perf_counter()
            result = self.l2.load(items, role="PREFETCH")
            good = 0
            for (key, slot), crc in zip(items, result.crcs, strict=True):
                if crc is None:
                    self.l1.abort(slot)
                    continue
                with self._loaded_lock:
                    self._loaded[key] = None
                    while len(self._loaded) > LOADED_KEYS:
                        self._loaded.popitem(last=False)
                self.l1.publish(slot, crc)
                good += 1
            self.stats.prefetched_chunks += good
            self.stats.prefetch_bytes += good * self.l2.chunk_bytes
            self.stats.prefetch_s += time.perf_counter() - start
            if good < len(items):
                return

    def flush(self) -> None:
        """Wait until every submitted prefetch is done (tests, benchmarks)."""
        self.jobs.join()

    def close(self) -> None:
        self.flush()
        self.jobs.put(None)
        self._thread.join()
