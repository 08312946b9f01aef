"""The KV pages' host-side records: reference counts, pins, the prefix index and the free list.

A full page whose KV has been computed is keyed by a chained hash of its token ids (blake2b over the
parent page's hash and the ids; never Python's salted `hash()`). A page whose reference count drops to
zero goes to the back of the free list but keeps its key, so a later prompt with the same prefix can
take it back until it is handed out again: the free list is the eviction order (least recently freed
first), and handing a page out evicts its key. A pinned page (a transfer is reading or filling it) is
never on the free list, so it is neither handed out nor evicted until its last unpin.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from xrt.ids import int64_bytes
from xrt.kvcache.by_list import ByList


def page_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    return _hash(parent, int64_bytes(token_ids))


def _hash(parent: bytes | None, data: bytes) -> bytes:
    """page_hash of a page's token ids already as bytes (int64, native order)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\0" * 16)
    h.update(data)
    return h.digest()


def _page_bytes(token_ids: list[int], num_pages: int, page_size: int) -> list[bytes]:
    """The token ids of the first num_pages pages as bytes, one string per page: one conversion for all of
    them (per page it was most of a lookup's host time: ~2 ms for an 8k-token prompt)."""
    raw = int64_bytes(token_ids[: num_pages * page_size])
    step = 8 * page_size
    return [raw[i * step : (i + 1) * step] for i in range(num_pages)]


def _chain(parent: bytes | None, token_ids: list[int], num_pages: int, page_size: int) -> list[tuple[bytes, bytes]]:
    """(key, ids as bytes) of the first num_pages pages of token_ids, the keys chained on from parent."""
    out = []
    for data in _page_bytes(token_ids, num_pages, page_size):
        parent = _hash(parent, data)
        out.append((parent, data))
    return out


@dataclass(slots=True)
class Page:
    page_id: int
    ref_count: int = 0
    pins: int = 0
    hash: bytes | None = None
    data: bytes = b""  # its token ids as bytes (int64): what a hash match is checked against


