"""A worker rank's tiers (xrt/kvstore/shard.py) on their own, on CPU: stored pages come back into other pages
from L1, then (a new shard on the same directory) from L2; a load stops at the first chunk it cannot supply;
its keys and directory are its own rank's."""

from __future__ import annotations

from pathlib import Path

import torch

from xrt import load_config
from xrt.config import XrtConfig
from xrt.kvcache.device import DeviceKVCache, KVLayout
from xrt.kvstore.shard import KVShard, rank_key

KV = KVLayout(num_layers=2, page_size=4, num_kv_heads=1, head_dim=8, dtype=torch.float32)
PPC = 2  # chunk_tokens=8: two pages a chunk


def config(path: Path) -> XrtConfig:
    return load_config(["cache=l1_l2", "cache.chunk_tokens=8", "cache.page_size=4", "cache.l1.size_gb=0.0001",
                        f"cache.l2.path={path}", "cache.l2.load_policy=always"])


def shard(path: Path, rank: int = 1) -> KVShard:
    cache = DeviceKVCache([], KV, 32, torch.device("cpu"))
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(rank)))
    return KVShard(config(path), cache, None, rank, 2)


def pages_of(s: KVShard, pages: list[int]) -> torch.Tensor:
    """The pages as this rank's next forward pass reads them: it takes the KV cache's arrivals first, which starts
    the loads deferred to it (on CPU, done when started)."""
    s.agent.arrivals.take()
    return s.agent.copier.kv[:, pages].clone()


def test_stored_chunks_come_back_from_l1_then_l2(tmp_path: Path) -> None:
    s = shard(tmp_path)
    keys = [bytes([i + 1]) * 32 for i in range(3)]
    src = [[0, 1], [2, 3], [4, 5]]
    want = [pages_of(s, p) for p in src]
    s.store(list(zip(keys, src, strict=True)))
    assert all(s.l1.contains(s._key(k)) for k in keys) and not s.l1.contains(s._key(bytes(32)))
    dst = [[10, 11], [12, 13], [14, 15]]
    # the middle chunk is unknown: the load stops before it, the third chunk is not scattered
    before = s.agent.copier.kv[:, dst[0]].clone()
    assert s.load([(keys[0], dst[0], 0), (bytes(32), dst[1], 0), (keys[2], dst[2], 0)]) == 1
    # the copy up waits for the next forward pass (which queues its own uploads first), then lands whole
    assert s.agent.arrivals.pending() and torch.equal(s.agent.copier.kv[:, dst[0]], before)
    torch.testing.assert_close(pages_of(s, dst[0]), want[0])
    assert not torch.equal(pages_of(s, dst[2]), want[2])
    s.flush()
    assert len(list(s.l2.dir.glob("*.kv"))) == 3
    s.close()

    again = shard(tmp_path)  # an empty L1: the chunks come from this rank's L2 directory
    assert again.l2.holds([again._key(k) for k in keys]) == [True] * 3
    assert again.l1.contains(again._key(keys[0])) is False
    skip = 1  # the first page is the GPU hit's: left as it is
    before = pages_of(again, [20])
    assert again.load([(k, [20 + 2 * i, 21 + 2 * i], skip if i == 0 else 0) for i, k in enumerate(keys)]) == 3
    torch.testing.assert_close(pages_of(again, [20]), before)
    torch.testing.assert_close(pages_of(again, [21]), want[0][:, 1:])
    torch.testing.assert_close(pages_of(again, [22, 23, 24, 25]), torch.cat(want[1:], dim=1))
    again.close()


def test_each_rank_has_its_own_keys_and_directory(tmp_path: Path) -> None:
    one, two = shard(tmp_path, 1), shard(tmp_path, 0)
    key = bytes(range(32))
    assert rank_key(one.digest, key) != rank_key(two.digest, key) != key
    assert one.l2.dir != two.l2.dir and one.l2.dir.parent == two.l2.dir.parent == tmp_path
    one.close()
    two.close()


