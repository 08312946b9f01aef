from __future__ import annotations

import hashlib
import random
from array import array

import pytest

from xrt.config import SamplingArgs
from xrt.engine.sequence import Sequence
from xrt.kvcache.interface import NO_HIT, CommittedPages
from xrt.kvcache.manager import KVCacheManager
from xrt.kvcache.pool import page_hash

PS = 4


def make_seq(tokens: list[int], request_id: int = 0) -> Sequence:
    return Sequence(request_id=request_id, prompt_token_ids=tokens, sampling=SamplingArgs(), seed=0)


def admit(kv: KVCacheManager, seq: Sequence) -> None:
    """What the scheduler does on admission: look up the cached prefix and allocate around it."""
    kv.allocate(seq, kv.lookup(seq.token_ids))


def fits(kv: KVCacheManager, seq: Sequence) -> bool:
    return kv.can_allocate(seq, kv.lookup(seq.token_ids))


def prefill(kv: KVCacheManager, seq: Sequence) -> None:
    """Allocate and mark the whole prompt computed, as a finished prefill step does."""
    admit(kv, seq)
    seq.num_computed_tokens = seq.num_tokens
    kv.commit(seq)


def test_page_hash_is_a_stable_chained_digest() -> None:
    expected = hashlib.blake2b(b"\0" * 16 + array("q", [1, 2, 3, 4]).tobytes(), digest_size=16).digest()
    first = page_hash(None, [1, 2, 3, 4])
    assert first == expected  # not Python's per-process salted hash()
    assert page_hash(first, [5, 6, 7, 8]) != page_hash(None, [5, 6, 7, 8])


def test_shared_prefix_reuses_computed_pages_and_counts_refs() -> None:
    kv = KVCacheManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(10)))  # pages: [0..3] [4..7] [8, 9]
    prefill(kv, a)
    b = make_seq(list(range(8)) + [50, 51, 52], request_id=1)
    admit(kv, b)
    assert b.page_table[:2] == a.page_table[:2]
    assert b.page_table[2] not in a.page_table
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert [kv.pool.pages[p].ref_count for p in a.page_table] == [2, 2, 1]
    kv.free(a)
    assert [kv.pool.pages[p].ref_count for p in b.page_table[:2]] == [1, 1]
    assert kv.num_free_pages == 16 - 3


def test_hash_chain_requires_the_whole_prefix_to_match() -> None:
    kv = KVCacheManager(num_pages=16, page_size=PS, prefix_caching=True)
    prefill(kv, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Same second page, different first page: no hit anywhere.
    other = make_seq([9, 9, 9, 9, 5, 6, 7, 8, 9], request_id=1)
    admit(kv, other)
    assert other.num_cached_tokens == 0


def test_hit_never_covers_the_whole_prompt() -> None:
    kv = KVCacheManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(8)))  # exactly two full pages
    prefill(kv, a)
    b = make_seq(list(range(8)), request_id=1)
    admit(kv, b)
    assert b.num_cached_tokens == 4  # the last page is recomputed so the last token has logits
    assert b.page_table[0] == a.page_table[0] and b.page_table[1] != a.page_table[1]


def test_uncomputed_pages_are_not_reused() -> None:
    kv = KVCacheManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(12)))
    admit(kv, a)  # allocated but its KV not computed yet (mid-prefill)
    b = make_seq(list(range(12)), request_id=1)
    admit(kv, b)
    assert b.num_cached_tokens == 0
    assert not set(a.page_table) & set(b.page_table)


def test_freed_pages_stay_reusable_until_reallocated() -> None:
    kv = KVCacheManager(num_pages=6, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(9)))
    prefill(kv, a)
    first_two = a.page_table[:2]
    kv.free(a)
    assert kv.num_free_pages == 6
    c = make_seq(list(range(8)) + [70], request_id=1)
    assert fits(kv, c)
    admit(kv, c)
    assert c.page_table[:2] == first_two and c.num_cached_tokens == 8
    kv.free(c)
    # Fill the whole pool with unrelated tokens: every page is handed out again, so the old prefix is gone.
    filler = make_seq([100 + i for i in range(6 * PS)], request_id=2)
    admit(kv, filler)
    kv.free(filler)
    d = make_seq(list(range(8)) + [70], request_id=3)
    admit(kv, d)
    assert d.num_cached_tokens == 0


