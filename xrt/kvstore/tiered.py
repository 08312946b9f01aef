"""A KV cache manager with L1 (and L2) below the GPU pages: the attach points of kvcache/manager.py's docstring.

Store: a commit listener sees pages become full and computed; every chunk (cache.chunk_tokens tokens, whole
pages) that became complete is gathered from the device pages into an L1 slot (on CUDA on a side stream, the
pages pinned until its event completes; on CPU at once) and published there; with L2, the published chunk
goes on a bounded queue to a background thread that writes batches of them through NIXL. A full queue drops
the L2 copy (counted) rather than wait: a decode step never blocks on storage.

Load: `lookup` takes the GPU prefix hit, then continues the chunk chain in L1, then L2, as far as the chunks
are contiguous (and at least one token is left to compute); it returns a `TieredHit` whose num_tokens
reaches past its GPU pages. `allocate` takes fresh pages for the rest as usual, then fills the tier chunks'
pages: L1 chunks are scattered from their slots; L2 chunks are read into L1 slots in one NIXL transfer,
verified, published in L1 and scattered. A chunk that fails (gone, bad checksum) ends the loaded prefix
there: num_computed_tokens is cut back, so the scheduler prefills from that point. An L2 load whose
estimated time (bytes over the measured L2 read bandwidth) exceeds recomputing its tokens (over the measured
prefill rate, fed by the engine) is skipped. The scheduler is unchanged: it admits by hit.num_tokens and
prefills from num_computed_tokens."""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from xrt.kvcache.interface import CommittedPages, KVSeq, PrefixHit
from xrt.kvcache.manager import KVCacheManager
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.keys import KeyNamespace, chunk_keys
from xrt.kvstore.l1 import L1Cache, L1Full
from xrt.kvstore.l2 import L2Store
from xrt.log import get_logger

log = get_logger(__name__)
GPU, L1, L2 = "gpu", "l1", "l2"
# chunks waiting for the L2 writer; past this, new chunks are stored in L1 only
L2_QUEUE_CHUNKS = 64
# chunks per NIXL write transfer
L2_BATCH = 8


@dataclass(frozen=True, slots=True)
class TieredHit(PrefixHit):
    """A prefix hit that continues past its GPU pages: `chunks[i]` = (chunk index, key, tier) for the chunks
    after the GPU part, in order; num_tokens counts them."""

    chunks: tuple[tuple[int, bytes, str], ...] = ()
    gpu_tokens: int = 0


@dataclass
class TierStats:
    """Prefix tokens found per tier at admission (what was actually loaded: a failed chunk is not counted)."""

    hit_tokens: dict[str, int] = field(default_factory=lambda: {GPU: 0, L1: 0, L2: 0})
    stored_l1: int = 0
    stored_l2: int = 0
    dropped_l2: int = 0  # chunks the L2 queue had no room for
    failed_loads: int = 0
    skipped_slow: int = 0  # L2 loads skipped: recomputing was estimated faster


