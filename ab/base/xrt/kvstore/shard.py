"""A worker rank's KV tiers (parallel.tp > 1): its own L1, its own L2 namespace directory, a copier over its own
runner's KV tensor and an L2 writer, all from the same config as rank 0's. Rank 0 decides everything (lookup,
policy, counting); this rank does what rank 0's messages say (`xrt.distributed.worker.serve`) and reports how
many leading chunks it holds or loaded, which the ranks agree on with one collective (peers.py). A queued
request's prefix is prefetched from this rank's L2 into its L1 by its own prefetch thread (KV_PREFETCH); a load
waits for a prefetch in flight at most rank 0's deadline.

Keys: rank 0 sends its own chunk keys; this rank's key is sha256(its namespace digest, rank 0's key). Rank 0's
key names the whole prefix (keys.py), the digest this rank's shard of it (tp_rank, tp_size), so the files of
two ranks never share a name nor a directory (the directory is named by the namespace too), and a restart
derives the same keys.

CUDA ordering: rank 0 pins a chunk's pages until its gather is done; a worker has no page manager to pin them,
and rank 0 may hand them to another sequence whose next step overwrites them. So the compute stream waits for
each gather before it runs anything else. A load's copy up is deferred to the next forward pass (the step that
reads its pages), which waits for it layer group by layer group, as on rank 0. A slot being
scattered stays referenced until its copy is done, so no later store or L2 read reuses it while the copy still
reads it. On CPU every copy is done when it returns."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from xrt.config import KVTiers, XrtConfig
from xrt.kvcache.device import DeviceKVCache
from xrt.kvstore.build import build_copier, build_l1, build_l2, chunk_layout, key_namespace
from xrt.kvstore.l1 import L1Full
from xrt.kvstore.peers import LoadChunk, StoreChunk
from xrt.kvstore.prefetch import PREFETCH_WAIT_S, Prefetcher, leading_run
from xrt.kvstore.stats import L1, L2, TierStats
from xrt.kvstore.writer import L2Writer
from xrt.units import MB

Event = torch.cuda.Event | None


def rank_key(digest: bytes, key: bytes) -> bytes:
    """This rank's key for the chunk rank 0 keys `key` (digest: this rank's namespace digest)."""
    return hashlib.sha256(digest + key).digest()


def _finished(done: Event, wait: bool) -> bool:
    if done is None:
        return True
    if wait:
        done.synchronize()
        return True
    return done.query()


class KVShard:
    def __init__(self, cfg: XrtConfig, kv_cache: DeviceKVCache, checkpoint_dir: str | None, tp_rank: int,
                 tp_size: int) -> None:
        kv = kv_cache.layout
        self.layout = chunk_layout(cfg, kv)
        namespace = key_namespace(cfg, kv, checkpoint_dir, tp_rank, tp_size)
        self.digest = namespace.digest()
        self.l1 = build_l1(cfg, self.layout)
        self.l2 = build_l2(cfg, namespace, self.l1) if cfg.cache.tiers is KVTiers.L1_L2 else None
        # with the KV cache's arrivals: this rank's next forward pass waits for a load layer group by layer group
        self.arrivals = kv_cache.arrivals
        self.copier = build_copier(cfg, kv_cache, self.arrivals)
        self.stats = TierStats()  # this rank's writer counts here; rank 0's stats are the run's
        self.writer = L2Writer(self.l2, self.l1, self.stats) if self.l2 is not None else None
        self.load_batch = max(1, cfg.cache.l2.load_batch_mb * MB // self.layout.nbytes)
        self.prefetcher = (Prefetcher(self.l1, self.l2, self.stats, self.load_batch)
                           if self.l2 is not None and cfg.cache.l2.prefetch else None)
        self._gathers: list[tuple[Event, int, bytes]] = []  # (done, slot, key): published once done
        self._scatters: list[tuple[Event, int]] = []  # (done, L1 slot the copy reads): released once done
        # a load's chunks not copied yet (start_loads): (slot view, pages, tier), and (slot, crc, fresh) of each
        self._to_scatter: list[tuple[torch.Tensor, list[int], str]] = []
        self._to_scatter_slots: list[int] = []

    def _key(self, key: bytes) -> bytes:
        return rank_key(self.digest, key)

    def _order(self, done: Event) -> None:
        if done is not None:
            torch.cuda.current_stream(self.copier.kv.device).wait_event(done)

    # ------------------------------------------------------------------ store

    def store(self, chunks: Sequence[StoreChunk]) -> None:
        if self.writer is not None:
            self.writer.ensure_running()
        self._reap()
        for key0, pages in chunks:
            key = self._key(key0)
            try:
                slot = self.l1.reserve(key)
            except L1Full:
                break  # every slot is busy: these chunks stay GPU-only on this rank
            if slot is None:
                continue  # held already
            done = self.copier.gather(pages, self.l1.slot_view(slot))
            self._order(done)  # see the module docstring: the next step may overwrite these pages
            self._gathers.append((done, slot, key))
        self._reap()

    def _reap(self, wait: bool = False) -> None:
        """Publish the gathers that are done (and hand them to the L2 writer); release the slots whose scatter
        is done. wait: wait for every copy first."""
        left = []
        for done, slot, key in self._gathers:
            if not _finished(done, wait):
                left.append((done, slot, key))
                continue
            self.l1.publish(slot)
            self.stats.stored_l1 += 1
            if self.writer is not None:
                self.writer.offer_published(key)
        self._gathers = left
        scatters = []
        for done, slot in self._scatters:
            if _finished(done, wait):
                self.l1.release(slot)
            else:
                scatters.append((done, slot))
        self._scatters = scatters
        self.copier.finished_scatters()  # its timings are rank 0's to measure: drained, so they never pile up

    # ------------------------------------------------------------------ lookup and load

    def held(self, keys: Sequence[bytes]) -> int:
        """How many leading chunks this rank holds in L1 or L2."""
        self._reap()
        mine = [self._key(k) for k in keys]
        in_l2 = self.l2.holds(mine) if self.l2 is not None else [False] * len(mine)
        n = 0
        for key, stored in zip(mine, in_l2, strict=True):
            if not (stored or self.l1.contains(key)):
                break
            n += 1
        return n

    def load(self, chunks: Sequence[LoadChunk], deadline_s: float | None = None) -> int:
        """Each chunk from L1, else L2 (read into an L1 slot and verified), scattered into its pages after the
        skipped ones; stops at the first chunk this rank cannot load, or at an L2 read batch still running
        after deadline_s (rank 0's policy: what recomputing costs). Returns how many leading chunks it loaded
        (the pages of the chunks after those are recomputed, or overwritten when rank 0 loaded fewer)."""
        self._reap()
        plan: list[tuple[int, bool]] = []  # (slot, fresh: reserved for an L2 read) of the leading chunks
        for key0, _, _ in chunks:
            key = self._key(key0)
            got = self.l1.acquire(key) or self._written(key, deadline_s)
            if got is not None:
                plan.append((got[0], False))
                continue
            if self.l2 is None:
                break
            try:
                slot = self.l1.reserve(key)
            except L1Full:
                slot = None
            if slot is None:
                break  # no room in L1, or being gathered right now
            plan.append((slot, True))
        reads = [(i, self._key(chunks[i][0]), slot) for i, (slot, fresh) in enumerate(plan) if fresh]
        crcs, late = self._read_l2(reads, deadline_s)
        loaded, complete = 0, True
        for i, (slot, fresh) in enumerate(plan):
            crc = crcs.get(i)
            if fresh and crc is None:
                complete = False
                if slot not in late:  # a late read still writes its slots: aborted once it ends (_read_l2)
                    self.l1.abort(slot)
                continue
            if fresh:
                # verified: visible in L1 now (another load of this step finds it), and kept referenced while
                # it is copied up
                self.l1.publish(slot, crc, keep=complete)
            if complete:
                _, pages, skip = chunks[i]
                if not self._to_scatter:
                    self.arrivals.defer(self.start_loads)
                self._to_scatter.append((self.l1.slot_view(slot)[:, skip:], list(pages)[skip:], L2 if fresh else L1))
                self._to_scatter_slots.append(slot)
                loaded += 1
            elif not fresh:
                self.l1.release(slot)  # acquired, not copied: a chunk after one this rank could not load
        self._reap()
        if loaded < len(chunks):
            self.stats.failed_loads += 1  # rank 0 agreed this rank held them (a lookup): gone or bad since
        return loaded

    def start_loads(self) -> None:
        """Copy up the chunks loaded since the last call in one copy, layer group by layer group: deferred to this
        rank's next forward pass, which takes it once its own uploads are queued and waits per layer (as rank 0's
        manager does, tiered.py `start_loads`); flush calls it too. The slots are released once the copy is
        done."""
        if not self._to_scatter:
            return
        scatters, held = self._to_scatter, self._to_scatter_slots
        self._to_scatter, self._to_scatter_slots = [], []
        done = self.copier.scatter_chunks(scatters)
        self._scatters.extend((done, slot) for slot in held)

    def _written(self, key: bytes, deadline_s: float | None) -> tuple[int, int | None] | None:
        """The chunk a write in flight is bringing into L1 (this rank's prefetch or gather), acquired once it is
        there; None when nothing is writing it, or it does not arrive within rank 0's deadline."""
        if not self.l1.writing(key):
            return None
        own = [done for done, _, k in self._gathers if k == key]
        if own:  # this rank's own gather: published by _reap once its copy is done
            for done in own:
                if done is not None:
                    done.synchronize()
            self._reap()
            return self.l1.acquire(key)
        return self.l1.acquire_when_written(key, deadline_s if deadline_s is not None else PREFETCH_WAIT_S)

    def prefetch(self, keys0: Sequence[bytes]) -> None:
        """A request rank 0 queued (KV_PREFETCH): read the leading run of its chunks this rank's L2 holds into L1
        in the background, skipping those in L1 already (prefetch.py)."""
        if self.prefetcher is None or self.l2 is None:
            return
        mine = [self._key(k) for k in keys0]
        self.prefetcher.submit(leading_run(self.l1, mine, self.l2.holds(mine))[1])

    def _read_l2(self, items: list[tuple[int, bytes, int]],
                 deadline_s: float | None = None) -> tuple[dict[int, int], set[int]]:
        """({chunk: crc32} of the leading run of (chunk, key, reserved slot) read from L2 and verified, the slots
        of a batch that passed deadline_s), in batches of load_batch chunks. Rank 0 weighed the load already;
        the deadline bounds this rank's reads. A late batch's slots are aborted when its transfer ends."""
        assert self.l2 is not None or not items
        out: dict[int, int] = {}
        for b in range(0, len(items), self.load_batch):
            batch = items[b : b + self.load_batch]
            slots = [slot for _, _, slot in batch]
            result = self.l2.load([(key, slot) for _, key, slot in batch], deadline_s,  # type: ignore[union-attr]
                                  on_late=lambda slots=slots: [self.l1.abort(s) for s in slots])
            if result.late:
                return out, set(slots)
            for (i, _, _), crc in zip(batch, result.crcs, strict=True):
                if crc is not None:
                    out[i] = crc
            if any(crc is None for crc in result.crcs):
                break
        return out, set()

    # ------------------------------------------------------------------ shutdown

    def counters(self) -> list[float]:
        """This rank's RANK_COUNTERS (stats.py), for rank 0's `TierStats.other_ranks`."""
        if self.l2 is not None:
            self.stats.checksum_failures = self.l2.corrupt
        return self.stats.counters()

    def flush(self) -> None:
        """Every prefetch and copy done and every chunk handed to the L2 writer written."""
        self.start_loads()
        if self.prefetcher is not None:
            self.prefetcher.flush()
        self._reap(wait=True)
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        self.flush()
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.l2 is not None:
            self.l2.close()