def test_eviction_takes_the_longest_freed_pages_first() -> None:
    kv = KVCacheManager(num_pages=8, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(13)))  # 4 pages
    prefill(kv, a)
    kv.free(a)
    # Two fresh pages come from the never-used pages before any cached page is evicted.
    admit(kv, make_seq([200] * 8, request_id=1))
    e = make_seq(list(range(13)), request_id=2)
    admit(kv, e)
    assert e.num_cached_tokens == 12
    kv.free(e)


def test_eviction_drops_the_end_of_a_prefix_before_its_start() -> None:
    kv = KVCacheManager(num_pages=4, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(13)))  # 3 full pages + 1 partial
    prefill(kv, a)
    pages = a.page_table
    kv.free(a)
    admit(kv, make_seq([200] * 8, request_id=1))  # takes 2 pages: the partial one, then the third full one
    e = make_seq(list(range(13)), request_id=2)
    assert list(kv.lookup(e.token_ids).pages) == pages[:2]


def test_can_allocate_counts_hit_pages_sitting_in_the_free_list() -> None:
    kv = KVCacheManager(num_pages=4, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(13)))  # all 4 pages
    prefill(kv, a)
    kv.free(a)
    same = make_seq(list(range(13)), request_id=1)
    assert fits(kv, same)  # 3 hits from the free list + 1 fresh page
    longer = make_seq(list(range(17)), request_id=2)
    assert not fits(kv, longer)  # needs 5 pages
    admit(kv, same)
    assert kv.num_free_pages == 0 and same.num_cached_tokens == 12


def test_append_grows_page_table_only_at_page_boundaries() -> None:
    kv = KVCacheManager(num_pages=4, page_size=PS, prefix_caching=False)
    s = make_seq([1, 2, 3])
    admit(kv, s)
    assert len(s.page_table) == 1
    s.token_ids.append(4)
    kv.append(s)
    assert len(s.page_table) == 1
    s.token_ids.append(5)
    assert kv.can_append(s)
    kv.append(s)
    assert len(s.page_table) == 2 and kv.num_free_pages == 2


def test_prefix_caching_off_never_shares() -> None:
    kv = KVCacheManager(num_pages=16, page_size=PS, prefix_caching=False)
    prefill(kv, make_seq(list(range(12))))
    b = make_seq(list(range(12)), request_id=1)
    admit(kv, b)
    assert b.num_cached_tokens == 0 and not kv.cached


def test_decode_filled_pages_become_reusable() -> None:
    kv = KVCacheManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq([1, 2, 3])
    prefill(kv, a)
    for t in (4, 5, 6):  # generated tokens fill the first page and start the second
        a.token_ids.append(t)
        kv.append(a)
        a.num_computed_tokens = a.num_tokens
        kv.commit(a)
    b = make_seq([1, 2, 3, 4, 9], request_id=1)
    admit(kv, b)
    assert b.num_cached_tokens == 4 and b.page_table[0] == a.page_table[0]


def test_taking_from_an_empty_pool_is_an_error_not_corruption() -> None:
    kv = KVCacheManager(num_pages=1, page_size=PS, prefix_caching=True)
    admit(kv, make_seq([1, 2, 3]))
    with pytest.raises(RuntimeError, match="no free KV page"):
        admit(kv, make_seq([4, 5], request_id=1))


def test_numpy_page_tables_follow_every_allocation_append_and_free() -> None:
    """The rows a decode step gathers its page tables from match the page-table lists, through
    prefix hits, growth past the mirror's width, pending (in-flight) tokens and reuse of rows."""
    kv = KVCacheManager(num_pages=400, page_size=PS, prefix_caching=True)
    rng = random.Random(0)
    live: list[Sequence] = []

    def check() -> None:
        rows = [s.table_row for s in live]
        assert len(set(rows)) == len(rows) and min(rows, default=0) >= 0
        assert kv.tables.num_rows_in_use == len(live)  # freed rows are given back
        for s in live:
            assert kv.page_tables[s.table_row, : len(s.page_table)].tolist() == s.page_table

    for i in range(120):
        if live and rng.random() < 0.3:
            kv.free(live.pop(rng.randrange(len(live))))
        elif rng.random() < 0.5 or not live:
            s = make_seq([rng.randrange(3) for _ in range(rng.randint(1, 30))], request_id=i)
            if fits(kv, s):
                prefill(kv, s)
                live.append(s)
        else:
            s = live[rng.randrange(len(live))]
            s.num_pending_tokens = rng.randint(0, 2)
            for _ in range(rng.randint(1, 70)):
                if not kv.can_append(s):
                    break
                s.token_ids.append(rng.randrange(3))
                kv.append(s)
            assert len(s.page_table) == kv.pages_for(s.num_tokens + s.num_pending_tokens) or not kv.can_append(s)
        check()
    long = make_seq(list(range(300)), request_id=999)  # 75 pages: wider than the first table
    prefill(kv, long)
    live.append(long)
    check()


