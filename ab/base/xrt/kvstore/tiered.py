"""A KV cache manager with L1 (and L2) below the GPU pages: the attach points of kvcache/manager.py's docstring.

Store: a commit listener sees pages become full and computed; every chunk (cache.chunk_tokens tokens, whole
pages) that became complete gets an L1 slot, and once the step's tokens are read back (`start_stores`) is
gathered from the device pages into it (on CUDA on a side stream, the pages pinned until its event completes;
on CPU at once) and published there; with L2, the published chunk
goes on a bounded queue to a background thread that writes batches of them through NIXL. A full queue drops
the L2 copy (counted) rather than wait: a decode step never blocks on storage.

Load: `lookup` takes the GPU prefix hit, then continues the chunk chain in L1, then L2, as far as the chunks
are contiguous (and at least one token is left to compute); it returns a `TieredHit` whose num_tokens
reaches past its GPU pages. `allocate` takes fresh pages for the rest as usual, then fills the tier chunks'
pages: L2 chunks are read into L1 slots in NIXL transfers, verified and published in L1; then, once the step's
forward pass has queued its own uploads (`start_loads`, deferred to the KV cache's arrivals), every chunk of the
step's admissions is copied up from its slot in one batch, layer group by layer group (copy.py), the forward
pass waiting for each layer's pages just before that layer reads them. A chunk that fails (gone, bad
checksum) ends the loaded prefix there: num_computed_tokens is cut back, so the scheduler prefills from that
point. The scheduler is unchanged: it admits by hit.num_tokens and prefills from num_computed_tokens.

Never slower than recomputing (policy.py, `cache.l2.load_policy=measured`): an L2 run whose estimated load
time (bytes over the measured L2 bandwidth) exceeds recomputing its tokens (over the prefill rate the engine
measures) is not started (`skipped_slow`); a long one is read in batches of `cache.l2.load_batch_mb`, each
with a deadline of its tokens' recompute time, and after each batch the rest is weighed again with the
bandwidth measured so far: a load that turns out slow, or a batch past its deadline, ends the loaded prefix
there (`abandoned_loads`) and the scheduler prefills the rest.

Each admitted sequence's `cached_tokens` says how many prompt tokens each tier supplied (RequestOutput
hands it back); `stats` counts it all (stats.py).

Tensor parallel (`peers`, peers.py; None at tp=1, where nothing below costs anything): every rank holds its
own shard of each chunk. This manager, on rank 0, still decides everything, and mirrors each store, lookup
and load to the other ranks (shard.py) in order with the steps. A lookup's tier chunks are cut to the leading
run every rank holds, a load's to the leading run every rank loaded (one collective each), so the ranks
never disagree on what is computed; only agreed chunks count as hits."""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from xrt.config import CacheArgs, L2LoadPolicy
from xrt.kvcache.interface import CommittedPages, KVSeq, PrefixHit
from xrt.kvcache.manager import KVCacheManager
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.keys import ChunkKeyCache, KeyNamespace
from xrt.kvstore.l1 import L1Cache, L1Full
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.peers import TierPeers
from xrt.kvstore.policy import LoadPolicy, PrefillClock
from xrt.kvstore.prefetch import PREFETCH_WAIT_S, Prefetcher, leading_run
from xrt.kvstore.stats import GPU, L1, L2, RANK_COUNTERS, TierStats
from xrt.kvstore.writer import L2Writer
from xrt.log import get_logger
from xrt.units import MB

__all__ = ["GPU", "L1", "L2", "TierStats", "TieredHit", "TieredKVCacheManager"]

log = get_logger(__name__)
# L1 keys of the start-up bandwidth probe's scratch slots (29 bytes: never a 32-byte sha256 chunk key)
PROBE_KEY = b"xrt-l2-bandwidth-probe-slot-"


@dataclass(frozen=True, slots=True)
class TieredHit(PrefixHit):
    """A prefix hit that continues past its GPU pages: `chunks[i]` = (chunk index, key, tier) for the chunks
    after the GPU part, in order; num_tokens counts them."""

    chunks: tuple[tuple[int, bytes, str], ...] = ()
    gpu_tokens: int = 0


