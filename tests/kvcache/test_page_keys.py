"""The pool keys a token list's pages once (`PageKeys`, kept by the list object, `ByList`): a prompt that waits while
the free pages are short is matched at every step, and its prefill's and decode steps' commits key the same pages
again. What is checked: the keys equal an independent blake2b chain, a repeated match makes no hash, matches still
follow the prefix cache as pages are handed out and keyed, and a list whose entry is gone keys on from its own chain."""

from __future__ import annotations

import hashlib
from array import array

import pytest

import xrt.kvcache.pool as pool_module
from xrt.config import SamplingArgs
from xrt.engine.sequence import Sequence
from xrt.kvcache.manager import KVCacheManager
from xrt.kvcache.pool import PagePool

PS = 4


def reference_keys(ids: list[int], num_pages: int) -> list[bytes]:
    """blake2b-128 over the parent key (16 zero bytes for the first page) and the page's ids as int64."""
    keys, parent = [], b"\0" * 16
    for i in range(num_pages):
        parent = hashlib.blake2b(parent + array("q", ids[i * PS:(i + 1) * PS]).tobytes(), digest_size=16).digest()
        keys.append(parent)
    return keys


@pytest.fixture
def hashes_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """[pages hashed so far]."""
    count = [0]
    original = pool_module._hash

    def counting(parent: bytes | None, data: bytes) -> bytes:
        count[0] += 1
        return original(parent, data)

    monkeypatch.setattr(pool_module, "_hash", counting)
    return count


def test_a_repeated_match_makes_no_hash_and_follows_the_cache(hashes_made: list[int]) -> None:
    pool = PagePool(16, PS)
    running = list(range(100, 100 + 8 * PS))  # a running sequence's tokens: 8 full pages, computed
    table = pool.take_many(8)
    chain: list[bytes] = []
    pool.register(table, chain, running, 8)
    assert chain == reference_keys(running, 8) and hashes_made[0] == 8
    waiting = running + [7, 8, 9]  # another list (the next turn): 8 full pages, then a partial one
    assert pool.match(waiting, 8) == (table, chain)
    assert hashes_made[0] == 16  # its own keys, once
    for _ in range(3):
        assert pool.match(waiting, 8) == (table, chain)
    assert hashes_made[0] == 16
    # The running sequence ends (its pages join the free list tail first, behind the 8 never used) and its last 3
    # pages are handed out again, their keys evicted: the match shrinks.
    pool.release(reversed(table))
    pool.take_many(8 + 3)
    assert pool.match(waiting, 8) == (table[:5], chain[:5])
    # The first page's key is evicted too: no match at all.
    pool.take_many(5)
    assert pool.match(waiting, 8) == ([], [])
    assert hashes_made[0] == 16


def test_commits_reuse_the_keys_a_match_made_and_extend_them_page_by_page(hashes_made: list[int]) -> None:
    """A match keys pages only as far as it goes (the rest waits for the commit, which the GPU path makes while the
    prefill runs); each page is keyed once in all."""
    kv = KVCacheManager(16, PS, prefix_caching=True)
    ids = list(range(50, 50 + 5 * PS + 1))
    seq = Sequence(request_id=0, prompt_token_ids=ids, sampling=SamplingArgs(), seed=0)
    kv.pool.register(kv.pool.take_many(1), [], list(ids[:PS]), 1)  # another list holds the first page: a hit
    hashes_made[0] = 0
    hit = kv.lookup(seq.token_ids)
    assert hit.num_tokens == PS and hashes_made[0] == 2  # keyed as far as the match went: its first miss
    kv.allocate(seq, hit)
    seq.num_computed_tokens = seq.num_tokens
    kv.commit(seq)
    assert seq.page_hashes == reference_keys(seq.token_ids, 5) and hashes_made[0] == 5
    for _ in range(3 * PS):  # decode steps: a page fills every PS tokens, and only it is keyed
        seq.token_ids.append(len(seq.token_ids))
        kv.append(seq)
        seq.num_computed_tokens = seq.num_tokens
        kv.commit(seq)
    assert seq.page_hashes == reference_keys(seq.token_ids, 8) and hashes_made[0] == 8
    # The freed sequence's list is forgotten: what is kept is what live sequences and recent lookups need.
    entries = len(kv.pool._keys)
    kv.free(seq)
    assert len(kv.pool._keys) == entries - 1


def test_a_list_whose_keys_were_dropped_keys_on_from_its_own_chain(hashes_made: list[int]) -> None:
    pool = PagePool(16, PS)
    pool._keys.capacity = 1
    ids = list(range(300, 300 + 4 * PS))
    table, chain = pool.take_many(4), []
    pool.register(table, chain, ids, 2)
    pool.match(list(range(900, 900 + 2 * PS)), 1)  # another list's entry takes the only place
    hashes_made[0] = 0
    pool.register(table, chain, ids, 4)  # no entry: the 2 new pages, chained on from the sequence's own keys
    assert chain == reference_keys(ids, 4) and hashes_made[0] == 2
    assert pool.match(ids + [1], 4) == (table, chain)
