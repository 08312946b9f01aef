"""One rank's KV tiers: its L1, its L2 store and writer, its prefetcher, the copier over its own device KV tensor, and
the copies between them in flight. Every rank has one, rank 0 included (its connector, connector.py, decides; a
worker's shard, shard.py, does what rank 0's messages say); both move bytes only through here.

Stores: `add_store` reserves an L1 slot for a chunk of pages and queues its gather; `start_stores` starts the
queued gathers (after the step that computed them has its tokens read back); once a gather's copy is done,
`reap` publishes it in L1 and hands it to the L2 writer. The pages must not change while a gather reads them:
rank 0 pins them in its page manager until `reap` (`pins`); a worker has no page manager, so its compute stream
waits for each gather before the next step (the next step may overwrite the pages).

Loads: `queue_load` adds a chunk already in an L1 slot (referenced) to the step's load; the first one defers
`start_loads` to the KV cache's arrivals, so the runner starts the copy once the forward pass has queued its own
uploads, and the pass waits layer group by layer group (xrt/kvcache/device.py KVArrivals). A slot stays
referenced until its copy up is done (no L2 read or store reuses it meanwhile).

CUDA ordering is the copier's (copy.py); on CPU every copy is done when it returns."""

from __future__ import annotations

import time

import torch

from xrt.config import KVTiers, XrtConfig
from xrt.kvcache.connector import PagePins
from xrt.kvcache.device import DeviceKVCache
from xrt.kvstore.build import build_copier, build_l1, build_l2, chunk_layout
from xrt.kvstore.keys import KeyNamespace
from xrt.kvstore.l1 import L1Full
from xrt.kvstore.prefetch import Prefetcher
from xrt.kvstore.stats import TierStats
from xrt.kvstore.writer import L2Writer
from xrt.units import MB

Event = torch.cuda.Event | None


def _finished(done: Event, wait: bool) -> bool:
    if done is None:
        return True
    if wait:
        done.synchronize()
        return True
    return done.query()