def test_a_read_past_rank_0s_deadline_stops_the_load_and_frees_its_slots_after(tmp_path: Path) -> None:
    """A worker's L2 read batch still running at the deadline rank 0 sent (KV_LOAD): the load stops there (0
    chunks, rank 0 then agrees on none and recomputes), the next one does not queue behind it, and the late
    batch's L1 slots are aborted once its transfer ends, not before (it still writes them)."""
    s = shard(tmp_path)
    keys = [bytes([i + 1]) * 32 for i in range(3)]
    s.store(list(zip(keys, [[0, 1], [2, 3], [4, 5]], strict=True)))
    s.flush()
    s.close()
    again = shard(tmp_path)  # an empty L1: the chunks must come from L2
    assert again.l2 is not None
    agent = again.l2._agents["READ"]
    real_state = agent.agent.check_xfer_state
    stalled = True
    agent.agent.check_xfer_state = lambda h: "PROC" if stalled else real_state(h)
    load = [(k, [10 + 2 * i, 11 + 2 * i], 0) for i, k in enumerate(keys)]
    assert again.load(load, deadline_s=0.05) == 0
    assert again.stats.failed_loads == 1 and again.l2.late_transfers == 1
    assert any(again.l1._writing)  # the late batch's slots: still being written by the transfer
    assert again.load(load, deadline_s=0.05) == 0  # the read agent is busy with the late one: no waiting
    stalled = False
    assert agent.lock.acquire(timeout=10)  # the late transfer ended: its thread aborted the slots and let go
    agent.lock.release()
    assert not again.l1._writing and not any(again.l1._refs)
    assert again.load(load, deadline_s=10.0) == 3  # and the chunks load once the disk answers
    again.close()


def test_a_prefetch_reads_this_ranks_l2_and_the_load_takes_it(tmp_path: Path) -> None:
    """KV_PREFETCH: the leading run of chunks this rank's L2 holds (not those already in its L1) is read into L1
    in the background; a load takes them from there, waiting for a read still in flight (rank 0's deadline)."""
    import threading
    import time

    s = shard(tmp_path)
    keys = [bytes([i + 1]) * 32 for i in range(3)]
    src = [[0, 1], [2, 3], [4, 5]]
    want = [pages_of(s, p) for p in src]
    s.store(list(zip(keys, src, strict=True)))
    s.flush()
    s.close()
    load = [(k, [10 + 2 * i, 11 + 2 * i], 0) for i, k in enumerate(keys)]

    done = shard(tmp_path)  # the prefetch ends before the load: the chunks are L1's
    assert done.agent.prefetcher is not None
    done.prefetch([*keys, bytes(32)])  # the unknown fourth chunk ends the run
    done.agent.prefetcher.flush()
    assert done.stats.prefetched_chunks == 3 and all(done.l1.contains(done._key(k)) for k in keys)
    assert done.load(load) == 3
    torch.testing.assert_close(pages_of(done, list(range(10, 16))), torch.cat(want, dim=1))
    done.prefetch(keys)  # all in L1 now: nothing to read
    done.flush()
    assert done.stats.prefetched_chunks == 3 and done.counters()[-1] == 3
    done.close()

    flying = shard(tmp_path)  # the prefetch's read is still running when the load comes: it waits for it
    assert flying.l2 is not None
    agent = flying.l2._agents["PREFETCH"]
    real_state = agent.agent.check_xfer_state
    stalled = threading.Event()
    stalled.set()
    agent.agent.check_xfer_state = lambda h: "PROC" if stalled.is_set() else real_state(h)
    flying.prefetch(keys)
    deadline = time.monotonic() + 10
    while len(flying.l1._writing) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)  # the prefetch thread reserved its slots
    threading.Timer(0.2, stalled.clear).start()
    assert flying.load(load, deadline_s=10.0) == 3
    assert flying.stats.prefetched_chunks == 3 and flying.stats.failed_loads == 0
    torch.testing.assert_close(pages_of(flying, list(range(10, 16))), torch.cat(want, dim=1))
    flying.close()
