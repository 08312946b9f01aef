"""L2 (xrt/kvstore/l2.py) through a real NIXL agent with the POSIX backend, on files in a temp directory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs
import pytest
import torch
from kvstore_support import LAYOUT, chunk_of, key, put_chunk

from xrt.config import L2Args, L2Backend
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.index import INDEX
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.l2_files import l2_dir

NS = "ab" * 32
ARGS = L2Args(path="", backend=L2Backend.POSIX, backend_params={}, size_gb=1.0)


@pytest.fixture
def layout() -> ChunkLayout:
    """(a fixture, not a conftest.py: tests/ has one conftest module name, taken by tests/conftest.py)"""
    return LAYOUT


def fill(l1: L1Cache, keys: list[int]) -> list[tuple[bytes, int, int]]:
    """Put chunks into L1 and return them as store items, (key, slot, crc), the slots referenced."""
    items = []
    for i in keys:
        put_chunk(l1, key(i), chunk_of(l1.layout, i))
        items.append((key(i), *l1.acquire(key(i))))
    return items


def load_into(l1: L1Cache, l2: L2Store, keys: list[int]) -> list[torch.Tensor | None]:
    """Load keys from L2 into fresh L1 slots and return each chunk (None on a miss)."""
    slots = [l1.reserve(key(i + 10_000)) for i in keys]  # other L1 keys: L2 is what is tested
    ok = l2.load([(key(i), s) for i, s in zip(keys, slots, strict=True)]).crcs
    out: list[torch.Tensor | None] = []
    for good, s in zip(ok, slots, strict=True):
        out.append(l1.slot_view(s).clone() if good is not None else None)
        l1.abort(s)
    return out


@pytest.fixture
def l1(layout: ChunkLayout) -> L1Cache:
    return L1Cache(layout, 8 * layout.nbytes)


def test_store_load_round_trip(tmp_path: Path, l1: L1Cache) -> None:
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    items = fill(l1, [0, 1, 2])
    assert l2.store(items) == [key(0), key(1), key(2)]
    assert all(l2.contains(key(i)) for i in range(3)) and not l2.contains(key(3))
    files = sorted(p.name for p in l2_dir(tmp_path, NS).glob("*.kv"))
    assert len(files) == 3 and all(os.path.getsize(l2_dir(tmp_path, NS) / f) == LAYOUT.nbytes for f in files)
    got = load_into(l1, l2, [2, 0, 3])
    assert torch.equal(got[0], chunk_of(LAYOUT, 2)) and torch.equal(got[1], chunk_of(LAYOUT, 0))
    assert got[2] is None
    assert not list(l2_dir(tmp_path, NS).glob(".*.tmp"))


def test_store_again_is_a_no_op(tmp_path: Path, l1: L1Cache) -> None:
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    items = fill(l1, [0])
    assert l2.store(items) == [key(0)]
    before = {p.name: p.stat().st_mtime_ns for p in l2_dir(tmp_path, NS).glob("*.kv")}
    assert l2.store(items) == []
    assert {p.name: p.stat().st_mtime_ns for p in l2_dir(tmp_path, NS).glob("*.kv")} == before


def test_lookups_and_loads_never_wait_for_an_index_write(tmp_path: Path, l1: L1Cache,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store's index write that waits on the disk (behind chunk data being written back) holds the index lock;
    a lookup or a load on the scheduler's thread reads the entries listed before it instead of waiting."""
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    assert l2.store(fill(l1, [0])) == [key(0)]
    assert l2.index is not None
    write, entered, disk = l2.index._write, threading.Event(), threading.Event()

    def slow_write(entries):  # type: ignore[no-untyped-def]
        entered.set()
        assert disk.wait(30)
        write(entries)

    monkeypatch.setattr(l2.index, "_write", slow_write)
    storing = threading.Thread(target=l2.store, args=(fill(l1, [1]),))
    storing.start()
    try:
        assert entered.wait(30)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.extend([l2.holds([key(0), key(1)]), load_into(l1, l2, [0])]))
        reader.start()
        reader.join(20)
        assert not reader.is_alive(), "the lookup waited for the store's index write"
        assert got[0] == [True, False]  # key 1 is not listed until its write is done
        assert torch.equal(got[1][0], chunk_of(LAYOUT, 0))
    finally:
        disk.set()
        storing.join(30)
    assert l2.holds([key(0), key(1)]) == [True, True]


def test_flipped_bytes_are_a_miss_and_dropped(tmp_path: Path, l1: L1Cache) -> None:
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    l2.store(fill(l1, [0, 1]))
    f = next(p for p in l2_dir(tmp_path, NS).glob("*.kv") if p.name.startswith(key(0).hex()))
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))
    got = load_into(l1, l2, [0, 1])
    assert got[0] is None and torch.equal(got[1], chunk_of(LAYOUT, 1))
    assert not l2.contains(key(0)) and not f.exists() and l2.corrupt == 1
    assert L2Store(ARGS, tmp_path, NS, l1).contains(key(0)) is False  # gone from the index on disk too


def test_unwritable_path_stores_nothing(tmp_path: Path, l1: L1Cache) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    l2 = L2Store(ARGS, blocker, NS, l1)  # the directory cannot be made (as root too: a file is in the way)
    assert l2.error and l2.store(fill(l1, [0])) == [] and not l2.contains(key(0))
    assert load_into(l1, l2, [0]) == [None]


