"""Paged KV allocator with prefix caching (nano-vllm style).

A full page whose KV has been computed is keyed by a chained hash of its token ids
(blake2b over the parent page's hash and the ids; never Python's salted `hash()`). Pages are
reference counted; a page whose count drops to zero goes to the back of the free list but keeps its
hash, so a later prompt with the same prefix can take it back until it is handed out again.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from xrt.engine.sequence import Sequence
from xrt.kvcache.page_tables import PageTables


def page_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\0" * 16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


@dataclass
class Page:
    page_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool) -> None:
        if num_pages < 1:
            raise ValueError(f"cache.num_pages: must be >= 1, got {num_pages}")
        self.page_size = page_size
        self.prefix_caching = prefix_caching
        self.pages = [Page(i) for i in range(num_pages)]
        # Insertion-ordered: the front is the page freed longest ago, handed out first. An
        # OrderedDict, not a dict: taking from the front of a dict scans the entries deleted there.
        self.free_pages: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))
        self.cached: dict[bytes, int] = {}
        self.page_tables = PageTables()

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], list[bytes]]:
        """Cached pages (and their hashes) covering the longest cached prefix of token_ids, leaving at
        least the last token to recompute so the sequence gets logits."""
        if not self.prefix_caching:
            return [], []
        ps = self.page_size
        pages: list[int] = []
        hashes: list[bytes] = []
        parent: bytes | None = None
        for i in range((len(token_ids) - 1) // ps):
            chunk = token_ids[i * ps : (i + 1) * ps]
            h = page_hash(parent, chunk)
            pid = self.cached.get(h)
            if pid is None or self.pages[pid].token_ids != tuple(chunk):
                break
            pages.append(pid)
            hashes.append(h)
            parent = h
        return pages, hashes

    def can_allocate(self, seq: Sequence) -> bool:
        hits, _ = self.match_prefix(seq.token_ids)
        hits_in_free = sum(1 for p in hits if p in self.free_pages)
        fresh = self.pages_for(seq.num_tokens) - len(hits)
        return self.num_free_pages - hits_in_free >= fresh

    def allocate(self, seq: Sequence) -> None:
        """Pages for all of seq.token_ids; sets num_cached_tokens / num_computed_tokens to the prefix hit."""
        assert not seq.page_table, f"request {seq.request_id} already holds pages"
        hits, hashes = self.match_prefix(seq.token_ids)
        for pid in hits:
            page = self.pages[pid]
            if page.ref_count == 0:
                del self.free_pages[pid]
            page.ref_count += 1
        seq.page_table = list(hits)
        seq.page_hashes = list(hashes)
        for _ in range(self.pages_for(seq.num_tokens) - len(hits)):
            seq.page_table.append(self._take_free_page())
        self.page_tables.assign(seq)
        seq.num_cached_tokens = len(hits) * self.page_size
        seq.num_computed_tokens = seq.num_cached_tokens

    def needs_page(self, seq: Sequence) -> bool:
        """Whether seq's next decode step opens a page (its tokens, those in flight included, fill its pages)."""
        return seq.num_tokens + seq.num_pending_tokens > len(seq.page_table) * self.page_size

    def can_append(self, seq: Sequence) -> bool:
        return not self.needs_page(seq) or self.num_free_pages > 0

    def append(self, seq: Sequence) -> None:
        """Ensures the pages cover every token of seq, those in flight included (the newest one is
        written next step)."""
        while self.pages_for(seq.num_tokens + seq.num_pending_tokens) > len(seq.page_table):
            seq.page_table.append(self._take_free_page())
            self.page_tables.appended(seq)

    def commit(self, seq: Sequence, num_computed: int | None = None) -> None:
        """Registers pages that became full and computed, so later prompts can reuse them.
        num_computed: tokens whose KV is known computed (default seq.num_computed_tokens, which
        also counts decode steps still in flight)."""
        if not self.prefix_caching:
            return
        ps = self.page_size
        computed = seq.num_computed_tokens if num_computed is None else num_computed
        for i in range(len(seq.page_hashes), computed // ps):
            chunk = seq.token_ids[i * ps : (i + 1) * ps]
            parent = seq.page_hashes[-1] if seq.page_hashes else None
            h = page_hash(parent, chunk)
            seq.page_hashes.append(h)
            page = self.pages[seq.page_table[i]]
            if h not in self.cached:
                self.cached[h] = page.page_id
                page.hash = h
                page.token_ids = tuple(chunk)

    def free(self, seq: Sequence) -> None:
        # Tail pages first, so the end of a prefix is evicted before its start.
        for pid in reversed(seq.page_table):
            page = self.pages[pid]
            page.ref_count -= 1
            assert page.ref_count >= 0, f"page {pid} freed twice"
            if page.ref_count == 0:
                self.free_pages[pid] = None
        self.page_tables.release(seq)
        seq.page_table = []
        seq.page_hashes = []
        seq.num_computed_tokens = 0

    def _take_free_page(self) -> int:
        if not self.free_pages:
            raise RuntimeError("no free KV page (the scheduler must check can_allocate/can_append first)")
        pid, _ = self.free_pages.popitem(last=False)
        page = self.pages[pid]
        if page.hash is not None and self.cached.get(page.hash) == pid:
            del self.cached[page.hash]
        page.hash = None
        page.token_ids = ()
        page.ref_count = 1
        return pid
