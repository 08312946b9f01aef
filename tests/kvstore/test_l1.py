"""L1 (xrt/kvstore/l1.py) and the page copies (copy.py) on CPU."""

from __future__ import annotations

import threading

import pytest
import torch
from kvstore_support import LAYOUT, chunk_of, get_chunk, key, put_chunk

from xrt.kvstore.chunk import ChunkLayout, checksum
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.l1 import L1Cache, L1Full


@pytest.fixture
def layout() -> ChunkLayout:
    """(a fixture, not a conftest.py: tests/ has one conftest module name, taken by tests/conftest.py)"""
    return LAYOUT


def test_put_get_round_trip_and_checksum(layout: ChunkLayout) -> None:
    l1 = L1Cache(layout, 3 * layout.nbytes)
    assert l1.num_slots == 3 and l1.buffer.is_pinned() == torch.cuda.is_available()  # pinned only with CUDA
    chunk = chunk_of(layout, 0)
    assert put_chunk(l1, key(0), chunk)
    out = torch.empty_like(chunk)
    assert get_chunk(l1, key(0), out) and torch.equal(out, chunk)
    assert not get_chunk(l1, key(1), out)
    slot, crc = l1.acquire(key(0))
    assert crc is None  # not computed until asked (the L2 writer asks)
    assert l1.checksum_of(key(0), slot) == checksum(chunk.contiguous()) == l1.acquire(key(0))[1]
    l1.release(slot)
    l1.release(slot)


def test_put_again_is_a_no_op(layout: ChunkLayout) -> None:
    l1 = L1Cache(layout, 2 * layout.nbytes)
    assert put_chunk(l1, key(0), chunk_of(layout, 0))
    assert not put_chunk(l1, key(0), chunk_of(layout, 1))
    out = torch.empty(layout.shape, dtype=layout.kv.dtype)
    assert get_chunk(l1, key(0), out) and torch.equal(out, chunk_of(layout, 0))
    assert len(l1) == 1


def test_lru_eviction_keeps_recently_read(layout: ChunkLayout) -> None:
    l1 = L1Cache(layout, 2 * layout.nbytes)
    put_chunk(l1, key(0), chunk_of(layout, 0))
    put_chunk(l1, key(1), chunk_of(layout, 1))
    out = torch.empty(layout.shape, dtype=layout.kv.dtype)
    assert get_chunk(l1, key(0), out)  # key 0 is now the most recently used
    put_chunk(l1, key(2), chunk_of(layout, 2))
    assert l1.contains(key(0)) and not l1.contains(key(1)) and l1.contains(key(2))
    assert l1.evictions == 1
    assert get_chunk(l1, key(0), out) and torch.equal(out, chunk_of(layout, 0))  # its slot was not reused


def test_referenced_chunks_are_never_evicted(layout: ChunkLayout) -> None:
    l1 = L1Cache(layout, 2 * layout.nbytes)
    put_chunk(l1, key(0), chunk_of(layout, 0))
    reading = l1.acquire(key(0))
    writing = l1.reserve(key(1))  # the other slot, being written
    with pytest.raises(L1Full):
        l1.reserve(key(2))
    assert not l1.contains(key(1))  # a reserved chunk is invisible until published
    l1.slot_view(writing).copy_(chunk_of(layout, 1))
    l1.publish(writing)
    l1.release(reading[0])
    put_chunk(l1, key(2), chunk_of(layout, 2))  # key 0 was least recently used and is free now
    assert not l1.contains(key(0)) and l1.contains(key(1))


def test_publish_keep_hands_the_writer_reference_to_a_reader(layout: ChunkLayout) -> None:
    """A chunk published with keep (an L2 read about to be copied up) is visible at once and stays referenced:
    no reserve evicts it until it is released."""
    l1 = L1Cache(layout, layout.nbytes)
    slot = l1.reserve(key(0))
    l1.slot_view(slot).copy_(chunk_of(layout, 0))
    l1.publish(slot, keep=True)
    assert l1.contains(key(0))
    with pytest.raises(L1Full):
        l1.reserve(key(1))
    l1.release(slot)
    assert put_chunk(l1, key(1), chunk_of(layout, 1)) and not l1.contains(key(0))


def test_abort_publishes_nothing_and_frees_the_slot(layout: ChunkLayout) -> None:
    l1 = L1Cache(layout, layout.nbytes)
    slot = l1.reserve(key(0))
    l1.abort(slot)
    assert not l1.contains(key(0))
    assert put_chunk(l1, key(1), chunk_of(layout, 1))  # the only slot was handed back


def test_too_small_to_hold_a_chunk(layout: ChunkLayout) -> None:
    with pytest.raises(ValueError, match="cache.l1.size_gb"):
        L1Cache(layout, layout.nbytes - 1)


def test_threads_share_it(layout: ChunkLayout) -> None:
    """Writers and readers from several threads: every chunk read back is the one stored under its key."""
    l1 = L1Cache(layout, 4 * layout.nbytes)
    errors: list[str] = []

    def work(t: int) -> None:
        out = torch.empty(layout.shape, dtype=layout.kv.dtype)
        for i in range(30):
            k = t * 100 + i % 6
            put_chunk(l1, key(k), chunk_of(layout, k))
            if get_chunk(l1, key(k), out) and not torch.equal(out, chunk_of(layout, k)):
                errors.append(f"key {k}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_gather_scatter_pages(layout: ChunkLayout) -> None:
    """A chunk's pages from every layer of a KV tensor into a slot, and back into other pages."""
    kv = torch.randn((layout.kv.num_layers, 10, 2, 4, 2, 8)).to(layout.kv.dtype)
    l1 = L1Cache(layout, 2 * layout.nbytes)
    copier = ChunkCopier(kv)
    slot = l1.reserve(key(0))
    assert copier.gather([7, 3], l1.slot_view(slot)) is None
    l1.publish(slot)
    view = l1.slot_view(slot)
    assert torch.equal(view[:, 0], kv[:, 7]) and torch.equal(view[:, 1], kv[:, 3])
    before = kv.clone()
    copier.scatter_chunks([(view, [0, 9], "")])
    assert torch.equal(kv[:, 0], before[:, 7]) and torch.equal(kv[:, 9], before[:, 3])
    assert torch.equal(kv[:, 1:9], before[:, 1:9])  # nothing else written
