"""The KV tiers behind the page manager: `TieredConnector`, xrt/kvcache/connector.py's `TierConnector` for
cache.tiers=l1 / l1_l2. It decides (what a prompt's prefix continues into, what is worth loading, what to store);
the bytes move through this rank's `TierAgent` (agent.py), and with tensor parallelism every other rank's agent
does the same from the step's plan (xrt/kvcache/plan.py), which rides in the step through the step channel.

Store: `on_commit` sees pages become full and computed; every chunk (cache.chunk_tokens tokens, whole pages) that
became complete gets an L1 slot, and once the step's tokens are read back (`step_read_back`) is gathered from the
device pages into it and published; with L2, the published chunk goes on a bounded queue to the L2 writer thread.
A full queue drops the L2 copy (counted) rather than wait: a decode step never blocks on storage.

Load: `match` continues the GPU prefix hit with the chunk chain in L1, then L2, as far as the chunks are
contiguous (and at least one token is left to compute), and returns a `TieredHit` whose num_tokens reaches past
its GPU pages; no side effects. Admission (`begin_read`): a hit whose chunks are all in L1 loads at once (tp=1);
otherwise the request waits in the scheduler's reading state while each rank's reader thread holds its chunks in
L1 (reads.py), and `poll_reads` hands it back once every rank's read is over. `on_alloc` then copies the held
chunks into the fresh pages with the next forward pass (agent.py); a chunk no rank could hold ends the loaded
prefix there, and the scheduler prefills from that point. `cached_tokens` of each admitted sequence says how many
prompt tokens each tier supplied.

Never slower than recomputing (policy.py, cache.l2.load_policy=measured): an L2 run whose estimated load time
exceeds recomputing its tokens is not read (`skipped_slow`); a read may take at most what recomputing its
tokens costs (its deadline), and is weighed again after each batch of cache.l2.load_batch_mb.

Tensor parallel (`sender`; None at tp=1): every rank holds its own shard of each chunk. Rank 0 decides from what
its own tiers hold (a match asks no other rank), and the plan of the next step mirrors each store, prefetch, read
and load to the other ranks. A read is over when the step's poll (one collective) says every rank finished it,
with the leading run every rank holds; an idle engine sends a step with the plan alone to hear it. So the ranks
never disagree on what is computed; a chunk another rank lacks costs its recompute (counted as a failed load)."""

from __future__ import annotations

import atexit
import weakref

import torch

from xrt.config import CacheArgs, L2LoadPolicy
from xrt.kvcache.connector import PagePins
from xrt.kvcache.interface import CommittedPages, KVSeq, PrefixHit
from xrt.kvcache.plan import TierPlan
from xrt.kvstore.agent import TierAgent
from xrt.kvstore.hit import TieredHit
from xrt.kvstore.keys import ChunkKeyCache
from xrt.kvstore.l1 import L1Full
from xrt.kvstore.peers import PlanSender
from xrt.kvstore.policy import PrefillClock
from xrt.kvstore.reading import PlanParts, Read, Readings
from xrt.kvstore.stats import GPU, L1, L2, RANK_COUNTERS, TierStats

__all__ = ["GPU", "L1", "L2", "TierStats", "TieredConnector", "TieredHit"]