def test_failed_store_publishes_nothing(tmp_path: Path, l1: L1Cache) -> None:
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    assert l2.store(fill(l1, [0])) == [key(0)]
    d = l2_dir(tmp_path, NS)
    index = (d / INDEX).read_text()
    for p in d.iterdir():  # the directory turns into a file under the store: every open fails
        p.unlink()
    d.rmdir()
    d.write_text("")
    assert l2.store(fill(l1, [1, 2])) == []
    assert not l2.contains(key(1)) and not l2.contains(key(2))
    d.unlink()
    d.mkdir()
    (d / INDEX).write_text(index)
    assert l2.store(fill(l1, [1])) == [key(1)]  # works again once it can write


def test_eviction_under_a_tiny_limit(tmp_path: Path, l1: L1Cache) -> None:
    tiny = attrs.evolve(ARGS, size_gb=2.5 * LAYOUT.nbytes / 1e9)  # room for 2 chunks
    l2 = L2Store(tiny, tmp_path, NS, l1)
    l2.store(fill(l1, [0]))
    l2.store(fill(l1, [1]))
    assert load_into(l1, l2, [0])[0] is not None  # 0 used after 1: 1 is the least recently used
    l2.store(fill(l1, [2]))
    assert [l2.contains(key(i)) for i in range(3)] == [True, False, True]
    assert len(list(l2_dir(tmp_path, NS).glob("*.kv"))) == 2


def test_restart_finds_entries(tmp_path: Path, l1: L1Cache) -> None:
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    l2.store(fill(l1, [0, 1]))
    l2.close()
    again = L2Store(ARGS, tmp_path, NS, L1Cache(LAYOUT, 4 * LAYOUT.nbytes))
    assert torch.equal(load_into(again.l1, again, [1])[0], chunk_of(LAYOUT, 1))
    (l2_dir(tmp_path, NS) / INDEX).unlink()  # a lost index is rebuilt from the file names
    rebuilt = L2Store(ARGS, tmp_path, NS, again.l1)
    assert rebuilt.contains(key(0)) and torch.equal(load_into(again.l1, rebuilt, [0])[0], chunk_of(LAYOUT, 0))


def test_clear_removes_only_this_namespace(tmp_path: Path, l1: L1Cache) -> None:
    ours, theirs = L2Store(ARGS, tmp_path, NS, l1), L2Store(ARGS, tmp_path, "cd" * 32, l1)
    items = fill(l1, [0])
    ours.store(items)
    theirs.store(items)
    ours.clear()
    assert not ours.contains(key(0)) and theirs.contains(key(0))
    assert not list(l2_dir(tmp_path, NS).glob("*.kv")) and list(l2_dir(tmp_path, "cd" * 32).glob("*.kv"))


WRITER = """
import os, sys, time
from kvstore_support import LAYOUT, chunk_of, get_chunk, key, put_chunk
from xrt.config import L2Args
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
root, first, n, ns, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
l1 = L1Cache(LAYOUT, 4 * LAYOUT.nbytes)
l2 = L2Store(L2Args(), root, ns, l1)
open(f"{go}.ready{first}", "w").close()
while not os.path.exists(go):  # both start storing at once: their index updates interleave
    time.sleep(0.001)
for i in range(first, first + n):
    items = []
    for j in (i, 0):  # key 0 is stored by both processes
        put_chunk(l1, key(j), chunk_of(LAYOUT, j))
        items.append((key(j), *l1.acquire(key(j))))
    l2.store(items)
    for k, s, _ in items:
        l1.release(s)
"""


def test_two_processes_share_a_directory(tmp_path: Path, l1: L1Cache) -> None:
    """Both store one chunk per transfer, at the same time, into one directory: every chunk of both is listed
    and reads back intact (without the index lock this loses entries)."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(first), "60", NS, str(go)],
                              env=env) for first in (1, 101)]
    while not all((tmp_path / f"go.ready{first}").exists() for first in (1, 101)):
        assert all(p.poll() is None for p in procs), "a writer died"
        time.sleep(0.01)
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    keys = [0, *range(1, 61), *range(101, 161)]
    l2 = L2Store(ARGS, tmp_path, NS, l1)
    assert sorted(l2.index.entries) == sorted(key(i).hex() for i in keys)
    for start in range(0, len(keys), 4):
        batch = keys[start : start + 4]
        for i, chunk in zip(batch, load_into(l1, l2, batch), strict=True):
            assert chunk is not None and torch.equal(chunk, chunk_of(LAYOUT, i)), i
    assert not list(l2_dir(tmp_path, NS).glob(".*.tmp"))


def test_stale_temp_files_are_removed(tmp_path: Path, l1: L1Cache) -> None:
    """A store killed mid-write leaves a temp file; the next store on the directory removes it, unless its
    process still runs (it may be writing now)."""
    d = l2_dir(tmp_path, NS)
    L2Store(ARGS, tmp_path, NS, l1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = d / f".{key(0).hex()}.{dead.stdout.strip()}-abcd1234.tmp"
    live = d / f".{key(1).hex()}.{os.getpid()}-abcd1234.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    L2Store(ARGS, tmp_path, NS, l1)
    assert not stale.exists() and live.exists()
