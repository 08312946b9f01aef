"""The paged KV cache as the scheduler sees it (nano-vllm style prefix caching, in one place).

The scheduler admits a sequence with `lookup` (the longest cached prefix), `can_allocate` and
`allocate`; grows it page by page with `can_append` / `append`; records computed KV with `commit`;
and gives its pages back with `free`. Pages live in a `PagePool` (ref counts, pins, prefix index,
free list in eviction order); every admitted sequence also has a row in `page_tables`, the
[rows, pages] int32 array a decode launch gathers its page tables from.

KV tiers below the GPU pages attach as one `TierConnector` (connector.py), composed here: `lookup` continues
the GPU hit with `connector.match`, `begin_read` / `poll_reads` / `drop_read` keep a request in the reading state
while the tiers read its prefix, `allocate` tells `on_alloc` (which fills the fresh pages past the GPU part),
`commit` tells `on_commit`, `free` tells `on_free` first. The scheduler is the same with or without tiers: it
admits by hit.num_tokens, counts only hit.pages as shared and prefills from num_computed_tokens. The engine
tells the connector where a step stands (`step_started`, `step_launched`, `step_read_back`) through here too.
"""

from __future__ import annotations

import numpy as np

from xrt.kvcache.connector import NoTierConnector, TierConnector, TierCounters
from xrt.kvcache.interface import NO_HIT, CommitListener, CommittedPages, KVSeq, PrefixHit
from xrt.kvcache.page_tables import PageTables
from xrt.kvcache.plan import TierPlan
from xrt.kvcache.pool import PagePool