def chain(tokens: list[int], num_pages: int) -> list[bytes]:
    """The expected keys of the first num_pages full pages of tokens."""
    keys: list[bytes] = []
    for i in range(num_pages):
        keys.append(page_hash(keys[-1] if keys else None, tokens[i * PS : (i + 1) * PS]))
    return keys


def test_lookup_returns_the_longest_cached_prefix() -> None:
    kv = KVCacheManager(num_pages=32, page_size=PS, prefix_caching=True)
    short = make_seq(list(range(9)))  # 2 full pages
    long = make_seq(list(range(8)) + [40, 41, 42, 43, 44, 45, 46, 47, 48], request_id=1)  # shares 2, adds 2
    prefill(kv, short)
    prefill(kv, long)
    query = list(range(8)) + [40, 41, 42, 43, 44, 45, 46, 47, 99, 98]
    hit = kv.lookup(query)
    assert hit.pages == tuple(long.page_table[:4]) and hit.pages[:2] == tuple(short.page_table[:2])
    assert hit.hashes == tuple(chain(query, 4)) and hit.num_tokens == 16
    assert kv.lookup(list(range(8)) + [40, 41, 42, 43, 7]).num_tokens == 12  # diverges inside page 4
    assert kv.lookup(query[:16]).num_tokens == 12  # the last token is always left to compute
    assert kv.lookup([5, 6, 7, 8, 9]) is NO_HIT
    off = KVCacheManager(num_pages=32, page_size=PS, prefix_caching=False)
    prefill(off, make_seq(list(range(9))))
    assert off.lookup(list(range(9))) is NO_HIT


def test_a_stale_hit_is_refused() -> None:
    kv = KVCacheManager(num_pages=3, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(9)))
    prefill(kv, a)
    kv.free(a)
    hit = kv.lookup(a.token_ids)
    assert hit.num_tokens == 8
    admit(kv, make_seq([100 + i for i in range(12)], request_id=1))  # takes every page, evicting the prefix
    with pytest.raises(RuntimeError, match="stale PrefixHit"):
        kv.allocate(make_seq(list(range(9)), request_id=2), hit)


def test_commit_listener_sees_each_newly_full_page_once() -> None:
    kv = KVCacheManager(num_pages=32, page_size=PS, prefix_caching=True)
    events: list[CommittedPages] = []
    kv.add_commit_listener(events.append)
    a = make_seq(list(range(10)))  # two full pages and a partial one
    prefill(kv, a)
    assert len(events) == 1
    e = events[0]
    assert (e.seq, e.page_ids, e.hashes, e.start, e.end) == (a, a.page_table[:2], chain(a.token_ids, 2), 0, 8)
    assert e.token_ids == list(range(8))
    kv.commit(a)  # nothing new: no event
    for t in (10, 11, 12, 13):  # decode: page 3 fills at token 12, page 4 is not full yet
        a.token_ids.append(t)
        kv.append(a)
        a.num_computed_tokens = a.num_tokens - 1  # the newest token is fed next step
        kv.commit(a)
    assert len(events) == 2
    e = events[1]
    assert (e.page_ids, e.hashes, e.start, e.end) == ([a.page_table[2]], chain(a.token_ids, 3)[2:], 8, 12)
    # A sequence admitted on a cached prefix reports only the pages it computed itself.
    b = make_seq(list(range(12)) + [7, 7, 7, 7, 7], request_id=1)
    prefill(kv, b)
    assert b.num_cached_tokens == 12 and len(events) == 3
    e = events[2]
    assert (e.seq, e.page_ids, e.start, e.end) == (b, [b.page_table[3]], 12, 16)
    assert e.hashes == chain(b.token_ids, 4)[3:]