class TieredKVCacheManager(KVCacheManager):
    def __init__(self, num_pages: int, page_size: int, copier: ChunkCopier, layout: ChunkLayout,
                 namespace: KeyNamespace, l1: L1Cache, l2: L2Store | None, cache: CacheArgs,
                 peers: TierPeers | None = None) -> None:
        super().__init__(num_pages, page_size, prefix_caching=True)
        self.layout, self.namespace, self.l1, self.l2 = layout, namespace, l1, l2
        self.keys = ChunkKeyCache(namespace)
        self.peers = peers
        self.chunk_tokens = layout.chunk_tokens
        self.ppc = layout.pages_per_chunk
        self.copier = copier
        kv = copier.kv
        self.stats = TierStats()
        self.policy = LoadPolicy()
        self.measured = cache.l2.load_policy is L2LoadPolicy.MEASURED
        self.load_batch = max(1, cache.l2.load_batch_mb * MB // layout.nbytes)  # chunks per L2 read
        self.prefill_clock = PrefillClock(kv.device)
        self._to_gather: list[tuple[list[int], int, bytes]] = []  # (pages, slot, key) committed, not yet copied
        self._peer_stores: list[tuple[bytes, list[int]]] = []  # the other ranks' part of them (key, pages)
        self._gathers: list[tuple[torch.cuda.Event | None, list[int], int, bytes]] = []  # (done, pages, slot, key)
        self._scatters: list[tuple[torch.cuda.Event, int]] = []  # (done, L1 slot the copy still reads)
        # loads admitted but not copied yet (start_loads): (slot view, pages, tier) per chunk, and their slots
        self._to_scatter: list[tuple[torch.Tensor, list[int], str]] = []
        self._to_scatter_slots: list[int] = []
        self.writer: L2Writer | None = None
        self.prefetcher: Prefetcher | None = None
        if l2 is not None:
            self.writer = L2Writer(l2, l1, self.stats)
            if cache.l2.prefetch:  # with TP every rank prefetches its own shard (peers.prefetch)
                self.prefetcher = Prefetcher(l1, l2, self.stats, self.load_batch)
            self.device_name = torch.cuda.get_device_name(kv.device) if kv.device.type == "cuda" else "cpu"
            self.policy.restore(l2.read_measurements(), self.device_name)
            self._probe_l2()
            # the writer is a daemon (it must never keep a process alive); at exit, let it finish what is queued
            # so a run's chunks are in L2 for the next one. A weak reference: the hook keeps no manager alive.
            ref = weakref.ref(self)
            # Only this rank's writer: the other ranks flush their own when they shut down.
            atexit.register(lambda: (m := ref()) is not None and m.flush_local())
        self.add_commit_listener(self._on_commit)

    # ------------------------------------------------------------------ store: GPU -> L1 -> L2

    def _on_commit(self, event: CommittedPages) -> None:
        if self.writer is not None:
            self.writer.ensure_running()
        self._reap()
        ct = self.chunk_tokens
        first, last = -(-(event.start + 1) // ct) - 1, event.end // ct  # chunks whose end lies in (start, end]
        first = max(first, 0)
        if last <= first:
            return
        keys = self.keys.keys(event.seq.token_ids, last)
        if self.peers is not None:
            # every chunk, not only those this rank lacks: another rank may lack one this rank holds
            self._peer_stores.extend((keys[c], event.seq.page_table[c * self.ppc : (c + 1) * self.ppc])
                                     for c in range(first, last))
        for c in range(first, last):
            key = keys[c]
            try:
                slot = self.l1.reserve(key)
            except L1Full:
                return  # every slot is busy: these chunks stay GPU-only
            if slot is None:
                continue  # in L1 already (loaded from a tier, or another sequence stored it)
            pages = event.seq.page_table[c * self.ppc : (c + 1) * self.ppc]
            self.pin(pages)
            self._to_gather.append((pages, slot, key))

    def start_stores(self) -> None:
        """Start the copies of the chunks committed since the last call (the engine calls this once the step
        that committed them has its tokens read back). Not at the commit itself: that comes between a prefill's
        forward pass and its sampler, and the copies (940 MB for an 8k-token Qwen3-0.6B prompt, ~19 ms over
        PCIe) would share the GPU with the sampler and delay the first token; after the read-back they share
        it with the next step, whose launch the host is still preparing."""
        if self._peer_stores:
            stores, self._peer_stores = self._peer_stores, []
            assert self.peers is not None
            self.peers.store(stores)
        for pages, slot, key in self._to_gather:
            self._gathers.append((self.copier.gather(pages, self.l1.slot_view(slot)), pages, slot, key))
        self._to_gather = []
        self._reap()

    def free(self, seq: KVSeq) -> None:
        self.start_loads()  # its pages go back to the pool: no copy into them may start after that
        super().free(seq)
        self.keys.forget(seq.token_ids)  # finished or preempted: a re-admission keys it again

    def _reap(self) -> None:
        """Publish the gathers whose copy is done, unpin their pages and hand them to the L2 writer; release
        the L1 slots of scatters that are done reading them."""
        scattering = []
        for done, slot in self._scatters:
            if done.query():
                self.l1.release(slot)
            else:
                scattering.append((done, slot))
        self._scatters = scattering
        left = []
        for done, pages, slot, key in self._gathers:
            if done is not None and not done.query():
                left.append((done, pages, slot, key))
                continue
            self.unpin(pages)
            self.l1.publish(slot)  # its crc32 is computed by the L2 writer, off this thread
            self.stats.stored_l1 += 1
            if self.writer is not None:
                self.writer.offer_published(key)
        self._gathers = left

    def flush(self) -> None:
        """Wait until every chunk handed to the L2 writer is written (tests, shutdown), every rank's."""
        self.flush_local()
        if self.peers is not None:
            counts = self.peers.flush()
            if counts is not None:
                self.stats.other_ranks = dict(zip(RANK_COUNTERS, counts, strict=True))

    def flush_local(self) -> None:
        """flush, this rank's writer only (and its prefetches and copies up, so every L1 slot is free)."""
        self.start_stores()
        self.start_loads()
        if self.prefetcher is not None:
            self.prefetcher.flush()
        for done, _ in self._scatters:
            done.synchronize()
        self._reap()
        self._fold_times()
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        self.flush()
        if self.l2 is not None:  # for the next process on this directory (policy.restore)
            self.l2.write_measurements(self.policy.saved(self.l2.read_measurements(), self.device_name))
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.l2 is not None:
            self.l2.close()

    # ------------------------------------------------------------------ load: L1 / L2 -> GPU

    def prefill_started(self) -> None:
        """The engine starts a prefill step: its cost is what recomputing a prefix would cost."""
        self.prefill_clock.start()

    def prefill_done(self, num_tokens: int) -> None:
        self.prefill_clock.stop(num_tokens)

    def _fold_times(self) -> None:
        """Measurements whose device events completed: prefill steps (the recompute rate) and L1 loads."""
        for n, seconds in self.prefill_clock.poll():
            self.policy.observe_prefill(n, seconds)
        for tier, nbytes, seconds in self.copier.finished_scatters():
            if tier == L1:  # an L2 chunk's upload is not the L2 tier's bandwidth (read + verify is)
                self.stats.loaded_bytes[L1] += nbytes
                self.stats.load_s[L1] += seconds

    def prefetch(self, token_ids: list[int]) -> None:
        """A request was queued: start reading its L2-only prefix chunks into L1 (prefetch.py), so its
        admission finds them there. Only chunks contiguous with what the GPU and L1 hold are worth it."""
        if self.prefetcher is None:
            return
        assert self.l2 is not None
        ct = self.chunk_tokens
        loadable = (len(token_ids) - 1) // ct
        if loadable == 0 or not self._tier_holds(self.keys.keys(token_ids, 1)[0]):
            # A prompt no tier holds the first chunk of (a new one: the common case) has nothing to prefetch,
            # and keying the rest of it here (~0.6 ms for 8k tokens) would delay its own prefill. Missed by
            # this: L2 chunks that continue a GPU hit whose first chunk left L1 and never reached L2 (a
            # dropped store); the admission's lookup still loads them.
            return
        keys = self.keys.keys(token_ids, loadable)
        in_l2 = self.l2.holds(keys)
        if not any(in_l2):
            return  # nothing to prefetch, and no need to match the GPU prefix cache
        c0 = super().lookup(token_ids).num_tokens // ct  # the chunks after the GPU hit
        run, todo = leading_run(self.l1, keys[c0:loadable], in_l2[c0:loadable])
        if self.peers is not None and run:
            self.peers.prefetch(run)  # each rank reads what its own L1 lacks of them
        self.prefetcher.submit(todo)

    def _probe_l2(self) -> None:
        """Time one read of a couple of stored chunks at start-up: the L2 bandwidth the policy weighs the
        first loads with, read as the loads read (O_DIRECT from the disk with cache.l2.direct_io, else through the
        page cache). Costs one transfer (~30 ms for two Qwen3-8B chunks from a 2 GB/s disk); nothing to do with an
        empty directory."""
        assert self.l2 is not None
        keys = self.l2.sample_keys(2)
        slots = []
        for i in range(len(keys)):
            try:
                slot = self.l1.reserve(PROBE_KEY + bytes([i]))
            except L1Full:
                break
            if slot is not None:
                slots.append(slot)
        if not slots:
            return
        try:
            result = self.l2.load(list(zip(keys, slots, strict=False)))
            if all(crc is not None for crc in result.crcs):
                self.policy.observe_l2(len(slots) * self.layout.nbytes, result.seconds)
        finally:
            for slot in slots:
                self.l1.abort(slot)

    def _wait_written(self, key: bytes, chunks_left: int) -> tuple[int, int | None] | None:
        """The chunk being written into L1 (prefetch, gather), acquired once written; None when that takes
        longer than recomputing the chunks from here on would (counted: skipped_slow when the policy declines to
        wait, abandoned_loads when the wait runs out) or the write failed."""
        if any(k == key for *_, k in self._to_gather):
            self.start_stores()
        if any(k == key for *_, k in self._gathers):
            # this thread's own gather (CUDA): only _reap publishes it, so wait for its copy here, not for a
            # publish that would never come while this thread waits
            for done, *_, k in self._gathers:
                if k == key and done is not None:
                    done.synchronize()
            self._reap()
        if not self.l1.writing(key):
            return self.l1.acquire(key)
        # another thread's write: a prefetch reading a batch from L2. Wait only if such a read is worth it,
        # and at most what recomputing the batch it delivers would take.
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

    def _decisions(self) -> int:
        """Loads the policy cut short so far (a recompute chosen, not a failure)."""
        return self.stats.skipped_slow + self.stats.abandoned_loads

    def lookup(self, token_ids: list[int]) -> PrefixHit:
        self.start_stores()  # a caller other than the engine may not have; the last step is read back by now
        self._reap()
        self._fold_times()
        self.stats.lookups += 1
        hit = super().lookup(token_ids)
        ct = self.chunk_tokens
        loadable = (len(token_ids) - 1) // ct  # whole chunks, leaving the last token to compute
        c0 = hit.num_tokens // ct
        if loadable <= c0:
            return hit
        first = self.keys.keys(token_ids, c0 + 1)[c0]
        if not (self.l1.contains(first) or self.l1.writing(first)):
            if self.l2 is None or not self.l2.holds([first])[0]:
                return hit  # the tier chain starts at chunk c0 or not at all: no need to key the rest
            if self.measured and not self.policy.worth_loading(ct, self.layout.nbytes):
                # An L2 run from here would be cut whole (the policy weighs bytes against tokens, the same ratio
                # for any length): keying the rest of the prompt (~0.6 ms for 8k tokens) would only delay the
                # prefill that recomputes it.
                self.stats.skipped_slow += 1
                return hit
        keys = self.keys.keys(token_ids, loadable)
        in_l2 = self.l2.holds(keys[c0:]) if self.l2 is not None else [False] * (loadable - c0)
        chunks: list[tuple[int, bytes, str]] = []
        for c in range(c0, loadable):
            if self.l1.contains(keys[c]) or self.l1.writing(keys[c]):  # writing: a prefetch or gather in flight
                chunks.append((c, keys[c], L1))
            elif in_l2[c - c0]:
                chunks.append((c, keys[c], L2))
            else:
                break
        chunks = self._not_slower_than_recompute(chunks)
        if chunks and self.peers is not None:
            chunks = chunks[: self.peers.lookup([key for _, key, _ in chunks])]
        if not chunks:
            return hit
        end = (chunks[-1][0] + 1) * ct
        return TieredHit(hit.pages, hit.hashes, end, tuple(chunks), hit.num_tokens)

    def _tier_holds(self, key: bytes) -> bool:
        """L1 holds the chunk or is writing it, or L2 holds it."""
        return self.l1.contains(key) or self.l1.writing(key) or (self.l2 is not None and self.l2.holds([key])[0])

    def _not_slower_than_recompute(self, chunks: list[tuple[int, bytes, str]]) -> list[tuple[int, bytes, str]]:
        """Cut the chunks at the first L2 one when loading the L2 part is estimated slower than prefilling it
        (L2 chunks end the contiguous run only at its end: they are weighed together)."""
        first_l2 = next((i for i, c in enumerate(chunks) if c[2] == L2), None)
        if first_l2 is None or not self.measured:
            return chunks
        n = len(chunks) - first_l2
        if not self.policy.worth_loading(n * self.chunk_tokens, n * self.layout.nbytes):
            self.stats.skipped_slow += 1
            return chunks[:first_l2]
        return chunks

    def allocate(self, seq: KVSeq, hit: PrefixHit) -> None:
        super().allocate(seq, hit)
        gpu = hit.gpu_tokens if isinstance(hit, TieredHit) else hit.num_tokens
        loaded = {GPU: gpu, L1: 0, L2: 0}
        end = hit.num_tokens
        if isinstance(hit, TieredHit):
            tiers = self._load_everywhere(seq, hit)
            end = gpu
            for (c, _, _), tier in zip(hit.chunks, tiers, strict=False):
                loaded[tier] += (c + 1) * self.chunk_tokens - max(end, c * self.chunk_tokens)
                end = (c + 1) * self.chunk_tokens
        seq.num_cached_tokens = seq.num_computed_tokens = end
        seq.cached_tokens = loaded
        for tier, n in loaded.items():
            self.stats.hit_tokens[tier] += n
        self.stats.computed_tokens += len(seq.token_ids) - end

    def _load_everywhere(self, seq: KVSeq, hit: TieredHit) -> list[str]:
        """The tier of each leading chunk of the hit that is now in the pages: this rank's load, cut to what
        every rank loaded."""
        if self.peers is None:
            return self._load(seq, hit)
        ppc, gpu_pages = self.ppc, len(hit.pages)
        mine: list[str] = []

        def local() -> int:
            mine.extend(self._load(seq, hit))
            return len(mine)

        # the other ranks' L2 read batches get the deadline rank 0's own batches get: a slow disk on any rank
        # shortens the agreed load instead of holding every rank past the recompute time
        n, ct = self.load_batch, self.chunk_tokens
        deadline = self.policy.deadline_s(n * ct, n * self.layout.nbytes) if self.measured else None
        agreed = self.peers.load([(key, seq.page_table[c * ppc : (c + 1) * ppc], max(0, gpu_pages - c * ppc))
                                  for c, key, _ in hit.chunks], local, deadline)
        if agreed < len(mine):
            self.stats.failed_loads += 1  # another rank could not load a chunk this one did
        return mine[:agreed]

    def _load(self, seq: KVSeq, hit: TieredHit) -> list[str]:
        """Fill the tier chunks' fresh pages; returns the tier of each leading chunk now in the pages."""
        gpu_pages = len(hit.pages)
        tiers: list[str] = []
        # L2 chunks first, in batches, into L1 slots; L1 chunks are read from their slots.
        l2_chunks = [(c, k) for c, k, tier in hit.chunks if tier == L2]
        slots: dict[int, int] = {}
        cut = False  # the L2 part was cut short by the policy or a full L1: not a failure
        if l2_chunks:
            slots, cut = self._read_l2(l2_chunks)
        scatters: list[tuple[torch.Tensor, list[int], str]] = []  # (slot view, pages, tier) of each chunk
        held: list[int] = []  # their slots, referenced until the copies are done
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
            if tier == L1 and self.prefetcher is not None and self.prefetcher.take_loaded(key):
                tier = L2  # a prefetch brought it up from L2 ahead of admission
            pages = seq.page_table[c * self.ppc : (c + 1) * self.ppc]
            skip = max(0, gpu_pages - c * self.ppc)  # pages of this chunk the GPU hit shares already
            scatters.append((self.l1.slot_view(slot)[:, skip:], pages[skip:], tier))
            held.append(slot)
            tiers.append(tier)
        # copied up with every other load of this step's admissions (start_loads), the slots referenced till then
        first = not self._to_scatter
        self._to_scatter.extend(scatters)
        self._to_scatter_slots.extend(held)
        arrivals = self.copier.arrivals
        if arrivals is None:
            self.start_loads()  # no forward pass to defer to: the caller orders its stream after the copy
        elif first and scatters:
            arrivals.defer(self.start_loads)  # by the runner, once the pass's uploads are queued
        for slot in slots.values():  # loaded but after a failed chunk: nothing scattered
            self.l1.release(slot)
        return tiers

    def start_loads(self) -> None:
        """Copy up every chunk the admissions since the last call loaded, in one copy layer group by layer group.
        Deferred to the KV cache's arrivals: the runner calls this once the forward pass that reads the chunks
        has queued its own uploads (KVArrivals.defer), and every sequence of the step is in one copy, so each
        layer group's event covers every sequence's rows of it and the pass waits per layer; `free` and
        `flush_local` call it too (no copy into a page may start after the page is freed)."""
        if not self._to_scatter:
            return
        scatters, held = self._to_scatter, self._to_scatter_slots
        self._to_scatter, self._to_scatter_slots = [], []
        done = None
        try:
            # the next forward pass waits per layer (the KV cache's arrivals), or here for all of it where the
            # copier has no arrivals
            done = self.copier.scatter_chunks(scatters)
            if done is not None and self.copier.arrivals is None:
                torch.cuda.current_stream(self.copier.kv.device).wait_event(done)
        finally:
            for slot in held:
                if done is None:
                    self.l1.release(slot)
                else:  # the copy up still reads the slot: an L2 read must not reuse it before it is done
                    self._scatters.append((done, slot))

    def _read_l2(self, chunks: Sequence[tuple[int, bytes]]) -> tuple[dict[int, int], bool]:
        """{chunk: L1 slot, referenced} for a leading run of the chunks now in L1: read from L2 in batches of
        `load_batch` chunks (one transfer each), verified and published in L1, or found there already. Stops
        at the first chunk without a slot, a failed batch, or the policy's verdict that the rest is not worth
        waiting for; the flag says the load was cut short on purpose (policy, deadline, full L1), not failed."""
        assert self.l2 is not None
        out: dict[int, int] = {}
        ct, nbytes = self.chunk_tokens, self.layout.nbytes
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
            if self.measured and out and not self.policy.worth_loading(
                    (len(chunks) - i + n) * ct, (len(chunks) - i + n) * nbytes):
                for _, _, slot in fresh:
                    self.l1.abort(slot)
                self.stats.abandoned_loads += 1
                return out, True
            deadline = self.policy.deadline_s(n * ct, n * nbytes) if self.measured else None
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
                if crc is None or not complete:
                    # after a miss the rest of the batch is not contiguous with the prefix: not published
                    # from this load (a verified chunk is still published in L1 for the next one)
                    if crc is None:
                        self.l1.abort(slot)
                        complete = False
                        continue
                self.l1.publish(slot, crc, keep=complete)  # kept referenced: copied up next
                if complete:
                    out[c] = slot
            if not complete:
                return out, False
        return out, False
