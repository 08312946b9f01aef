"""The L2 -> L1 prefetch thread (xrt/kvstore/prefetch.py) on a real NIXL POSIX agent: chunks arrive in L1
verified, a bad chunk ends the job, a job never takes more than half of L1, and a reader can wait for a
chunk being written."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from kvstore_support import LAYOUT, chunk_of, get_chunk, key, put_chunk

from xrt.config import L2Args
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.prefetch import Prefetcher
from xrt.kvstore.stats import TierStats

NS = "cd" * 32


def stored(tmp_path: Path, n: int) -> None:
    """n chunks in L2 under tmp_path, written through a store of their own (its L1 then dropped)."""
    l1 = L1Cache(LAYOUT, n * LAYOUT.nbytes)
    l2 = L2Store(L2Args(size_gb=1.0), tmp_path, NS, l1)
    items = []
    for i in range(n):
        put_chunk(l1, key(i), chunk_of(LAYOUT, i))
        items.append((key(i), *l1.acquire(key(i))))
    assert len(l2.store(items)) == n
    l2.close()


def prefetcher(tmp_path: Path, slots: int) -> tuple[Prefetcher, L1Cache, TierStats]:
    l1 = L1Cache(LAYOUT, slots * LAYOUT.nbytes)
    stats = TierStats()
    return Prefetcher(l1, L2Store(L2Args(size_gb=1.0), tmp_path, NS, l1), stats, load_batch=2), l1, stats


def test_prefetched_chunks_are_in_l1_verified(tmp_path: Path) -> None:
    stored(tmp_path, 5)
    pf, l1, stats = prefetcher(tmp_path, 16)
    assert pf.submit([key(i) for i in range(5)])
    pf.flush()
    out = torch.empty(LAYOUT.shape, dtype=LAYOUT.kv.dtype)
    for i in range(5):
        assert get_chunk(l1, key(i), out) and torch.equal(out, chunk_of(LAYOUT, i))
    assert stats.prefetched_chunks == 5 and stats.prefetch_bytes == 5 * LAYOUT.nbytes and stats.prefetch_s > 0
    assert pf.take_loaded(key(0)) and not pf.take_loaded(key(0))  # claimed once
    assert not pf.take_loaded(key(99))
    pf.close()


def test_a_bad_chunk_ends_the_job(tmp_path: Path) -> None:
    stored(tmp_path, 4)
    (f,) = [p for p in tmp_path.glob("xrt-kv-*/*.kv") if p.name.startswith(key(1).hex())]
    data = bytearray(f.read_bytes())
    data[7] ^= 0xFF
    f.write_bytes(bytes(data))
    pf, l1, stats = prefetcher(tmp_path, 16)
    pf.submit([key(i) for i in range(4)])
    pf.flush()
    # batch 1 = chunks 0, 1: 0 loads, 1 fails its checksum; chunks 2, 3 (after the gap) are not read
    assert l1.contains(key(0)) and not any(l1.contains(key(i)) for i in (1, 2, 3))
    assert stats.prefetched_chunks == 1 and pf.l2.corrupt == 1 and not l1._writing and not any(l1._refs)
    assert not f.exists()  # the bad file is dropped
    pf.close()


def test_a_job_takes_at_most_half_of_l1(tmp_path: Path) -> None:
    stored(tmp_path, 6)
    pf, l1, stats = prefetcher(tmp_path, 4)
    pf.submit([key(i) for i in range(6)])
    pf.flush()
    assert stats.prefetched_chunks == 2 and l1.contains(key(0)) and l1.contains(key(1)) and len(l1) == 2
    pf.close()


def test_acquire_waits_for_a_write_in_flight() -> None:
    l1 = L1Cache(LAYOUT, 2 * LAYOUT.nbytes)
    slot = l1.reserve(key(0))
    assert slot is not None and l1.writing(key(0)) and l1.acquire(key(0)) is None
    assert l1.acquire_when_written(key(0), 0.01) is None  # still being written: not there in time

    def finish() -> None:
        l1.slot_view(slot).copy_(chunk_of(LAYOUT, 0))
        l1.publish(slot)

    t = threading.Timer(0.05, finish)
    t.start()
    got = l1.acquire_when_written(key(0), 10.0)
    t.join()
    assert got is not None and got[0] == slot and not l1.writing(key(0))
    l1.release(slot)
    aborted = l1.reserve(key(1))
    assert aborted is not None
    threading.Timer(0.05, lambda: l1.abort(aborted)).start()
    assert l1.acquire_when_written(key(1), 10.0) is None  # the write failed: a miss, at once