def test_pinned_pages_are_never_handed_out_or_evicted() -> None:
    kv = KVCacheManager(num_pages=6, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(9)))  # 3 pages, 2 of them full and cached
    prefill(kv, a)
    held = a.page_table[:2]
    kv.pin(held)  # a store to a lower tier is reading them
    kv.free(a)
    assert kv.num_free_pages == 4  # the pinned pages stay off the free list after their holder left
    assert kv.evict() == []  # the pinned pages keep their keys; the free partial page has none
    filler = make_seq([100 + i for i in range(16)], request_id=1)  # exactly the 4 free pages
    assert fits(kv, filler)
    admit(kv, filler)
    assert not set(filler.page_table) & set(held) and kv.num_free_pages == 0
    assert not fits(kv, make_seq([200], request_id=2))
    # Still cached: a prompt with that prefix shares the pinned pages.
    c = make_seq(list(range(8)) + [50], request_id=3)
    kv.free(filler)
    admit(kv, c)
    assert c.page_table[:2] == held and c.num_cached_tokens == 8
    kv.free(c)
    kv.unpin(held)
    assert kv.num_free_pages == 6
    # Pinning a free page takes it off the free list until it is unpinned.
    kv.pin(held[:1])
    assert kv.num_free_pages == 5 and held[0] not in kv.evict()
    kv.unpin(held[:1])
    assert kv.num_free_pages == 6
    with pytest.raises(AssertionError, match="unpinned more often"):
        kv.unpin(held[:1])


def test_evict_follows_the_free_list_tail_pages_first() -> None:
    kv = KVCacheManager(num_pages=8, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(17)))  # 4 full cached pages and a partial one
    prefill(kv, a)
    pages = a.page_table
    kv.free(a)
    assert kv.evict(2) == [pages[3], pages[2]]  # never-used and uncached pages carry no key: skipped
    assert kv.lookup(a.token_ids).pages == tuple(pages[:2])
    b = make_seq(list(range(5)), request_id=1)
    admit(kv, b)  # shares pages[0]: in use, so not evictable
    assert kv.evict() == [pages[1]]
    assert kv.lookup(a.token_ids).pages == (pages[0],)
    assert kv.num_free_pages == 8 - len(b.page_table)


def test_fresh_pages_are_handed_out_in_ascending_order() -> None:
    """Whatever order the free list holds them in (a freed sequence's pages come back tail first), a sequence's
    fresh pages are ascending, so a KV tier copies a chunk's pages as one run (xrt/kvstore/copy.py)."""
    kv = KVCacheManager(num_pages=32, page_size=4, prefix_caching=False)
    first = make_seq(list(range(40)))  # 10 pages
    admit(kv, first)
    assert first.page_table == list(range(10))
    kv.free(first)  # back on the free list after the 22 untouched pages, 9 first
    seq = make_seq(list(range(100, 120)), request_id=1)  # 5 pages: the free list's front
    admit(kv, seq)
    assert seq.page_table == sorted(seq.page_table) == list(range(10, 15))
    rest = make_seq(list(range(200, 300)), request_id=2)  # 25 pages: 17 untouched, then 8 of the freed, descending
    admit(kv, rest)
    assert rest.page_table == sorted(rest.page_table)
    assert rest.page_table == [*range(2, 10), *range(15, 32)]


def test_a_hash_match_is_checked_against_the_pages_tokens() -> None:
    """A key that names a page holding other tokens (a blake2b collision, forged here) is not a hit: match compares
    the page's own token bytes, and stops there."""
    from xrt.kvcache.pool import PagePool

    pool = PagePool(8, PS)
    a, b = list(range(10, 10 + 2 * PS)), list(range(500, 500 + 2 * PS))
    table = [pool.take() for _ in range(2)]
    hashes: list[bytes] = []
    pool.register(table, hashes, a, 2)
    assert pool.match(a, 2) == (table, hashes)
    pool.cached[page_hash(None, b[:PS])] = table[0]  # b's first key now names a's first page
    assert pool.match(b, 2) == ([], [])
    assert pool.match(a + [1], 2) == (table, hashes)  # a itself still matches, past its own end too
