"""L2 loads with O_DIRECT (`cache.l2.direct_io`, xrt/kvstore/l2.py) through a real NIXL agent with the POSIX
backend. Which way each chunk file was opened is read back from the kernel: the fds the store hands to its
transfers are looked at with fcntl(F_GETFL) on their way in (a spy; the opens themselves are real)."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from kvstore_support import LAYOUT, chunk_of, key, put_chunk

from xrt.bench.tiers import stats_diff
from xrt.config import L2Args, L2Backend
from xrt.kvcache.device import KVLayout
from xrt.kvstore.chunk import ChunkLayout, checksum
from xrt.kvstore.l1 import ALIGN, L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.l2_files import O_DIRECT
from xrt.kvstore.stats import TierStats
from xrt.kvstore.writer import L2Writer

pytestmark = pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")

NS = "cd" * 32
ARGS = L2Args(path="", backend=L2Backend.POSIX, backend_params={}, size_gb=1.0)
# 8 tokens of 2 layers, 2 heads of 64, bfloat16: 8192 bytes a chunk, two 4096-byte blocks
ALIGNED = ChunkLayout(KVLayout(num_layers=2, page_size=4, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16), 8)
# 8 tokens of 3 layers, 1 head of 5, float32: 960 bytes a chunk, no multiple of any block size
ODD = ChunkLayout(KVLayout(num_layers=3, page_size=4, num_kv_heads=1, head_dim=5, dtype=torch.float32), 8)


def refuses_direct(directory: Path) -> bool:
    """Whether the filesystem under `directory` refuses O_DIRECT opens (EINVAL), asked with a file of its own."""
    probe = directory / "probe-o-direct"
    probe.write_bytes(b"\0" * ALIGN)
    try:
        os.close(os.open(probe, os.O_RDONLY | O_DIRECT))
        return False
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return True
    finally:
        probe.unlink()


def spy_opens(monkeypatch: pytest.MonkeyPatch, l2: L2Store) -> list[tuple[str, bool]]:
    """(role, opened with O_DIRECT) of every chunk file the store transfers from now on, per the kernel."""
    seen: list[tuple[str, bool]] = []
    real = l2._transfer

    def transfer(role: str, slots: Any, fds: Any, *args: Any, **kwargs: Any) -> None:
        seen.extend((role, bool(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT)) for fd in fds)
        return real(role, slots, fds, *args, **kwargs)

    monkeypatch.setattr(l2, "_transfer", transfer)
    return seen


def round_trip(l1: L1Cache, l2: L2Store, first: int = 0, n: int = 3) -> None:
    """Store n new chunks (keys first..), load them into other slots, and check each slot's bytes and crc32
    against the chunk."""
    ids = range(first, first + n)
    chunks = [chunk_of(l1.layout, i) for i in ids]
    items = []
    for i, chunk in zip(ids, chunks, strict=True):
        assert put_chunk(l1, key(i), chunk)
        slot, _ = l1.acquire(key(i))
        items.append((key(i), slot, None))
    try:
        assert l2.store(items) == [key(i) for i in ids]
    finally:
        for _, slot, _ in items:
            l1.release(slot)
    slots = [l1.reserve(key(i + 1000)) for i in ids]  # other L1 keys: what L2 holds is read
    try:
        got = l2.load([(key(i), s) for i, s in zip(ids, slots, strict=True)])
        want = [checksum(c.view(torch.uint8).reshape(-1)) for c in chunks]
        assert got.crcs == want
        for chunk, s in zip(chunks, slots, strict=True):
            assert torch.equal(l1.slot_view(s), chunk)
    finally:
        for s in slots:
            l1.abort(s)


def reads(seen: list[tuple[str, bool]]) -> list[bool]:
    return [direct for role, direct in seen if role != "WRITE"]


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    d = Path(tempfile.mkdtemp(prefix="xrt-l2-direct-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_l1_buffer_starts_on_a_block() -> None:
    """torch.empty's CPU memory is only 64-byte aligned; the L1 buffer is sliced onto ALIGN (l1.py)."""
    for layout, slots in [(LAYOUT, 3), (ALIGNED, 5), (ODD, 7), (ALIGNED, 1000)]:
        l1 = L1Cache(layout, slots * layout.nbytes)
        assert l1.buffer.data_ptr() % ALIGN == 0
        assert l1.buffer.dtype == torch.uint8 and l1.buffer.numel() == slots * layout.nbytes