class PageKeys:
    """A token list's pages as bytes (int64 ids, converted in bulk as far as asked) and their keys (`page_hash`
    chained from the first page, made page by page as far as asked: a match that stops early hashes no further)."""

    __slots__ = ("token_ids", "page_size", "hashes", "datas")

    def __init__(self, token_ids: list[int], page_size: int) -> None:
        self.token_ids = token_ids
        self.page_size = page_size
        self.hashes: list[bytes] = []
        self.datas: list[bytes] = []

    def convert_to(self, num_pages: int) -> None:
        """The first num_pages pages (all full) as bytes."""
        known = len(self.datas)
        if num_pages > known:
            ps = self.page_size
            self.datas.extend(_page_bytes(self.token_ids[known * ps : num_pages * ps], num_pages - known, ps))

    def extend_to(self, num_pages: int) -> None:
        """Key the first num_pages pages (all full)."""
        known = len(self.hashes)
        if num_pages <= known:
            return
        self.convert_to(num_pages)
        hashes, parent = self.hashes, self.hashes[-1] if known else None
        for data in self.datas[known:num_pages]:
            parent = _hash(parent, data)
            hashes.append(parent)


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1:
            raise ValueError(f"cache.num_pages: must be >= 1, got {num_pages}")
        self.page_size = page_size
        self.pages = [Page(i) for i in range(num_pages)]
        # Insertion-ordered: the front is the page freed longest ago, handed out first. An
        # OrderedDict, not a dict: taking from the front of a dict scans the entries deleted there.
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))
        self.cached: dict[bytes, int] = {}
        self._keys: ByList[PageKeys] = ByList(lambda ids: PageKeys(ids, page_size))

    def match(self, token_ids: list[int], num_pages: int) -> tuple[list[int], list[bytes]]:
        """Cached pages (and their keys) holding the longest prefix of token_ids, at most num_pages."""
        pages: list[int] = []
        hashes: list[bytes] = []
        if num_pages < 1:
            return pages, hashes
        keys = self._keys.get(token_ids)
        # The first page alone first: most new prompts miss there, and converting all of a long prompt's ids would be
        # most of their lookup. A hit converts the rest in one go and keys pages as far as the match goes, once: a
        # waiting prompt is matched at every step while the free pages are short, and its commits reuse the keys.
        keys.extend_to(1)
        if self.cached.get(keys.hashes[0]) is None:
            return pages, hashes
        keys.convert_to(num_pages)
        cached, records, known = self.cached, self.pages, keys.hashes
        for i in range(num_pages):
            if i == len(known):
                keys.extend_to(i + 1)
            h = known[i]
            pid = cached.get(h)
            if pid is None or records[pid].data != keys.datas[i]:
                break
            pages.append(pid)
            hashes.append(h)
        return pages, hashes

    def num_free_among(self, page_ids: Iterable[int]) -> int:
        return sum(1 for p in page_ids if p in self.free)

    def share(self, page_id: int, key: bytes) -> None:
        """One more holder of a cached page (a prefix hit); it leaves the free list if it was there."""
        page = self.pages[page_id]
        if page.hash != key:
            raise RuntimeError(f"page {page_id} no longer holds the prefix it was found with (stale PrefixHit)")
        if page.ref_count == 0 and not page.pins:
            del self.free[page_id]
        page.ref_count += 1

    def take(self) -> int:
        """A page for new KV: the front of the free list, whose prefix-cache key is evicted."""
        return self.take_many(1)[0]

    def take_many(self, n: int) -> list[int]:
        """n pages as `take` hands them out, in that order (one loop: a prompt's pages are taken on the way to its
        first token)."""
        free, pages, cached = self.free, self.pages, self.cached
        if len(free) < n:
            raise RuntimeError("no free KV page (the scheduler must check can_allocate/can_append first)")
        out = []
        for _ in range(n):
            pid, _ = free.popitem(last=False)
            page = pages[pid]
            if page.hash is not None:  # evict its key
                if cached.get(page.hash) == pid:
                    del cached[page.hash]
                page.hash = None
                page.data = b""
            page.ref_count = 1
            out.append(pid)
        return out

    def release(self, page_ids: Iterable[int]) -> None:
        """Drop one holder of each page; unheld, unpinned pages join the back of the free list in this order."""
        for pid in page_ids:
            page = self.pages[pid]
            page.ref_count -= 1
            assert page.ref_count >= 0, f"page {pid} freed twice"
            if page.ref_count == 0 and not page.pins:
                self.free[pid] = None

    def register(self, page_table: list[int], hashes: list[bytes], token_ids: list[int], num_full: int) -> None:
        """Key the pages page_table[len(hashes) : num_full] (full, their KV computed) for reuse,
        extending the chain `hashes`; a key another page holds already keeps that page."""
        first = len(hashes)
        if num_full <= first:
            return
        keys = self._keys.find(token_ids)
        if keys is not None and len(keys.hashes) >= first:
            keys.extend_to(num_full)
            new = zip(keys.hashes[first:num_full], keys.datas[first:num_full], strict=True)
        else:  # keyed before this list had an entry (dropped past the capacity): chain on from its own keys
            ps = self.page_size
            new = _chain(hashes[-1] if hashes else None, token_ids[first * ps : num_full * ps], num_full - first, ps)
        for i, (key, data) in enumerate(new, start=first):
            hashes.append(key)
            if key not in self.cached:
                pid = page_table[i]
                self.cached[key] = pid
                page = self.pages[pid]
                page.hash = key
                page.data = data

    def forget(self, token_ids: list[int]) -> None:
        """Drop what was derived from token_ids (its sequence let go of its pages; a re-admission keys it again)."""
        self._keys.forget(token_ids)

    def pin(self, page_ids: Iterable[int]) -> None:
        for pid in page_ids:
            page = self.pages[pid]
            if page.ref_count == 0 and not page.pins:
                del self.free[pid]
            page.pins += 1

    def unpin(self, page_ids: Iterable[int]) -> None:
        for pid in page_ids:
            page = self.pages[pid]
            page.pins -= 1
            assert page.pins >= 0, f"page {pid} unpinned more often than pinned"
            if page.pins == 0 and page.ref_count == 0:
                self.free[pid] = None

    def evict(self, max_pages: int | None = None) -> list[int]:
        """Drop the prefix-cache keys of up to max_pages keyed free pages (None: all), in eviction
        order; the pages stay free. Returns the pages whose keys were dropped."""
        evicted: list[int] = []
        for pid in self.free:
            if max_pages is not None and len(evicted) >= max_pages:
                break
            page = self.pages[pid]
            if page.hash is not None:
                if self.cached.get(page.hash) == pid:
                    del self.cached[page.hash]
                page.hash = None
                page.data = b""
                evicted.append(pid)
        return evicted
