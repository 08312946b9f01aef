"""Rank 0's loads at admission (`Loader`, the connector's on_alloc): a TieredHit's chunks into the sequence's fresh
pages. L2 chunks are read first, in batches of `load_batch` chunks (one NIXL transfer each), into L1 slots,
verified and published there; every chunk is then queued on this rank's agent from its L1 slot, copied up with the
step's other loads once the forward pass has queued its uploads (agent.py). A chunk being written into L1 right
now (a prefetch, a gather) is waited for only as long as recomputing it would take. With tensor parallelism the
other ranks load the same chunks meanwhile, and the loaded prefix is the leading run every rank loaded."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from xrt.kvcache.interface import KVSeq, PrefixHit
from xrt.kvstore.agent import TierAgent
from xrt.kvstore.l1 import L1Full
from xrt.kvstore.peers import TierPeers
from xrt.kvstore.policy import LoadPolicy
from xrt.kvstore.prefetch import PREFETCH_WAIT_S
from xrt.kvstore.stats import L1, L2


@dataclass(frozen=True, slots=True)
class TieredHit(PrefixHit):
    """A prefix hit that continues past its GPU pages: `chunks[i]` = (chunk index, key, tier) for the chunks
    after the GPU part, in order; num_tokens counts them. skipped: an L2 run the policy would not load (counted
    at admission)."""

    chunks: tuple[tuple[int, bytes, str], ...] = ()
    gpu_tokens: int = 0
    skipped: bool = False


class Loader:
    def __init__(self, agent: TierAgent, policy: LoadPolicy, measured: bool, peers: TierPeers | None) -> None:
        """measured: cache.l2.load_policy=measured (else every L2 chunk is loaded, without deadlines)."""
        self.agent, self.policy, self.measured, self.peers = agent, policy, measured, peers
        self.l1, self.l2, self.stats = agent.l1, agent.l2, agent.stats
        self.layout = agent.layout
        self.chunk_tokens, self.ppc = self.layout.chunk_tokens, self.layout.pages_per_chunk
        self.load_batch = agent.load_batch

    def _decisions(self) -> int:
        """Loads the policy cut short so far (a recompute chosen, not a failure)."""
        return self.stats.skipped_slow + self.stats.abandoned_loads

    def load_everywhere(self, seq: KVSeq, hit: TieredHit) -> list[str]:
        """The tier of each leading chunk of the hit that is now in the pages: this rank's load, cut to what every
        rank loaded."""
        peers = self.peers
        if peers is None:
            return self.load(seq, hit)
        ppc, gpu_pages = self.ppc, len(hit.pages)
        mine: list[str] = []

        def local() -> int:
            mine.extend(self.load(seq, hit))
            return len(mine)

        # the other ranks' L2 read batches get the deadline rank 0's own batches get: a slow disk on any rank
        # shortens the agreed load instead of holding every rank past the recompute time
        n, ct = self.load_batch, self.chunk_tokens
        deadline = self.policy.deadline_s(n * ct, n * self.layout.nbytes) if self.measured else None
        agreed = peers.load([(key, seq.page_table[c * ppc : (c + 1) * ppc], max(0, gpu_pages - c * ppc))
                             for c, key, _ in hit.chunks], local, deadline)
        if agreed < len(mine):
            self.stats.failed_loads += 1  # another rank could not load a chunk this one did
        return mine[:agreed]

    def load(self, seq: KVSeq, hit: TieredHit) -> list[str]:
        """Fill the tier chunks' fresh pages on this rank; the tier of each leading chunk now in the pages."""
        ppc, gpu_pages = self.ppc, len(hit.pages)
        tiers: list[str] = []
        # L2 chunks first, in batches, into L1 slots; L1 chunks are read from their slots.
        l2_chunks = [(c, k) for c, k, tier in hit.chunks if tier == L2]
        slots: dict[int, int] = {}
        cut = False  # the L2 part was cut short by the policy or a full L1: not a failure
        if l2_chunks:
            slots, cut = self._read_l2(l2_chunks)
        prefetcher = self.agent.prefetcher
        for i, (c, key, tier) in enumerate(hit.chunks):
            decided = False  # the policy chose to recompute from here (counted where it chose)
            if tier == L1:
                got = self.l1.acquire(key)
                if got is None:  # a prefetch (or a gather) still writing it: wait, but never past recomputing
                    before = self._decisions()
                    got = self._wait_written(key, len(hit.chunks) - i)
                    decided = self._decisions() > before
                slot = got[0] if got is not None else None
            else:
                slot = slots.pop(c, None)
                decided = cut
            if slot is None:
                if not decided:
                    self.stats.failed_loads += 1
                break
            if tier == L1 and prefetcher is not None and prefetcher.take_loaded(key):
                tier = L2  # a prefetch brought it up from L2 ahead of admission
            skip = max(0, gpu_pages - c * ppc)  # pages of this chunk the GPU hit shares already
            self.agent.queue_load(slot, seq.page_table[c * ppc : (c + 1) * ppc], skip, tier)
            tiers.append(tier)
        for slot in slots.values():  # loaded but after a failed chunk: nothing copied up
            self.l1.release(slot)
        return tiers

    def _wait_written(self, key: bytes, chunks_left: int) -> tuple[int, int | None] | None:
        """The chunk being written into L1 (prefetch, gather), acquired once written; None when that takes longer
        than recomputing the chunks from here on would (counted: skipped_slow when the policy declines to wait,
        abandoned_loads when the wait runs out) or the write failed."""
        if self.agent.gathering(key):
            # this thread's own gather: only the agent's reap publishes it, so wait for its copy here, not for a
            # publish that would never come while this thread waits
            self.agent.finish_gather(key)
        if not self.l1.writing(key):
            return self.l1.acquire(key)
        # another thread's write: a prefetch reading a batch from L2. Wait only if such a read is worth it, and at
        # most what recomputing the batch it delivers would take.
        n = min(chunks_left, self.load_batch)
        tokens, nbytes = n * self.chunk_tokens, n * self.layout.nbytes
        if self.measured and not self.policy.worth_loading(tokens, nbytes):
            self.stats.skipped_slow += 1
            return None
        limit = self.policy.deadline_s(tokens, nbytes) if self.measured else PREFETCH_WAIT_S
        start = time.perf_counter()
        got = self.l1.acquire_when_written(key, limit)
        self.stats.prefetch_wait_s += time.perf_counter() - start
        if got is None and self.l1.writing(key):
            self.stats.abandoned_loads += 1
        return got

    def _read_l2(self, chunks: Sequence[tuple[int, bytes]]) -> tuple[dict[int, int], bool]:
        """{chunk: L1 slot, referenced} for a leading run of the chunks now in L1: read from L2 in batches (one
        transfer each), verified and published in L1, or found there already. Stops at the first chunk without a
        slot, a failed batch, or the policy's verdict that the rest is not worth waiting for; the flag says the
        load was cut short on purpose (policy, deadline, full L1), not failed."""
        assert self.l2 is not None
        out: dict[int, int] = {}
        ct, nbytes, measured = self.chunk_tokens, self.layout.nbytes, self.measured
        i = 0
        while i < len(chunks):
            fresh: list[tuple[int, bytes, int]] = []
            while i < len(chunks) and len(fresh) < self.load_batch:
                c, key = chunks[i]
                got = self.l1.acquire(key)
                if got is not None:
                    out[c] = got[0]
                    i += 1
                    continue
                full = False
                try:
                    slot = self.l1.reserve(key)
                except L1Full:
                    slot, full = None, True
                if slot is None and not full:  # being written by a prefetch (or a gather) right now
                    waited = self._wait_written(key, len(chunks) - i)
                    if waited is not None:
                        out[c] = waited[0]
                        i += 1
                        continue
                if slot is None:  # L1 full of referenced chunks, or the write in flight did not end in time
                    for _, _, s in fresh:
                        self.l1.abort(s)
                    return out, True
                fresh.append((c, key, slot))
                i += 1
            if not fresh:
                continue
            n = len(fresh)
            left = len(chunks) - i + n
            if measured and out and not self.policy.worth_loading(left * ct, left * nbytes):
                for _, _, slot in fresh:
                    self.l1.abort(slot)
                self.stats.abandoned_loads += 1
                return out, True
            deadline = self.policy.deadline_s(n * ct, n * nbytes) if measured else None
            aborts = [slot for _, _, slot in fresh]
            result = self.l2.load([(k, s) for _, k, s in fresh], deadline,
                                  on_late=lambda slots=aborts: [self.l1.abort(s) for s in slots])
            if result.late:
                self.stats.abandoned_loads += 1
                return out, True
            good = sum(crc is not None for crc in result.crcs)
            self.stats.loaded_bytes[L2] += good * nbytes
            self.stats.load_s[L2] += result.seconds
            self.stats.checksum_failures = self.l2.corrupt
            if good == n:
                self.policy.observe_l2(n * nbytes, result.seconds)
            complete = True
            for (c, _, slot), crc in zip(fresh, result.crcs, strict=True):
                if crc is None:
                    # after a miss the rest of the batch is not contiguous with the prefix: not loaded from here
                    # (a verified chunk is still published in L1 for the next load)
                    self.l1.abort(slot)
                    complete = False
                    continue
                self.l1.publish(slot, crc, keep=complete)  # kept referenced: copied up next
                if complete:
                    out[c] = slot
            if not complete:
                return out, False
        return out, False
