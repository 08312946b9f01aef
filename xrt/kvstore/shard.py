"""A worker rank's KV tiers (parallel.tp > 1): its own `TierAgent` (agent.py: L1, L2 namespace directory, copier
over its own runner's KV tensor, L2 writer, prefetcher), from the same config as rank 0's. Rank 0's connector
decides everything (match, policy, counting); this rank does what rank 0's messages say
(`xrt.distributed.worker.serve`) and reports how many leading chunks it loaded, which the ranks agree on with one
collective (peers.py). A load waits for a prefetch in flight at most rank 0's deadline.

Keys: rank 0 sends its own chunk keys; this rank's key is sha256(its namespace digest, rank 0's key). Rank 0's
key names the whole prefix (keys.py), the digest this rank's shard of it (tp_rank, tp_size), so the files of
two ranks never share a name nor a directory (the directory is named by the namespace too), and a restart
derives the same keys. A worker has no page manager to pin pages with: its compute stream waits for each gather
(agent.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from xrt.config import XrtConfig
from xrt.kvcache.device import DeviceKVCache
from xrt.kvstore.agent import TierAgent
from xrt.kvstore.build import key_namespace
from xrt.kvstore.l1 import L1Full
from xrt.kvstore.peers import LoadChunk, StoreChunk
from xrt.kvstore.prefetch import PREFETCH_WAIT_S, leading_run
from xrt.kvstore.stats import L1, L2


def rank_key(digest: bytes, key: bytes) -> bytes:
    """This rank's key for the chunk rank 0 keys `key` (digest: this rank's namespace digest)."""
    return hashlib.sha256(digest + key).digest()


class KVShard:
    def __init__(self, cfg: XrtConfig, kv_cache: DeviceKVCache, checkpoint_dir: str | None, tp_rank: int,
                 tp_size: int) -> None:
        namespace = key_namespace(cfg, kv_cache.layout, checkpoint_dir, tp_rank, tp_size)
        self.digest = namespace.digest()
        self.agent = TierAgent(cfg, kv_cache, namespace)
        self.l1, self.l2, self.stats = self.agent.l1, self.agent.l2, self.agent.stats  # rank 0's stats are the run's
        self.load_batch = self.agent.load_batch

    def _key(self, key: bytes) -> bytes:
        return rank_key(self.digest, key)

    def store(self, chunks: Sequence[StoreChunk]) -> None:
        self.agent.reap()
        for key0, pages in chunks:
            if not self.agent.add_store(self._key(key0), list(pages)):
                break  # every slot is busy: these chunks stay GPU-only on this rank
        self.agent.start_stores()
        self.agent.finished_scatters()  # its timings are rank 0's to measure: drained, so they never pile up

    def load(self, chunks: Sequence[LoadChunk], deadline_s: float | None = None) -> int:
        """Each chunk from L1, else L2 (read into an L1 slot and verified), copied into its pages after the skipped
        ones with this rank's next forward pass; stops at the first chunk this rank cannot load, or at an L2 read
        batch still running after deadline_s (rank 0's policy: what recomputing costs). Returns how many leading
        chunks it loaded (the pages of the chunks after those are recomputed, or overwritten when rank 0 loaded
        fewer)."""
        self.agent.reap()
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
                # verified: visible in L1 now (another load of this step finds it), and kept referenced while it
                # is copied up
                self.l1.publish(slot, crc, keep=complete)
            if complete:
                _, pages, skip = chunks[i]
                self.agent.queue_load(slot, list(pages), skip, L2 if fresh else L1)
                loaded += 1
            elif not fresh:
                self.l1.release(slot)  # acquired, not copied: a chunk after one this rank could not load
        self.agent.reap()
        if loaded < len(chunks):
            self.stats.failed_loads += 1  # rank 0 holds them: this rank lost them (evicted, bad, never stored)
        return loaded

    def _written(self, key: bytes, deadline_s: float | None) -> tuple[int, int | None] | None:
        """The chunk a write in flight is bringing into L1 (this rank's prefetch or gather), acquired once it is
        there; None when nothing is writing it, or it does not arrive within rank 0's deadline."""
        if not self.l1.writing(key):
            return None
        if self.agent.gathering(key):  # this rank's own gather: published by the agent's reap once copied
            self.agent.finish_gather(key)
            return self.l1.acquire(key)
        return self.l1.acquire_when_written(key, deadline_s if deadline_s is not None else PREFETCH_WAIT_S)

    def prefetch(self, keys0: Sequence[bytes]) -> None:
        """A request rank 0 left waiting (KV_PREFETCH): read the leading run of its chunks this rank's L2 holds into
        L1 in the background, skipping those in L1 already (prefetch.py)."""
        prefetcher = self.agent.prefetcher
        if prefetcher is None or self.l2 is None:
            return
        mine = [self._key(k) for k in keys0]
        prefetcher.submit(leading_run(self.l1, mine, self.l2.holds(mine))[1])

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
        """Every prefetch and copy done and every chunk handed to the L2 writer written (bounded)."""
        self.agent.flush()

    def close(self) -> None:
        self.agent.close()
