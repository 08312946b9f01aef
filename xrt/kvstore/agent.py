"""One rank's KV tiers: its L1, its L2 store and writer, its prefetcher and reader, the copier over its own device KV
tensor, and the copies between them in flight. Every rank has one, rank 0 included: rank 0's connector
(connector.py) decides and calls its agent directly; every other rank's agent applies rank 0's decisions from the
step's plan (`apply`, xrt/kvcache/plan.py) before the step's forward pass, and every rank joins the plan's
collectives after it (`agree`). Methods take rank 0's chunk keys; a worker derives its own (keys.py `rank_key`).

Stores: `add_store` reserves an L1 slot for a chunk of pages and queues its gather; `start_stores` starts the
queued gathers (after the step that computed them has its tokens read back); once a gather's copy is done,
`reap` publishes it in L1 and hands it to the L2 writer. The pages must not change while a gather reads them:
rank 0 pins them in its page manager until `reap` (`pins`); a worker has no page manager, so its compute stream
waits for each gather before the next step (the next step may overwrite the pages).

Reads (reads.py): `begin_read` holds a waiting request's chunks in L1 on the reader thread; `read_progress` says
when it is over; `take_read` queues the held chunks' loads into the admitted request's pages and releases the
rest; `drop_read` forgets it (aborted). Loads: `queue_load` adds a chunk held in an L1 slot to the step's load;
the first one defers `start_loads` to the KV cache's arrivals, so the runner starts the copy once the forward pass
has queued its own uploads, and the pass waits layer group by layer group (xrt/kvcache/device.py KVArrivals). A
slot stays referenced until its copy up is done (no L2 read or store reuses it meanwhile).

CUDA ordering is the copier's (copy.py); on CPU every copy is done when it returns."""

from __future__ import annotations

import time

import torch

