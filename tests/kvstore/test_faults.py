"""Faults under the KV tiers at engine level, through a real NIXL POSIX agent: failed transfers, an L2 path that
cannot be written, a full disk, tiers too small for the working set, a process killed while it stores. Every
request completes with cache=gpu's greedy output, nothing half written is ever published, and the directory is
consistent for the next engine."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kvstore_support import (
    CHUNK,
    ENGINE_LAYOUT,
    assert_l1_idle,
    break_transfers,
    check_l2_dir,
    child_result,
    computed_keys,
    file_ids,
    generate_each,
    kill_left,
    namespace_dir,
    reference,
    settle,
    spawn_child,
    tail,
    temp_files,
    tier_cache,
    tiers_of,
    tokens,
)

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import GPU, L1, L2
from xrt.kvstore.index import INDEX, L2Index, parse_data_name
from xrt.kvstore.keys import chunk_keys

ZERO = {GPU: 0, L1: 0, L2: 0}


def l2_engine(make_cfg: Callable[..., XrtConfig], path: Path, **sizes: int) -> LLM:
    return LLM(make_cfg(cache=tier_cache(KVTiers.L1_L2, path, **sizes)))


# ---------------------------------------------------------------- (a) failed transfers


@pytest.mark.parametrize("how", ["err", "raise"])
def test_failed_l2_load_is_recomputed(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    rng = random.Random(11)
    shared = tokens(rng, 4 * CHUNK + 2)
    first, second, third = (shared + tail(rng, j, 6) for j in range(3))
    want = reference(diverse_cfg, [first, second, third])
    a = l2_engine(diverse_cfg, tmp_path)
    assert generate_each(a, [first]) == want[:1]
    settle(tiers_of(a), close=True)
    d = namespace_dir(tmp_path)
    entries = check_l2_dir(d)
    files = file_ids(d)
    assert len(entries) == 4

    b = l2_engine(diverse_cfg, tmp_path)
    tiers = tiers_of(b)
    calls = break_transfers(monkeypatch, tiers.l2, "load", how)
    assert generate_each(b, [second]) == want[1:2]
    assert len(calls) == 1  # the 4 chunks were asked for, in one transfer, which failed
    assert tiers.stats.hit_tokens == ZERO and tiers.stats.failed_loads == 1
    assert b.engine.num_prefill_tokens == len(second)  # every token recomputed
    settle(tiers, close=True)
    assert_l1_idle(tiers.l1)
    # a failed transfer is not a bad chunk: nothing dropped, so the recomputed chunks had nothing to re-store
    assert tiers.stats.stored_l1 == 4 and tiers.stats.stored_l2 == 0
    assert check_l2_dir(d) == entries and file_ids(d) == files

    monkeypatch.undo()
    c = l2_engine(diverse_cfg, tmp_path)
    assert generate_each(c, [third]) == want[2:]
    assert tiers_of(c).stats.hit_tokens == {GPU: 0, L1: 0, L2: 4 * CHUNK}


@pytest.mark.parametrize("how", ["err", "raise"])
def test_failed_l2_store_publishes_nothing(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    rng = random.Random(12)
    shared = tokens(rng, 3 * CHUNK)
    prompts = [shared + tail(rng, j, 4 + 9 * j) for j in range(3)]
    later = tokens(rng, 2 * CHUNK + 5)  # shares nothing with the others
    want = reference(diverse_cfg, [*prompts, later])
    llm = l2_engine(diverse_cfg, tmp_path)
    tiers = tiers_of(llm)
    calls = break_transfers(monkeypatch, tiers.l2, "store", how)
    assert generate_each(llm, prompts) == want[:3]
    settle(tiers)
    d = namespace_dir(tmp_path)
    chunks = computed_keys([p + o for p, o in zip(prompts, want[:3], strict=True)], tiers.namespace)
    assert calls and tiers.stats.stored_l1 == len(chunks) and tiers.stats.dropped_l2 == 0
    assert tiers.stats.stored_l2 == 0 and check_l2_dir(d) == {}  # no data file, no entry, no temp file

    monkeypatch.undo()  # the writer survived the failures: the next chunks land
    assert generate_each(llm, [later]) == want[3:]
    settle(tiers, close=True)
    assert_l1_idle(tiers.l1)
    assert set(check_l2_dir(d)) == computed_keys([later + want[3]], tiers.namespace)


# ---------------------------------------------------------------- (b) an L2 path that cannot be written


@pytest.mark.parametrize("where", ["under-a-file", "read-only-dir"])
def test_unwritable_l2_path(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, where: str) -> None:
    if where == "under-a-file":
        blocker = tmp_path / "afile"
        blocker.write_text("not a directory")
        path = blocker / "sub"  # cannot be made, as root too
    else:
        path = tmp_path / "ro"
        path.mkdir()
        path.chmod(0o500)
        if os.access(path, os.W_OK):
            path.chmod(0o700)
            pytest.skip("this user (root) writes into a 0o500 directory; under-a-file covers it")
    rng = random.Random(13)
    shared = tokens(rng, 3 * CHUNK + 1)
    first, second = shared + tail(rng, 0, 5), shared + tail(rng, 1, 8)
    want = reference(diverse_cfg, [first, second])
    try:
        llm = l2_engine(diverse_cfg, path)
        tiers = tiers_of(llm)
        assert tiers.l2 is not None and tiers.l2.error
        assert generate_each(llm, [first]) == want[:1]
        llm.engine.scheduler.kv.evict()
        assert generate_each(llm, [second]) == want[1:]
        settle(tiers, close=True)
        # L1 still serves; L2 stored nothing and failed nothing
        assert tiers.stats.hit_tokens == {GPU: 0, L1: 3 * CHUNK, L2: 0}
        assert tiers.stats.stored_l2 == 0 and tiers.stats.failed_loads == 0
        assert_l1_idle(tiers.l1)
    finally:
        if where == "read-only-dir":
            path.chmod(0o700)
    if where == "under-a-file":
        assert blocker.read_text() == "not a directory" and sorted(os.listdir(tmp_path)) == ["afile"]
    else:
        assert os.listdir(path) == []


# ---------------------------------------------------------------- (c) a full disk


def test_full_disk_publishes_nothing(
    diverse_cfg: Callable[..., XrtConfig], tiny_checkpoint_diverse: str, tmp_path: Path
) -> None:
    """The child stores its first two prompts under RLIMIT_FSIZE of half a chunk (every chunk write fails with
    EFBIG), then the third without the limit."""
    rng = random.Random(14)
    shared = tokens(rng, 3 * CHUNK + 2)
    prompts = [shared + tail(rng, 0, 6), shared + tail(rng, 1, 20), tokens(rng, 2 * CHUNK + 3)]
    spec = {
        "checkpoint": tiny_checkpoint_diverse,
        "l2_path": str(tmp_path / "l2"),
        "prompts": prompts,
        "out": str(tmp_path / "out.json"),
        "fsize": {"limit": ENGINE_LAYOUT.nbytes // 2, "prompts": 2},
    }
    proc = spawn_child(spec, tmp_path / "spec.json")
    try:
        want = reference(diverse_cfg, prompts)  # while the child starts
        got = child_result(proc, spec)
    finally:
        kill_left([proc])
    assert got["outputs"] == want
    d = namespace_dir(tmp_path / "l2")
    ns = tiers_of(LLM(diverse_cfg(cache=tier_cache(KVTiers.L1, tmp_path)))).namespace
    # nothing of the first two prompts; the third's chunks once the disk had room again
    assert set(check_l2_dir(d)) == computed_keys([prompts[2] + want[2]], ns)
    stats = got["stats"]
    every = computed_keys([p + o for p, o in zip(prompts, want, strict=True)], ns)
    assert stats["stored_l1"] == len(every) and stats["stored_l2"] == 2 and stats["dropped_l2"] == 0


def test_full_disk_at_the_index_write_publishes_nothing(
    diverse_cfg: Callable[..., XrtConfig], tiny_checkpoint_diverse: str, tmp_path: Path
) -> None:
    """The disk fills up between a batch's data files and the index: the limit is above a chunk file but below
    the index (already ~140 entries), so the chunk writes succeed and the index write fails. The failed store must
    still publish nothing: no data file the index does not list, no temp file left."""
    rng = random.Random(18)
    filler = [tokens(rng, 17 * CHUNK + 1) for _ in range(8)]  # 8 x 17 chunks in L2 first
    prompts = [tokens(rng, 2 * CHUNK + 3), tokens(rng, 3 * CHUNK + 1)]
    a = l2_engine(diverse_cfg, tmp_path)
    generate_each(a, filler)
    settle(tiers_of(a), close=True)
    d = namespace_dir(tmp_path)
    before = check_l2_dir(d)
    index_bytes = (d / INDEX).stat().st_size
    assert len(before) >= 8 * 17 and index_bytes > ENGINE_LAYOUT.nbytes + 1000
    spec = {
        "checkpoint": tiny_checkpoint_diverse,
        "l2_path": str(tmp_path),
        "prompts": prompts,
        "out": str(tmp_path / "out.json"),
        "fsize": {"limit": index_bytes - 500, "prompts": len(prompts)},
    }
    proc = spawn_child(spec, tmp_path / "spec.json")
    try:
        want = reference(diverse_cfg, prompts)  # while the child starts
        got = child_result(proc, spec)
    finally:
        kill_left([proc])
    assert got["outputs"] == want and got["stats"]["stored_l2"] == 0
    files = {p[0] for p in map(parse_data_name, os.listdir(d)) if p is not None}
    assert files == set(before), sorted(files - set(before))  # nothing of the failed stores on disk
    assert temp_files(d) == []
    assert check_l2_dir(d) == before


# ---------------------------------------------------------------- (d) tiers smaller than the working set


def test_tiny_tiers_evict_and_stay_correct(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L1 of 2 chunks and L2 of 3 under prompts sharing three prefixes (1, 2 and 3 chunks) in turn, the GPU
    prefix cache forgotten before each: both tiers evict, both serve hits, the outputs stay cache=gpu's and the
    L2 directory never holds more than 3 chunks once an index update is done."""
    rng = random.Random(15)
    prefixes = [tokens(rng, CHUNK + 1), tokens(rng, 2 * CHUNK + 3), tokens(rng, 3 * CHUNK)]
    order = [0, 1, 0, 2, 1, 0, 2, 2, 0, 1, 1, 2, 0]
    prompts = [prefixes[i] + tail(rng, j, 2 + j % 3) for j, i in enumerate(order)]
    want = reference(diverse_cfg, prompts)

    files_after_update: list[int] = []
    update = L2Index.update

    def counting_update(self: L2Index, *args: Any, **kwargs: Any) -> list[str]:
        evicted = update(self, *args, **kwargs)
        files_after_update.append(len(list(self.dir.glob("*.kv"))))
        return evicted

    monkeypatch.setattr(L2Index, "update", counting_update)
    llm = l2_engine(diverse_cfg, tmp_path, l1_chunks=2, l2_chunks=3)
    tiers = tiers_of(llm)
    assert tiers.l1.num_slots == 2 and tiers.l2 is not None and tiers.l2.limit == 3
    d = namespace_dir(tmp_path)
    got = []
    for p in prompts:
        llm.engine.scheduler.kv.evict()
        got += generate_each(llm, [p])
        settle(tiers)
        assert len(check_l2_dir(d)) <= 3
    assert got == want
    settle(tiers, close=True)
    assert_l1_idle(tiers.l1)
    s = tiers.stats
    assert files_after_update and max(files_after_update) <= 3
    assert tiers.l1.evictions > 0 and s.stored_l2 > 3  # both tiers had to evict
    assert s.hit_tokens[GPU] == 0 and s.hit_tokens[L1] > 0 and s.hit_tokens[L2] > 0, s