# L1 keys of the start-up bandwidth probe's scratch slots (29 bytes: never a 32-byte sha256 chunk key)
PROBE_KEY = b"xrt-l2-bandwidth-probe-slot-"
class TieredConnector:
    def __init__(self, agent: TierAgent, cache: CacheArgs, sender: PlanSender | None = None) -> None:
        self.agent = agent
        self.layout, self.namespace, self.l1, self.l2 = agent.layout, agent.namespace, agent.l1, agent.l2
        self.keys = ChunkKeyCache(agent.namespace)
        self.sender = sender
        self.chunk_tokens = self.layout.chunk_tokens
        self.ppc = self.layout.pages_per_chunk
        self.stats = agent.stats
        self.measured = cache.l2.load_policy is L2LoadPolicy.MEASURED
        assert agent.policy is not None, "rank 0's agent"
        self.policy = agent.policy
        self.prefill_clock = PrefillClock(agent.copier.kv.device)
        self.pages: PagePins | None = None
        self._plan = PlanParts()  # the other ranks' share of what was decided since the last step
        self.readings = Readings(agent, self.stats, self._plan, sender)
        self._closed = False
        self.device_name = "cpu"
        if self.l2 is not None:
            kv = agent.copier.kv
            self.device_name = torch.cuda.get_device_name(kv.device) if kv.device.type == "cuda" else "cpu"
            self.policy.restore(self.l2.read_measurements(), self.device_name)
            self._probe_l2()
            # A process that never closes its engine still lets the writer finish what is queued (bounded), so the
            # run's chunks are in L2 for the next one. A weak reference: the hook keeps no connector alive. Only this
            # rank's writer: the other ranks flush their own when they shut down.
            ref = weakref.ref(self)
            atexit.register(lambda: (c := ref()) is not None and not c._closed and c.flush_local())

    def bind(self, pages: PagePins) -> None:
        self.pages = self.agent.pins = pages

    # ------------------------------------------------------------------ store: GPU -> L1 -> L2

    def on_commit(self, event: CommittedPages) -> None:
        self.agent.reap()
        ct = self.chunk_tokens
        first, last = -(-(event.start + 1) // ct) - 1, event.end // ct  # chunks whose end lies in (start, end]
        first = max(first, 0)
        if last <= first:
            return
        keys = self.keys.keys(event.seq.token_ids, last)
        table = event.seq.page_table
        if self.sender is not None:
            # every chunk, not only those this rank lacks: another rank may lack one this rank holds
            self._plan.stores.extend((keys[c], tuple(table[c * self.ppc : (c + 1) * self.ppc]))
                                     for c in range(first, last))
        for c in range(first, last):
            if not self.agent.add_store(keys[c], table[c * self.ppc : (c + 1) * self.ppc]):
                return  # every slot is busy: these chunks stay GPU-only

    def start_stores(self) -> None:
        """Start the copies of the chunks committed since the last call. Not at the commit itself: that comes
        between a prefill's forward pass and its sampler, and the copies would share the GPU with the sampler and
        delay the first token; after the read-back they share it with the next step, which the host is still
        preparing. The other ranks start theirs with the next step (its plan)."""
        self.agent.start_stores()

    def step_read_back(self) -> None:
        self.start_stores()
        self._fold_times()

    def on_free(self, seq: KVSeq) -> None:
        self.agent.start_loads()  # its pages go back to the pool: no copy into them may start after that
        self.keys.forget(seq.token_ids)  # finished or preempted: a re-admission keys it again

    # ------------------------------------------------------------------ timing the recompute

    def step_started(self, is_prefill: bool) -> None:
        """A prefill step's cost is what recomputing a prefix would cost (device events: no sync)."""
        if is_prefill:
            self.prefill_clock.start()

    def step_launched(self, is_prefill: bool, num_tokens: int) -> None:
        if is_prefill:
            self.prefill_clock.stop(num_tokens)

    def _fold_times(self) -> None:
        """Measurements whose device events completed: prefill steps (the recompute rate) and L1 loads."""
        for n, seconds in self.prefill_clock.poll():
            self.policy.observe_prefill(n, seconds)
        for tier, nbytes, seconds in self.agent.finished_scatters():
            if tier == L1:  # an L2 chunk's upload is not the L2 tier's bandwidth (read + verify is)
                self.stats.loaded_bytes[L1] += nbytes
                self.stats.load_s[L1] += seconds

    def _probe_l2(self) -> None:
        """Time one read of a couple of stored chunks at start-up: the L2 bandwidth the policy weighs the first
        loads with, read as the loads read. Costs one transfer; nothing to do with an empty directory."""
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

    # ------------------------------------------------------------------ match and load: L1 / L2 -> GPU

    def prefetch(self, token_ids: list[int]) -> None:
        """A request left waiting: start reading its L2-only prefix chunks into L1 (prefetch.py), so its admission
        finds them there. Only chunks contiguous with what the GPU and L1 hold are worth it."""
        if self.agent.prefetcher is None:
            return
        assert self.l2 is not None and self.pages is not None
        ct = self.chunk_tokens
        loadable = (len(token_ids) - 1) // ct
        if loadable == 0 or not self._tier_holds(self.keys.keys(token_ids, 1)[0]):
            # A prompt no tier holds the first chunk of (a new one: the common case) has nothing to prefetch, and
            # keying the rest of it here would delay its own prefill.
            return
        keys = self.keys.keys(token_ids, loadable)
        if not any(self.l2.holds(keys)):
            return  # nothing to prefetch, and no need to match the GPU prefix cache
        c0 = self.pages.gpu_match(token_ids).num_tokens // ct  # the chunks after the GPU hit
        self.agent.prefetch(keys[c0:loadable])
        if self.sender is not None:
            self._plan.prefetches.append(tuple(keys[c0:loadable]))  # each rank reads what its own L1 lacks

    def match(self, token_ids: list[int], gpu: PrefixHit) -> PrefixHit:
        ct = self.chunk_tokens
        loadable = (len(token_ids) - 1) // ct  # whole chunks, leaving the last token to compute
        c0 = gpu.num_tokens // ct
        if loadable <= c0:
            return gpu
        first = self.keys.keys(token_ids, c0 + 1)[c0]
        if not (self.l1.contains(first) or self.l1.writing(first)):
            if self.l2 is None or not self.l2.holds([first])[0]:
                return gpu  # the tier chain starts at chunk c0 or not at all: no need to key the rest
            if self.measured and not self.policy.worth_loading(ct, self.layout.nbytes):
                # An L2 run from here would be cut whole (the policy weighs bytes against tokens, the same ratio for
                # any length): keying the rest of the prompt would only delay the prefill that recomputes it.
                return TieredHit(gpu.pages, gpu.hashes, gpu.num_tokens, (), gpu.num_tokens, skipped=True)
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
        chunks, skipped = self._not_slower_than_recompute(chunks)
        end = (chunks[-1][0] + 1) * ct if chunks else gpu.num_tokens
        if not chunks and not skipped:
            return gpu
        return TieredHit(gpu.pages, gpu.hashes, end, tuple(chunks), gpu.num_tokens, skipped)

    def _tier_holds(self, key: bytes) -> bool:
        """L1 holds the chunk or is writing it, or L2 holds it."""
        return self.l1.contains(key) or self.l1.writing(key) or (self.l2 is not None and self.l2.holds([key])[0])

    def _not_slower_than_recompute(
            self, chunks: list[tuple[int, bytes, str]]) -> tuple[list[tuple[int, bytes, str]], bool]:
        """Cut the chunks at the first L2 one when loading the L2 part is estimated slower than prefilling it
        (L2 chunks end the contiguous run only at its end: they are weighed together); whether it cut."""
        first_l2 = next((i for i, c in enumerate(chunks) if c[2] == L2), None)
        if first_l2 is None or not self.measured:
            return chunks, False
        n = len(chunks) - first_l2
        if not self.policy.worth_loading(n * self.chunk_tokens, n * self.layout.nbytes):
            return chunks[:first_l2], True
        return chunks, False

    # ------------------------------------------------------------------ reading: L2 / L1 -> held in L1

    def begin_read(self, seq: KVSeq, hit: PrefixHit) -> bool:
        """Whether seq must wait in the reading state before its admission: its hit has chunks L1 does not hold
        yet (or, with tensor parallelism, any tier chunks: every rank must hold them before any loads). Starts the
        read; a request whose read is over (or that has none) is admitted now."""
        state = self.readings.state(seq)
        if state is not None:
            return state
        if not isinstance(hit, TieredHit) or not hit.chunks:
            return False
        waits = sum(not self.l1.contains(key) for _, key, _ in hit.chunks)
        if self.sender is None and waits == 0:
            return False  # every chunk is in L1: acquired and copied up at admission (on_alloc)
        ct, nbytes = self.chunk_tokens, self.layout.nbytes
        deadline = self.policy.deadline_s(waits * ct, waits * nbytes) if self.measured and waits else 0.0
        self.readings.begin(seq, [key for _, key, _ in hit.chunks], hit.chunks[0][0], deadline)
        return True

    def poll_reads(self, idle: bool) -> list[KVSeq]:
        return self.readings.poll(idle)

    def drop_read(self, seq: KVSeq) -> None:
        self.readings.drop(seq)

    def take_plan(self, flush: bool = False) -> TierPlan | None:
        """The other ranks' share of what was decided since the last plan, with a poll of the reads in flight;
        None at tp=1 or when there is nothing to say."""
        if self.sender is None:
            return None
        return self._plan.take(self.readings.in_flight(), flush) or None

    # ------------------------------------------------------------------ admission: held chunks -> pages

    def on_alloc(self, seq: KVSeq, hit: PrefixHit) -> None:
        self.agent.reap()
        self._fold_times()
        self.stats.lookups += 1
        gpu = hit.gpu_tokens if isinstance(hit, TieredHit) else hit.num_tokens
        loaded = {GPU: gpu, L1: 0, L2: 0}
        if isinstance(hit, TieredHit):
            self.stats.skipped_slow += hit.skipped
        read = self.readings.take(seq)
        if read is not None:
            chunks = self._load_read(seq, *read, len(hit.pages), gpu)
        elif isinstance(hit, TieredHit) and hit.chunks:
            chunks = self._load_l1(seq, hit)
        else:
            chunks = []
        end = gpu
        for c, tier in chunks:
            loaded[tier] += (c + 1) * self.chunk_tokens - max(end, c * self.chunk_tokens)
            end = (c + 1) * self.chunk_tokens
        seq.num_cached_tokens = seq.num_computed_tokens = end
        seq.cached_tokens = loaded
        for tier, n in loaded.items():
            self.stats.hit_tokens[tier] += n
        self.stats.computed_tokens += len(seq.token_ids) - end

    def _load_read(self, seq: KVSeq, read_id: int, read: Read, gpu_pages: int,
                   gpu_tokens: int) -> list[tuple[int, str]]:
        """Load the chunks of seq's finished read that continue its GPU hit (which may have changed since the read
        began); (chunk index, tier) of each."""
        held = read.held
        assert held is not None, "admitted before its read was over"
        tiers = self.agent.read_tiers(read_id)
        if len(tiers) > held:
            self.stats.failed_loads += 1  # another rank could not hold a chunk this one holds
        ct, ppc = self.chunk_tokens, self.ppc
        # the read's chunks from the first one the GPU hit does not cover; none when the GPU hit ends before the
        # read's first chunk (its pages were evicted meanwhile: the rest would not be contiguous)
        skip_chunks = max(0, gpu_tokens // ct - read.first)
        count = max(0, held - skip_chunks) if read.first * ct <= gpu_tokens else 0
        first = read.first + skip_chunks
        skip = max(0, gpu_pages - first * ppc)
        pages = seq.page_table[first * ppc : (first + count) * ppc]
        self.agent.take_read(read_id, skip_chunks, count, skip, pages)
        if self.sender is not None:
            self._plan.loads.append((read_id, skip_chunks, count, skip, tuple(pages)))
        return [(first + i, tiers[skip_chunks + i]) for i in range(count)]

    def _load_l1(self, seq: KVSeq, hit: TieredHit) -> list[tuple[int, str]]:
        """tp=1, every chunk in L1 (begin_read): acquire each and copy it up with the next forward pass."""
        out = []
        prefetcher = self.agent.prefetcher
        for c, key, _ in hit.chunks:
            got = self.l1.acquire(key)
            if got is None:
                self.stats.failed_loads += 1
                break
            tier = L2 if prefetcher is not None and prefetcher.take_loaded(key) else L1
            skip = max(0, len(hit.pages) - c * self.ppc)  # pages of this chunk the GPU hit shares already
            self.agent.queue_load(got[0], seq.page_table[c * self.ppc : (c + 1) * self.ppc], skip, tier)
            out.append((c, tier))
        return out

    # ------------------------------------------------------------------ counters and shutdown

    def flush(self) -> None:
        """Wait until every chunk handed to the L2 writer is written (tests, shutdown), every rank's: the other
        ranks' through a step with the plan alone (flush: then their counters, summed)."""
        self.flush_local()
        if self.sender is not None and not self.sender.closed:
            self.sender.send_plan(self.take_plan(flush=True) or TierPlan(flush=True))
            if self.agent.other_ranks is not None:
                self.stats.other_ranks = dict(zip(RANK_COUNTERS, self.agent.other_ranks, strict=True))

    def flush_local(self) -> None:
        """flush, this rank's agent only (its copies, prefetches and L2 writer)."""
        self.start_stores()
        self.agent.flush()
        self._fold_times()

    def report(self, flush: bool = True) -> TierStats:
        """The counters, every rank's L2 writer through its queue first unless flush=False (then the other
        ranks' counters are as of the last flush)."""
        if flush:
            self.flush()
        writer = self.agent.writer
        self.stats.store_queue_now = writer.depth if writer is not None else 0
        if self.l2 is not None:
            self.stats.checksum_failures = self.l2.corrupt
        return self.stats

    def close(self) -> None:
        """Flush every rank, keep the policy's measurements for the next process on this L2 directory
        (policy.restore), stop this rank's threads; idempotent."""
        if self._closed:
            return
        try:
            self.flush()
            if self.l2 is not None:
                self.l2.write_measurements(self.policy.saved(self.l2.read_measurements(), self.device_name))
        finally:
            self._closed = True
            self.agent.close()