class KVCacheManager:
    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool,
                 connector: TierConnector | None = None) -> None:
        self.pool = PagePool(num_pages, page_size)
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_caching = prefix_caching
        self.tables = PageTables()
        self._listeners: list[CommitListener] = []
        self.connector: TierConnector = connector if connector is not None else NoTierConnector()
        self.connector.bind(self)
        if not isinstance(self.connector, NoTierConnector):
            self._listeners.append(self.connector.on_commit)

    @property
    def num_free_pages(self) -> int:
        """Pages that can be handed out now (cached ones among them keep their keys until then)."""
        return len(self.pool.free)

    @property
    def page_tables(self) -> np.ndarray:
        """[rows, pages] int32: row `seq.table_row` holds seq's page table. Re-read it after an
        allocate or append: growing it replaces the array."""
        return self.tables.table

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def add_commit_listener(self, listener: CommitListener) -> None:
        """listener(CommittedPages) runs inside `commit`, once for each call that made pages full and
        computed (only with prefix caching on)."""
        self._listeners.append(listener)

    def lookup(self, token_ids: list[int]) -> PrefixHit:
        """The longest cached prefix of token_ids (the GPU prefix cache's, continued by the tiers), leaving at
        least the last token to recompute so the sequence gets logits. No side effects."""
        return self.connector.match(token_ids, self.gpu_match(token_ids))

    def gpu_match(self, token_ids: list[int]) -> PrefixHit:
        """The GPU prefix cache's part of `lookup`."""
        if not self.prefix_caching:
            return NO_HIT
        pages, hashes = self.pool.match(token_ids, (len(token_ids) - 1) // self.page_size)
        if not pages:
            return NO_HIT
        return PrefixHit(tuple(pages), tuple(hashes), len(pages) * self.page_size)

    def can_allocate(self, seq: KVSeq, hit: PrefixHit) -> bool:
        """Whether `allocate(seq, hit)` finds its pages (hit pages on the free list count as taken)."""
        fresh = self.pages_for(len(seq.token_ids)) - len(hit.pages)
        return self.num_free_pages - self.pool.num_free_among(hit.pages) >= fresh

    def allocate(self, seq: KVSeq, hit: PrefixHit) -> None:
        """Pages for all of seq.token_ids, sharing hit's pages (`lookup(seq.token_ids)`, just taken);
        sets num_cached_tokens / num_computed_tokens to the hit."""
        assert not seq.page_table, "the sequence already holds pages"
        pool = self.pool
        for pid, key in zip(hit.pages, hit.hashes, strict=True):
            pool.share(pid, key)
        seq.page_table = list(hit.pages)
        seq.page_hashes = list(hit.hashes)
        # Ascending: which free page holds which position does not matter to attention, and runs of consecutive
        # pages make a KV tier's copy of a chunk one strided copy instead of one per page (the free list hands
        # a freed sequence's pages back tail first, descending).
        seq.page_table.extend(sorted(pool.take_many(self.pages_for(len(seq.token_ids)) - len(hit.pages))))
        self.tables.assign(seq)
        seq.num_cached_tokens = hit.num_tokens
        seq.cached_tokens = {"gpu": hit.num_tokens}
        seq.num_computed_tokens = hit.num_tokens
        self.connector.on_alloc(seq, hit)

    def needs_page(self, seq: KVSeq) -> bool:
        """Whether seq's next decode step opens a page (its tokens, those in flight included, fill its pages)."""
        return len(seq.token_ids) + seq.num_pending_tokens > len(seq.page_table) * self.page_size

    def can_append(self, seq: KVSeq) -> bool:
        return not self.needs_page(seq) or self.num_free_pages > 0

    def append(self, seq: KVSeq) -> None:
        """Ensures the pages cover every token of seq, those in flight included (the newest one is
        written next step)."""
        while self.pages_for(len(seq.token_ids) + seq.num_pending_tokens) > len(seq.page_table):
            seq.page_table.append(self.pool.take())
            self.tables.appended(seq)

    def commit(self, seq: KVSeq, num_computed: int | None = None) -> None:
        """Keys the pages that became full and computed, so later prompts can reuse them, and tells
        the commit listeners. num_computed: tokens whose KV is known computed (default
        seq.num_computed_tokens, which also counts decode steps still in flight)."""
        if not self.prefix_caching:
            return
        computed = seq.num_computed_tokens if num_computed is None else num_computed
        first, last = len(seq.page_hashes), computed // self.page_size
        if last <= first:
            return
        hashes = seq.page_hashes
        self.pool.register(seq.page_table, hashes, seq.token_ids, last)
        if self._listeners:
            ps = self.page_size
            event = CommittedPages(seq, seq.page_table[first:last], hashes[first:last], first * ps, last * ps)
            for listener in self._listeners:
                listener(event)

    def free(self, seq: KVSeq) -> None:
        self.connector.on_free(seq)  # no tier copy into these pages may start once they are back in the pool
        # Tail pages first, so the end of a prefix is evicted before its start.
        self.pool.release(reversed(seq.page_table))
        self.pool.forget(seq.token_ids)
        self.tables.release(seq)
        seq.page_table = []
        seq.page_hashes = []
        seq.num_computed_tokens = 0

    def pin(self, page_ids: list[int]) -> None:
        """Hold pages while a transfer reads or fills them: not handed out or evicted, even once freed."""
        self.pool.pin(page_ids)

    def unpin(self, page_ids: list[int]) -> None:
        self.pool.unpin(page_ids)

    def evict(self, max_pages: int | None = None) -> list[int]:
        """Forget the prefix-cache keys of up to max_pages keyed free pages (None: all), next to be
        reused first; returns those pages. Pages in use or pinned keep theirs."""
        return self.pool.evict(max_pages)

    # -- where the engine's step stands, for the connector (free without tiers)

    def step_started(self, is_prefill: bool) -> None:
        self.connector.step_started(is_prefill)

    def step_launched(self, is_prefill: bool, num_tokens: int) -> None:
        self.connector.step_launched(is_prefill, num_tokens)

    def step_read_back(self) -> None:
        self.connector.step_read_back()

    def prefetch(self, token_ids: list[int]) -> None:
        self.connector.prefetch(token_ids)

    # -- the reading state (free without tiers)

    def begin_read(self, seq: KVSeq, hit: PrefixHit) -> bool:
        return self.connector.begin_read(seq, hit)

    def poll_reads(self, idle: bool) -> list[KVSeq]:
        return self.connector.poll_reads(idle)

    def drop_read(self, seq: KVSeq) -> None:
        self.connector.drop_read(seq)

    def take_plan(self) -> TierPlan | None:
        return self.connector.take_plan()

    def tier_stats(self, flush: bool = True) -> TierCounters | None:
        return self.connector.report(flush)

    def close(self) -> None:
        self.connector.close()

    @property
    def cached(self) -> dict[bytes, int]:
        """The prefix index: page key -> page holding that KV."""
        return self.pool.cached