def test_tiny_l1_under_a_stalled_writer(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """L1 of 2 chunks while the L2 writer is stuck in a transfer (its agent's lock held here): the two chunks
    queued for L2 hold their slots, so later chunks find L1 full and stay GPU-only rather than overwrite
    them; once the writer resumes, exactly those two chunks land in L2, with their own bytes."""
    rng = random.Random(17)
    first = tokens(rng, 2 * CHUNK + 3)  # 40 tokens computed: 2 chunks
    others = [tokens(rng, 3 * CHUNK + 1 + j) for j in range(3)]
    again = [
        first[: 2 * CHUNK] + tail(rng, 0, 4),
        *(o[: 3 * CHUNK] + tail(rng, j + 1, 3) for j, o in enumerate(others)),
    ]
    want = reference(diverse_cfg, [first, *others, *again])
    llm = l2_engine(diverse_cfg, tmp_path, l1_chunks=2)
    tiers = tiers_of(llm)
    assert tiers.l2 is not None and tiers.l1.num_slots == 2
    with tiers.l2._agents["WRITE"].lock:
        assert generate_each(llm, [first, *others]) == want[:4]
        assert tiers.stats.stored_l1 == 2 and tiers.stats.dropped_l2 == 0
    settle(tiers, close=True)
    assert_l1_idle(tiers.l1)
    d = namespace_dir(tmp_path)
    assert set(check_l2_dir(d)) == {k.hex() for k in chunk_keys(first[: 2 * CHUNK], tiers.namespace)}

    fresh = l2_engine(diverse_cfg, tmp_path)
    assert generate_each(fresh, again) == want[4:]
    stats = tiers_of(fresh).stats
    assert stats.hit_tokens == {GPU: 0, L1: 0, L2: 2 * CHUNK} and stats.failed_loads == 0
    assert tiers_of(fresh).l2.corrupt == 0


# ---------------------------------------------------------------- (e) kill -9 while storing

@pytest.mark.parametrize(
    "at",
    ["transfer", "rename"],
)
def test_kill_during_store_then_restart(
    diverse_cfg: Callable[..., XrtConfig], tiny_checkpoint_diverse: str, tmp_path: Path, at: str
) -> None:
    """The child stores its first prompt's chunks, then stalls in the next L2 store, after its NIXL write
    ("transfer": the chunks are temp files) or after its first rename ("rename": a data file the index does not
    list yet), and is killed with SIGKILL there. A new engine on the directory removes the dead store's temp
    files, finds an index consistent with the files, reads what was published and generates as cache=gpu."""
    rng = random.Random(16)
    first = tokens(rng, 2 * CHUNK + 3)
    second = first[: 2 * CHUNK] + tail(rng, 0, 5 * CHUNK)
    started = tmp_path / "started"
    spec = {
        "checkpoint": tiny_checkpoint_diverse,
        "l2_path": str(tmp_path),
        "prompts": [first, second],
        "out": str(tmp_path / "out.json"),
        "stall": {"after_prompts": 1, "at": at, "started": str(started)},
    }
    proc = spawn_child(spec, tmp_path / "spec.json")
    try:
        want = reference(diverse_cfg, [first, second])  # while the child starts
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the child never started storing"
            time.sleep(0.01)
        d = namespace_dir(tmp_path)
        temps = temp_files(d)
        assert all(f".{proc.pid}-" in t for t in temps), temps
        if at == "transfer":
            assert temps  # the stalled batch, written and not renamed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    llm = l2_engine(diverse_cfg, tmp_path)  # starts cleanly on what the dead process left
    tiers = tiers_of(llm)
    assert temp_files(d) == []
    entries = check_l2_dir(d)
    published = computed_keys([first + want[0]], tiers.namespace)
    assert published == set(entries) if at == "transfer" else published <= set(entries)
    keys = chunk_keys(second[: (len(second) - 1) // CHUNK * CHUNK], tiers.namespace)
    chain = next((i for i, k in enumerate(keys) if k.hex() not in entries), len(keys))  # chunks L2 can serve
    assert generate_each(llm, [second]) == want[1:]
    assert tiers.stats.hit_tokens == {GPU: 0, L1: 0, L2: chain * CHUNK} and chain >= 2
    settle(tiers, close=True)
    assert set(check_l2_dir(d)) == computed_keys([first + want[0], second + want[1]], tiers.namespace)