class TierAgent:
    def __init__(self, cfg: XrtConfig, kv_cache: DeviceKVCache, namespace: KeyNamespace,
                 pins: PagePins | None = None) -> None:
        """pins: the page manager that pins a gather's pages (rank 0); None: the compute stream waits for each
        gather instead (a worker)."""
        self.layout = chunk_layout(cfg, kv_cache.layout)
        self.namespace = namespace
        self.l1 = build_l1(cfg, self.layout)
        self.l2 = build_l2(cfg, namespace, self.l1) if cfg.cache.tiers is KVTiers.L1_L2 else None
        self.arrivals = kv_cache.arrivals
        self.copier = build_copier(cfg, kv_cache, self.arrivals)
        self.pins = pins
        self.stats = TierStats()
        self.load_batch = max(1, cfg.cache.l2.load_batch_mb * MB // self.layout.nbytes)  # chunks per L2 read
        self.flush_timeout_s = cfg.cache.l2.flush_timeout_s
        self.writer = L2Writer(self.l2, self.l1, self.stats) if self.l2 is not None else None
        self.prefetcher = (Prefetcher(self.l1, self.l2, self.stats, self.load_batch)
                           if self.l2 is not None and cfg.cache.l2.prefetch else None)
        self._to_gather: list[tuple[list[int], int, bytes]] = []  # (pages, slot, key) reserved, not copied yet
        self._gathers: list[tuple[Event, list[int], int, bytes]] = []  # (done, pages, slot, key)
        self._scatters: list[tuple[Event, int]] = []  # (done, L1 slot the copy still reads)
        # the step's loads not copied yet (start_loads): (slot view, pages, tier) per chunk, and their slots
        self._to_scatter: list[tuple[torch.Tensor, list[int], str]] = []
        self._to_scatter_slots: list[int] = []
        self._closed = False

    # ------------------------------------------------------------------ stores: pages -> L1 -> L2

    def add_store(self, key: bytes, pages: list[int]) -> bool:
        """Reserve an L1 slot for the chunk in `pages` and queue its gather (started by `start_stores`); False when
        L1 has no free slot (every one referenced: the chunk stays GPU-only). Held already: nothing to do."""
        if self.writer is not None:
            self.writer.ensure_running()
        try:
            slot = self.l1.reserve(key)
        except L1Full:
            return False
        if slot is None:
            return True  # in L1 already (loaded from a tier, or another sequence stored it), or being written
        if self.pins is not None:
            self.pins.pin(pages)
        self._to_gather.append((pages, slot, key))
        return True

    def start_stores(self) -> None:
        """Start the gathers queued since the last call."""
        for pages, slot, key in self._to_gather:
            done = self.copier.gather(pages, self.l1.slot_view(slot))
            if self.pins is None and done is not None:  # the module docstring: the next step may overwrite them
                torch.cuda.current_stream(self.copier.kv.device).wait_event(done)
            self._gathers.append((done, pages, slot, key))
        self._to_gather = []
        self.reap()

    def gathering(self, key: bytes) -> bool:
        """Whether this rank's own gather is writing `key` (queued or copying): only `reap` publishes it."""
        return any(k == key for *_, k in self._to_gather) or any(k == key for *_, k in self._gathers)

    def finish_gather(self, key: bytes) -> None:
        """Wait for this rank's own gather of `key` and publish it (a load that needs the chunk now)."""
        if any(k == key for *_, k in self._to_gather):
            self.start_stores()
        for done, *_, k in self._gathers:
            if k == key and done is not None:
                done.synchronize()
        self.reap()

    def reap(self, wait: bool = False) -> None:
        """Publish the gathers whose copy is done (unpinning their pages, handing them to the L2 writer) and
        release the slots whose copy up is done; wait: for every copy first."""
        scattering = []
        for done, slot in self._scatters:
            if _finished(done, wait):
                self.l1.release(slot)
            else:
                scattering.append((done, slot))
        self._scatters = scattering
        left = []
        for done, pages, slot, key in self._gathers:
            if not _finished(done, wait):
                left.append((done, pages, slot, key))
                continue
            if self.pins is not None:
                self.pins.unpin(pages)
            self.l1.publish(slot)  # its crc32 is computed by the L2 writer, off this thread
            self.stats.stored_l1 += 1
            if self.writer is not None:
                self.writer.offer_published(key)
        self._gathers = left

    # ------------------------------------------------------------------ loads: L1 -> pages

    def queue_load(self, slot: int, pages: list[int], skip: int, tier: str) -> None:
        """Copy the chunk in `slot` (referenced; released once copied) into `pages` past their first `skip` (the
        GPU hit shares those), with the step's other loads (`start_loads`)."""
        if not self._to_scatter:
            self.arrivals.defer(self.start_loads)
        self._to_scatter.append((self.l1.slot_view(slot)[:, skip:], pages[skip:], tier))
        self._to_scatter_slots.append(slot)

    def start_loads(self) -> None:
        """Copy up every chunk queued since the last call in one copy, layer group by layer group (the KV cache's
        arrivals: the next forward pass waits per layer). The runner calls this once the pass has queued its
        own uploads; `on_free` and `flush` call it too (no copy into a page may start after the page is freed)."""
        if not self._to_scatter:
            return
        scatters, held = self._to_scatter, self._to_scatter_slots
        self._to_scatter, self._to_scatter_slots = [], []
        done = None
        try:
            done = self.copier.scatter_chunks(scatters)
        finally:
            for slot in held:
                if done is None:
                    self.l1.release(slot)
                else:  # the copy up still reads the slot: an L2 read must not reuse it before it is done
                    self._scatters.append((done, slot))

    def finished_scatters(self) -> list[tuple[str, int, float]]:
        return self.copier.finished_scatters()

    # ------------------------------------------------------------------ shutdown

    def flush(self) -> bool:
        """Every copy, prefetch and queued L2 store done (waiting at most cache.l2.flush_timeout_s for the L2
        writer); False when the writer did not finish in time (its queue is left to it)."""
        start = time.perf_counter()
        self.start_stores()
        self.start_loads()
        prefetched = self.prefetcher is None or self.prefetcher.flush(self.flush_timeout_s)
        self.reap(wait=True)
        left = max(0.0, self.flush_timeout_s - (time.perf_counter() - start))
        return (self.writer is None or self.writer.flush(left)) and prefetched

    def close(self) -> None:
        """flush, then stop the threads and the L2 agents; idempotent."""
        if self._closed:
            return
        self._closed = True
        start = time.perf_counter()
        flushed = self.flush()
        left = max(0.0, self.flush_timeout_s - (time.perf_counter() - start)) if flushed else 0.0
        if self.prefetcher is not None:
            self.prefetcher.close(left)
            self.prefetcher = None
        if self.writer is not None:
            self.writer.close(left)
            self.writer = None
        if self.l2 is not None:
            self.l2.close()
