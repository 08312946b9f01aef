from __future__ import annotations

import hashlib
import random
from array import array

import pytest

from xrt.config import SamplingArgs
from xrt.engine.sequence import Sequence
from xrt.kvcache.block_manager import BlockManager, page_hash

PS = 4


def make_seq(tokens: list[int], request_id: int = 0) -> Sequence:
    return Sequence(request_id=request_id, prompt_token_ids=tokens, sampling=SamplingArgs(), seed=0)


def prefill(bm: BlockManager, seq: Sequence) -> None:
    """Allocate and mark the whole prompt computed, as a finished prefill step does."""
    bm.allocate(seq)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)


def test_page_hash_is_a_stable_chained_digest() -> None:
    expected = hashlib.blake2b(b"\0" * 16 + array("q", [1, 2, 3, 4]).tobytes(), digest_size=16).digest()
    first = page_hash(None, [1, 2, 3, 4])
    assert first == expected  # not Python's per-process salted hash()
    assert page_hash(first, [5, 6, 7, 8]) != page_hash(None, [5, 6, 7, 8])


def test_shared_prefix_reuses_computed_pages_and_counts_refs() -> None:
    bm = BlockManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(10)))  # pages: [0..3] [4..7] [8, 9]
    prefill(bm, a)
    b = make_seq(list(range(8)) + [50, 51, 52], request_id=1)
    bm.allocate(b)
    assert b.page_table[:2] == a.page_table[:2]
    assert b.page_table[2] not in a.page_table
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert [bm.pages[p].ref_count for p in a.page_table] == [2, 2, 1]
    bm.free(a)
    assert [bm.pages[p].ref_count for p in b.page_table[:2]] == [1, 1]
    assert bm.num_free_pages == 16 - 3


def test_hash_chain_requires_the_whole_prefix_to_match() -> None:
    bm = BlockManager(num_pages=16, page_size=PS, prefix_caching=True)
    prefill(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Same second page, different first page: no hit anywhere.
    other = make_seq([9, 9, 9, 9, 5, 6, 7, 8, 9], request_id=1)
    bm.allocate(other)
    assert other.num_cached_tokens == 0


def test_hit_never_covers_the_whole_prompt() -> None:
    bm = BlockManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(8)))  # exactly two full pages
    prefill(bm, a)
    b = make_seq(list(range(8)), request_id=1)
    bm.allocate(b)
    assert b.num_cached_tokens == 4  # the last page is recomputed so the last token has logits
    assert b.page_table[0] == a.page_table[0] and b.page_table[1] != a.page_table[1]


def test_uncomputed_pages_are_not_reused() -> None:
    bm = BlockManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(12)))
    bm.allocate(a)  # allocated but its KV not computed yet (mid-prefill)
    b = make_seq(list(range(12)), request_id=1)
    bm.allocate(b)
    assert b.num_cached_tokens == 0
    assert not set(a.page_table) & set(b.page_table)


def test_freed_pages_stay_reusable_until_reallocated() -> None:
    bm = BlockManager(num_pages=6, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(9)))
    prefill(bm, a)
    first_two = a.page_table[:2]
    bm.free(a)
    assert bm.num_free_pages == 6
    c = make_seq(list(range(8)) + [70], request_id=1)
    assert bm.can_allocate(c)
    bm.allocate(c)
    assert c.page_table[:2] == first_two and c.num_cached_tokens == 8
    bm.free(c)
    # Fill the whole pool with unrelated tokens: every page is handed out again, so the old prefix is gone.
    filler = make_seq([100 + i for i in range(6 * PS)], request_id=2)
    bm.allocate(filler)
    bm.free(filler)
    d = make_seq(list(range(8)) + [70], request_id=3)
    bm.allocate(d)
    assert d.num_cached_tokens == 0


def test_eviction_takes_the_longest_freed_pages_first() -> None:
    bm = BlockManager(num_pages=8, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(13)))  # 4 pages
    prefill(bm, a)
    bm.free(a)
    # Two fresh pages come from the never-used pages before any cached page is evicted.
    bm.allocate(make_seq([200] * 8, request_id=1))
    e = make_seq(list(range(13)), request_id=2)
    bm.allocate(e)
    assert e.num_cached_tokens == 12
    bm.free(e)