from xrt.config import KVTiers, L2LoadPolicy, XrtConfig
from xrt.kvcache.connector import PagePins
from xrt.kvcache.device import DeviceKVCache
from xrt.kvcache.plan import TierPlan
from xrt.kvstore.build import build_copier, build_l1, build_l2, chunk_layout
from xrt.kvstore.keys import KeyNamespace, rank_key
from xrt.kvstore.l1 import L1Full
from xrt.kvstore.policy import LoadPolicy
from xrt.kvstore.prefetch import Prefetcher, leading_run
from xrt.kvstore.reads import Reader, ReadJob
from xrt.kvstore.stats import L1, L2, RANK_COUNTERS, TierStats
from xrt.kvstore.writer import L2Writer
from xrt.ops.collectives import mins_over_ranks, sum_over_ranks
from xrt.ops.parallel_state import TPState
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
    def __init__(self, cfg: XrtConfig, kv_cache: DeviceKVCache, namespace: KeyNamespace, tp: TPState) -> None:
        """namespace: this rank's (tp.rank); tp: the ranks that agree on reads and flushes (the plan's collectives).
        `pins` is set by rank 0's connector: its page manager pins a gather's pages; without it (a worker) the
        compute stream waits for each gather instead."""
        self.layout = chunk_layout(cfg, kv_cache.layout)
        self.namespace = namespace
        self.tp = tp
        digest = namespace.digest()
        self._key = (lambda k: k) if tp.rank == 0 else (lambda k: rank_key(digest, k))
        self.l1 = build_l1(cfg, self.layout)
        self.l2 = build_l2(cfg, namespace, self.l1) if cfg.cache.tiers is KVTiers.L1_L2 else None
        self.arrivals = kv_cache.arrivals
        self.copier = build_copier(cfg, kv_cache, self.arrivals)
        self.pins: PagePins | None = None
        self.stats = TierStats()
        self.load_batch = max(1, cfg.cache.l2.load_batch_mb * MB // self.layout.nbytes)  # chunks per L2 read
        self.flush_timeout_s = cfg.cache.l2.flush_timeout_s
        self.writer = L2Writer(self.l2, self.l1, self.stats) if self.l2 is not None else None
        self.prefetcher = (Prefetcher(self.l1, self.l2, self.stats, self.load_batch)
                           if self.l2 is not None and cfg.cache.l2.prefetch else None)
        # rank 0's load policy (its connector's); rank 0 weighs an L2 read again after each batch with it, a worker
        # reads what rank 0 decided, until the deadline
        self.policy = LoadPolicy() if tp.rank == 0 else None
        measured = cfg.cache.l2.load_policy is L2LoadPolicy.MEASURED
        self.reader = Reader(self.l1, self.l2, self.stats, self.load_batch, self.layout.nbytes,
                             self.layout.chunk_tokens, self.policy, measured)
        self._reads: dict[int, ReadJob] = {}
        self.agreed: dict[int, int] = {}  # read id -> leading chunks every rank holds (the last poll's)
        self.other_ranks: list[float] | None = None  # the workers' RANK_COUNTERS, summed (the last flush's)
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
        key = self._key(key)
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

    # ------------------------------------------------------------------ reads: L2 / L1 -> held L1 slots

    def prefetch(self, keys: list[bytes]) -> None:
        """Start reading, in the background, the leading run of these chunks that L2 holds and L1 lacks (a
        request left waiting; prefetch.py)."""
        if self.prefetcher is None or self.l2 is None:
            return
        mine = [self._key(k) for k in keys]
        self.prefetcher.submit(leading_run(self.l1, mine, self.l2.holds(mine))[1])

    def begin_read(self, read_id: int, keys: list[bytes], deadline_s: float) -> None:
        """Hold these chunks in L1 on the reader thread (reads.py); deadline_s: seconds it may take (0: none)."""
        job = ReadJob([self._key(k) for k in keys], time.perf_counter() + deadline_s if deadline_s else None)
        self._reads[read_id] = job
        self.reader.submit(job)

    def read_progress(self, read_id: int) -> int:
        """Leading chunks the read holds once it is over; -1 while it runs (0 for a read this rank never had)."""
        job = self._reads.get(read_id)
        if job is None:
            return 0
        if not (job.done or job.stopped):
            if job.deadline is None or time.perf_counter() < job.deadline:
                return -1
            # the reader is still in a transfer past the deadline (an L2 batch's own deadline did not end it):
            # the request gets what is held, and computes the rest
            self.reader.stop(job)  # counted abandoned
        return len(job.held)

    def read_tiers(self, read_id: int) -> list[str]:
        """The tier each held chunk came from (a finished read's)."""
        job, tiers = self._reads[read_id], []
        for (_, tier), key in zip(job.held, job.keys, strict=False):
            if tier == L1 and self.prefetcher is not None and self.prefetcher.take_loaded(key):
                tier = L2  # a prefetch brought it up from L2 ahead of the read
            tiers.append(tier)
        return tiers

    def take_read(self, read_id: int, first: int, count: int, skip: int, pages: list[int]) -> None:
        """Copy held chunks first .. first + count - 1 of a finished read into `pages` (count chunks' worth, the
        first `skip` of them left: the GPU hit shares those) with the next forward pass; release the others."""
        job = self._reads.pop(read_id)
        ppc = self.layout.pages_per_chunk
        for i, (slot, tier) in enumerate(job.held):
            if first <= i < first + count:
                at = (i - first) * ppc
                self.queue_load(slot, pages[at : at + ppc], skip if i == first else 0, tier)
            else:
                self.l1.release(slot)
        job.held = []

    def drop_read(self, read_id: int) -> None:
        """Forget a read (its request aborted, or admitted without it): what it holds is released."""
        job = self._reads.pop(read_id, None)
        if job is not None:
            self.reader.cancel(job)

    # ------------------------------------------------------------------ the plan (the other ranks)

    def apply(self, plan: TierPlan) -> None:
        """A worker does what rank 0 decided (before the step's forward pass: loads wait for its uploads); rank 0's
        connector did its own share when it decided."""
        if self.tp.rank == 0:
            return
        self.reap()
        for key, pages in plan.stores:
            if not self.add_store(key, list(pages)):
                break  # every slot is busy: these chunks stay GPU-only on this rank
        self.start_stores()
        self.finished_scatters()  # its timings are rank 0's to measure: drained, so they never pile up
        for keys in plan.prefetches:
            self.prefetch(list(keys))
        for read_id, deadline_s, keys in plan.reads:
            self.begin_read(read_id, list(keys), deadline_s)
        for read_id, first, count, skip, pages in plan.loads:
            self.take_read(read_id, first, count, skip, list(pages))
        for read_id in plan.drops:
            self.drop_read(read_id)
        if plan.flush:
            self.flush()

    def agree(self, plan: TierPlan) -> None:
        """Every rank, after the step's forward pass is queued: the plan's collectives, in the same order on every
        rank (on the host, over the CPU group). polls: each read's leading chunks held, the smallest over the ranks
        (-1: one still reading), for rank 0's scheduler (`agreed`); flush: the workers' counters summed (rank 0
        adds zeros: its own are its stats)."""
        if plan.polls:
            mine = [self.read_progress(r) for r in plan.polls]
            self.agreed.update(zip(plan.polls, mins_over_ranks(mine, self.tp), strict=True))
        if plan.flush:
            if self.l2 is not None:
                self.stats.checksum_failures = self.l2.corrupt
            mine_f = [0.0] * len(RANK_COUNTERS) if self.tp.rank == 0 else self.stats.counters()
            summed = sum_over_ranks(mine_f, self.tp)
            if self.tp.rank == 0:
                self.other_ranks = summed

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
        """Every copy, prefetch, read and queued L2 store done (waiting at most cache.l2.flush_timeout_s in all);
        False when they did not finish in time (what is queued is left to the threads)."""
        start = time.perf_counter()
        self.start_stores()
        self.start_loads()
        prefetched = self.prefetcher is None or self.prefetcher.flush(self.flush_timeout_s)
        read = self.reader.flush(max(0.0, self.flush_timeout_s - (time.perf_counter() - start)))
        self.reap(wait=True)
        left = max(0.0, self.flush_timeout_s - (time.perf_counter() - start))
        return (self.writer is None or self.writer.flush(left)) and prefetched and read

    def close(self) -> None:
        """flush, then stop the threads and the L2 agents; idempotent."""
        if self._closed:
            return
        self._closed = True
        start = time.perf_counter()
        flushed = self.flush()
        left = max(0.0, self.flush_timeout_s - (time.perf_counter() - start)) if flushed else 0.0
        for read_id in list(self._reads):
            self.drop_read(read_id)
        self.reader.close(left)
        if self.prefetcher is not None:
            self.prefetcher.close(left)
            self.prefetcher = None
        if self.writer is not None:
            self.writer.close(left)
            self.writer = None
        if self.l2 is not None:
            self.l2.close()