class TieredKVCacheManager(KVCacheManager):
    def __init__(self, num_pages: int, page_size: int, kv: torch.Tensor, layout: ChunkLayout,
                 namespace: KeyNamespace, l1: L1Cache, l2: L2Store | None) -> None:
        super().__init__(num_pages, page_size, prefix_caching=True)
        self.layout, self.namespace, self.l1, self.l2 = layout, namespace, l1, l2
        self.chunk_tokens = layout.chunk_tokens
        self.ppc = layout.pages_per_chunk
        self.copier = ChunkCopier(kv)
        self.stats = TierStats()
        self._gathers: list[tuple[torch.cuda.Event | None, list[int], int, bytes]] = []  # (done, pages, slot, key)
        self._l2_bw: float | None = None  # bytes/s of L2 loads, moving average
        self._prefill_rate: float | None = None  # tokens/s of prefill steps, moving average
        self._queue: queue.Queue[tuple[bytes, int, int | None] | None] = queue.Queue(L2_QUEUE_CHUNKS)
        self._writer: threading.Thread | None = None
        if l2 is not None:
            self._writer = threading.Thread(target=self._write_l2, name="xrt-kv-l2", daemon=True)
            self._writer.start()
            # the writer is a daemon (it must never keep a process alive); at exit, let it finish what is queued
            # so a run's chunks are in L2 for the next one. A weak reference: the hook keeps no manager alive.
            ref = weakref.ref(self)
            atexit.register(lambda: (m := ref()) is not None and m.flush())
        self.add_commit_listener(self._on_commit)

    # ------------------------------------------------------------------ store: GPU -> L1 -> L2

    def _on_commit(self, event: CommittedPages) -> None:
        self._reap()
        ct = self.chunk_tokens
        first, last = -(-(event.start + 1) // ct) - 1, event.end // ct  # chunks whose end lies in (start, end]
        first = max(first, 0)
        if last <= first:
            return
        keys = chunk_keys(event.seq.token_ids[: last * ct], self.namespace)
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
            self._gathers.append((self.copier.gather(pages, self.l1.slot_view(slot)), pages, slot, key))
        self._reap()

    def _reap(self) -> None:
        """Publish the gathers whose copy is done, unpin their pages and hand them to the L2 writer."""
        left = []
        for done, pages, slot, key in self._gathers:
            if done is not None and not done.query():
                left.append((done, pages, slot, key))
                continue
            self.unpin(pages)
            self.l1.publish(slot)  # its crc32 is computed by the L2 writer, off this thread
            self.stats.stored_l1 += 1
            if self._writer is not None:
                got = self.l1.acquire(key)  # referenced until written: L1 eviction must not reuse it
                if got is not None:
                    try:
                        self._queue.put_nowait((key, got[0], got[1]))
                    except queue.Full:
                        self.l1.release(got[0])
                        self.stats.dropped_l2 += 1
        self._gathers = left

    def _write_l2(self) -> None:
        assert self.l2 is not None
        while True:
            item = self._queue.get()
            batch = [item]
            while len(batch) < L2_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            items = [b for b in batch if b is not None]
            try:
                if items:
                    self.stats.stored_l2 += len(self.l2.store(items))
            except Exception as e:  # a bug or NIXL failure must not kill the writer: chunks stay L1-only
                log.warning("L2 writer: %s", e)
            finally:
                for _, slot, _ in items:
                    self.l1.release(slot)
                for _ in batch:
                    self._queue.task_done()
            if stop:
                return

    def flush(self) -> None:
        """Wait until every chunk handed to the L2 writer is written (tests, shutdown)."""
        self._reap()
        if self._writer is not None:
            self._queue.join()

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        if self.l2 is not None:
            self.l2.close()

    # ------------------------------------------------------------------ load: L1 / L2 -> GPU

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        """The engine's measured prefill rate: what recomputing a prefix would cost."""
        if num_tokens > 0 and seconds > 0:
            rate = num_tokens / seconds
            self._prefill_rate = rate if self._prefill_rate is None else 0.8 * self._prefill_rate + 0.2 * rate

    def lookup(self, token_ids: list[int]) -> PrefixHit:
        self._reap()
        hit = super().lookup(token_ids)
        ct = self.chunk_tokens
        loadable = (len(token_ids) - 1) // ct  # whole chunks, leaving the last token to compute
        c0 = hit.num_tokens // ct
        if loadable <= c0:
            return hit
        keys = chunk_keys(token_ids[: loadable * ct], self.namespace)
        chunks: list[tuple[int, bytes, str]] = []
        for c in range(c0, loadable):
            if self.l1.contains(keys[c]):
                chunks.append((c, keys[c], L1))
            elif self.l2 is not None and self.l2.contains(keys[c]):
                chunks.append((c, keys[c], L2))
            else:
                break
        chunks = self._not_slower_than_recompute(chunks)
        if not chunks:
            return hit
        end = (chunks[-1][0] + 1) * ct
        return TieredHit(hit.pages, hit.hashes, end, tuple(chunks), hit.num_tokens)

    def _not_slower_than_recompute(self, chunks: list[tuple[int, bytes, str]]) -> list[tuple[int, bytes, str]]:
        """Cut the chunks at the first L2 one when loading the L2 part is estimated slower than prefilling it."""
        first_l2 = next((i for i, c in enumerate(chunks) if c[2] == L2), None)
        if first_l2 is None or self._l2_bw is None or self._prefill_rate is None:
            return chunks
        n = len(chunks) - first_l2  # L2 loads end the contiguous run only at its end; estimate them together
        load_s = n * self.layout.nbytes / self._l2_bw
        recompute_s = n * self.chunk_tokens / self._prefill_rate
        if load_s > recompute_s:
            self.stats.skipped_slow += 1
            return chunks[:first_l2]
        return chunks

    def allocate(self, seq: KVSeq, hit: PrefixHit) -> None:
        super().allocate(seq, hit)
        if not isinstance(hit, TieredHit):
            self.stats.hit_tokens[GPU] += hit.num_tokens
            return
        self.stats.hit_tokens[GPU] += hit.gpu_tokens
        loaded_end = self._load(seq, hit)
        seq.num_cached_tokens = seq.num_computed_tokens = loaded_end

    def _load(self, seq: KVSeq, hit: TieredHit) -> int:
        """Fill the tier chunks' fresh pages; returns the end (tokens) of the prefix now in the pages."""
        ct, gpu_pages = self.chunk_tokens, len(hit.pages)
        end = hit.gpu_tokens
        # L2 chunks first, in one transfer, into L1 slots; L1 chunks are read from their slots.
        l2_chunks = [(c, k) for c, k, tier in hit.chunks if tier == L2]
        slots: dict[int, int] = {}
        if l2_chunks:
            slots = self._read_l2(l2_chunks)
        for c, key, tier in hit.chunks:
            if tier == L1:
                got = self.l1.acquire(key)
                slot = got[0] if got is not None else None
            else:
                slot = slots.get(c)
            if slot is None:
                self.stats.failed_loads += 1
                break
            try:
                pages = seq.page_table[c * self.ppc : (c + 1) * self.ppc]
                skip = max(0, gpu_pages - c * self.ppc)  # pages of this chunk the GPU hit shares already
                done = self.copier.scatter(self.l1.slot_view(slot)[:, skip:], pages[skip:])
                if done is not None:
                    # the next forward pass (on the compute stream) reads these pages
                    torch.cuda.current_stream(self.copier.kv.device).wait_event(done)
            finally:
                self.l1.release(slot)
            self.stats.hit_tokens[tier] += (c + 1) * ct - max(end, c * ct)
            end = (c + 1) * ct
        for c, slot in slots.items():  # loaded but after a failed chunk: nothing scattered
            if c * ct >= end:
                self.l1.release(slot)
        return end

    def _read_l2(self, chunks: Sequence[tuple[int, bytes]]) -> dict[int, int]:
        """{chunk: L1 slot, referenced} for the chunks now in L1: read from L2 in one transfer and verified
        (then published in L1 too), or found in L1 already. Stops at the first chunk without a slot."""
        assert self.l2 is not None
        out: dict[int, int] = {}
        fresh: list[tuple[int, bytes, int]] = []
        for c, key in chunks:
            got = self.l1.acquire(key)
            if got is not None:
                out[c] = got[0]
                continue
            try:
                slot = self.l1.reserve(key)
            except L1Full:
                break
            if slot is None:  # being gathered into L1 right now
                break
            fresh.append((c, key, slot))
        if not fresh:
            return out
        start = time.perf_counter()
        crcs = self.l2.load([(k, s) for _, k, s in fresh])
        seconds = time.perf_counter() - start
        if all(crc is not None for crc in crcs) and seconds > 0:
            bw = len(fresh) * self.layout.nbytes / seconds
            self._l2_bw = bw if self._l2_bw is None else 0.8 * self._l2_bw + 0.2 * bw
        for (c, key, slot), crc in zip(fresh, crcs, strict=True):
            if crc is None:
                self.l1.abort(slot)
                continue
            self.l1.publish(slot, crc)
            got = self.l1.acquire(key)  # only this thread reserves L1 slots, so nothing evicted it since
            if got is not None:
                out[c] = got[0]
        return out