def test_eviction_drops_the_end_of_a_prefix_before_its_start() -> None:
    bm = BlockManager(num_pages=4, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(13)))  # 3 full pages + 1 partial
    prefill(bm, a)
    pages = a.page_table
    bm.free(a)
    bm.allocate(make_seq([200] * 8, request_id=1))  # takes 2 pages: the partial one, then the third full one
    e = make_seq(list(range(13)), request_id=2)
    assert bm.match_prefix(e.token_ids)[0] == pages[:2]


def test_can_allocate_counts_hit_pages_sitting_in_the_free_list() -> None:
    bm = BlockManager(num_pages=4, page_size=PS, prefix_caching=True)
    a = make_seq(list(range(13)))  # all 4 pages
    prefill(bm, a)
    bm.free(a)
    same = make_seq(list(range(13)), request_id=1)
    assert bm.can_allocate(same)  # 3 hits from the free list + 1 fresh page
    longer = make_seq(list(range(17)), request_id=2)
    assert not bm.can_allocate(longer)  # needs 5 pages
    bm.allocate(same)
    assert bm.num_free_pages == 0 and same.num_cached_tokens == 12


def test_append_grows_page_table_only_at_page_boundaries() -> None:
    bm = BlockManager(num_pages=4, page_size=PS, prefix_caching=False)
    s = make_seq([1, 2, 3])
    bm.allocate(s)
    assert len(s.page_table) == 1
    s.token_ids.append(4)
    bm.append(s)
    assert len(s.page_table) == 1
    s.token_ids.append(5)
    assert bm.can_append(s)
    bm.append(s)
    assert len(s.page_table) == 2 and bm.num_free_pages == 2


def test_prefix_caching_off_never_shares() -> None:
    bm = BlockManager(num_pages=16, page_size=PS, prefix_caching=False)
    prefill(bm, make_seq(list(range(12))))
    b = make_seq(list(range(12)), request_id=1)
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not bm.cached


def test_decode_filled_pages_become_reusable() -> None:
    bm = BlockManager(num_pages=16, page_size=PS, prefix_caching=True)
    a = make_seq([1, 2, 3])
    prefill(bm, a)
    for t in (4, 5, 6):  # generated tokens fill the first page and start the second
        a.token_ids.append(t)
        bm.append(a)
        a.num_computed_tokens = a.num_tokens
        bm.commit(a)
    b = make_seq([1, 2, 3, 4, 9], request_id=1)
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.page_table[0] == a.page_table[0]


def test_taking_from_an_empty_pool_is_an_error_not_corruption() -> None:
    bm = BlockManager(num_pages=1, page_size=PS, prefix_caching=True)
    bm.allocate(make_seq([1, 2, 3]))
    with pytest.raises(RuntimeError, match="no free KV page"):
        bm.allocate(make_seq([4, 5], request_id=1))


def test_numpy_page_tables_follow_every_allocation_append_and_free() -> None:
    """The rows a decode step gathers its page tables from match the page-table lists, through
    prefix hits, growth past the mirror's width, pending (in-flight) tokens and reuse of rows."""
    bm = BlockManager(num_pages=400, page_size=PS, prefix_caching=True)
    rng = random.Random(0)
    live: list[Sequence] = []

    def check() -> None:
        rows = [s.table_row for s in live]
        assert len(set(rows)) == len(rows) and min(rows, default=0) >= 0
        assert bm.page_tables.num_rows_in_use == len(live)  # freed rows are given back
        for s in live:
            assert bm.page_tables.table[s.table_row, : len(s.page_table)].tolist() == s.page_table

    for i in range(120):
        if live and rng.random() < 0.3:
            bm.free(live.pop(rng.randrange(len(live))))
        elif rng.random() < 0.5 or not live:
            s = make_seq([rng.randrange(3) for _ in range(rng.randint(1, 30))], request_id=i)
            if bm.can_allocate(s):
                prefill(bm, s)
                live.append(s)
        else:
            s = live[rng.randrange(len(live))]
            s.num_pending_tokens = rng.randint(0, 2)
            for _ in range(rng.randint(1, 70)):
                if not bm.can_append(s):
                    break
                s.token_ids.append(rng.randrange(3))
                bm.append(s)
            assert len(s.page_table) == bm.pages_for(s.num_tokens + s.num_pending_tokens) or not bm.can_append(s)
        check()
    long = make_seq(list(range(300)), request_id=999)  # 75 pages: wider than the first table
    prefill(bm, long)
    live.append(long)
    check()