def test_direct_reads_on_a_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) an aligned layout on a filesystem that takes O_DIRECT (ext4 /tmp here): every load's file is open
    with O_DIRECT, every store's is not, and the bytes and crc32s are the stored ones."""
    if refuses_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT")
    l1 = L1Cache(ALIGNED, 8 * ALIGNED.nbytes)
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    try:
        assert l2.direct
        seen = spy_opens(monkeypatch, l2)
        round_trip(l1, l2)
        assert reads(seen) == [True] * 3
        assert [direct for role, direct in seen if role == "WRITE"] == [False] * 3  # writes stay buffered
        assert l2.direct
        stats = TierStats()
        writer = L2Writer(l2, l1, stats)
        writer.close()
        assert stats.as_dict()["l2_direct_io"] == 1
        assert stats_diff(stats.as_dict(), stats.as_dict())["l2_direct_io"] == 1  # a state, not a count
    finally:
        l2.close()


def test_tmpfs_reads_whichever_way_it_takes(shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(b) /dev/shm (tmpfs): refuses O_DIRECT before Linux 6.6, so the store reads buffered from its start;
    takes it since (trivially: tmpfs has only the page cache). Either way the loads are correct and `direct`
    says what the kernel did."""
    refuses = refuses_direct(shm_dir)
    l1 = L1Cache(ALIGNED, 8 * ALIGNED.nbytes)
    l2 = L2Store(ARGS, shm_dir, NS, l1)
    try:
        assert l2.direct is not refuses
        seen = spy_opens(monkeypatch, l2)
        round_trip(l1, l2)
        assert reads(seen) == [not refuses] * 3
    finally:
        l2.close()


def refuse_direct(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """os.open answers EINVAL to O_DIRECT, as tmpfs before Linux 6.6 does (this machine's kernel may take it
    everywhere). Returns the refusals."""
    refused: list[int] = []
    real = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & O_DIRECT:
            refused.append(flags)
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    return refused


@pytest.mark.parametrize("when", ["start-up", "first load"])
def test_refused_o_direct_falls_back_to_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], when: str) -> None:
    """(b, simulated) a filesystem refusing O_DIRECT, found at start-up or (the start-up probe passed) at the
    first load: that load and every later one read buffered, and correctly; logged once, naming the directory."""
    l1 = L1Cache(ALIGNED, 8 * ALIGNED.nbytes)
    if when == "start-up":
        refused = refuse_direct(monkeypatch)
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    try:
        if when == "first load":
            assert l2.direct  # /tmp took O_DIRECT at start-up
            refused = refuse_direct(monkeypatch)
        else:
            assert not l2.direct
        seen = spy_opens(monkeypatch, l2)
        round_trip(l1, l2)
        round_trip(l1, l2, first=10)
        assert not l2.direct and reads(seen) == [False] * 6
        assert len(refused) == 1
        lines = [ln for ln in capsys.readouterr().err.splitlines() if "does not support O_DIRECT" in ln]
        assert len(lines) == 1 and str(l2.dir) in lines[0]
    finally:
        l2.close()


def test_unaligned_chunks_read_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """(c) a chunk of 960 bytes: O_DIRECT would fail its reads, so the store reads buffered (and says why)."""
    l1 = L1Cache(ODD, 8 * ODD.nbytes)
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    try:
        assert not l2.direct
        assert "a chunk is 960 bytes, not a multiple of 4096" in capsys.readouterr().err
        seen = spy_opens(monkeypatch, l2)
        round_trip(l1, l2)
        assert reads(seen) == [False] * 3
    finally:
        l2.close()


def test_direct_io_off_reads_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(d) cache.l2.direct_io=false: buffered reads of an aligned layout on a disk that takes O_DIRECT."""
    l1 = L1Cache(ALIGNED, 8 * ALIGNED.nbytes)
    l2 = L2Store(attrs.evolve(ARGS, direct_io=False), tmp_path, NS, l1)
    try:
        assert not l2.direct
        seen = spy_opens(monkeypatch, l2)
        round_trip(l1, l2)
        assert reads(seen) == [False] * 3
        stats = TierStats()
        L2Writer(l2, l1, stats).close()
        assert stats.as_dict()["l2_direct_io"] == 0
    finally:
        l2.close()
