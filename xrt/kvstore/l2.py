"""L2: KV chunks in files, moved to and from L1's buffer by NIXL agents (`cache.l2`).

One file per chunk, `<path>/xrt-kv-<namespace>/<key hex>-<crc32 hex>.kv`, written under a temp name and
renamed once its transfer is done. Chosen over preallocated slab files: a name derived from the key needs no
allocation table, a rename is atomic (a reader sees the whole chunk or nothing; two processes writing one key
write the same name, and the second rename replaces identical bytes), a restart finds everything by name, and
clearing or evicting is unlinking. The price is one open/register per chunk per transfer, small next to a
chunk's bytes (a 256-token chunk of Qwen3-0.6B is 28 MiB). `size_gb` bounds one namespace's files.

A batch of chunks is one NIXL transfer (l2_transfer.py). A key is published (renamed and added to the index)
only after its batch reported DONE; on any failure the batch's temp files are removed and nothing is
published. Loads verify the crc32 in the name against the bytes read (on a few threads: zlib releases the
GIL); a mismatch is a miss and the entry and file are dropped. Existence comes from the index (index.py),
never from query_memory. Loads read with O_DIRECT where the layout and the filesystem allow it (l2_files.py);
a load past its deadline is abandoned, its transfer waited out on another thread (l2_transfer.py).

Threads: the L2 writer thread stores, the prefetch thread loads ahead of admission, and the scheduler's
thread looks up and loads. Each role has its own agent (each registers the L1 buffer, each has a lock), so a
load never queues behind a store's or a prefetch's transfer. The index lock is held for dict work and index
file I/O, never across a transfer; lookups and loads read the index without waiting for it (`_listed`)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from xrt.config import L2Args, L2Backend
from xrt.kvstore.chunk import checksum
from xrt.kvstore.index import LOCK, L2Index, data_name
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2_files import (
    O_DIRECT,
    TEMP_SUFFIX,
    l2_dir,
    read_measurements,
    remove_stale_temps,
    temp_tag,
    why_buffered,
    write_measurements,
)
from xrt.kvstore.l2_transfer import ROLES, L2Agent, L2Busy, L2Error, L2Late
from xrt.kvstore.nixl_api import nixl_api
from xrt.log import get_logger
from xrt.units import GB

log = get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R")
# threads verifying loaded chunks' checksums (zlib.crc32 releases the GIL: they run in parallel)
VERIFY_THREADS = min(8, os.cpu_count() or 1)


@dataclass(frozen=True)
class LoadResult:
    """crcs[i]: item i's crc32 where its slot now holds it, verified, or None for a miss. late: the transfer
    passed its deadline (or the read agent was still busy with a late one): every item is a miss.
    seconds: the load's wall time, read and verify."""

    crcs: list[int | None]
    seconds: float = 0.0
    late: bool = False


class L2Store:
    def __init__(self, args: L2Args, root: str | Path, namespace_hex: str, l1: L1Cache,
                 agent_name: str | None = None) -> None:
        if args.backend is L2Backend.OBJ:
            # objects have no directory, rename or flock: l2_objects.ObjStore (build.build_l2 picks it)
            raise ValueError("cache.l2.backend=OBJ is stored by l2_objects.ObjStore, not in files")
        self._index_lock = threading.Lock()
        self.l1 = l1
        self.backend = args.backend.value
        self.chunk_bytes = l1.layout.nbytes
        self.limit = max(1, int(args.size_gb * GB) // self.chunk_bytes)
        self.dir = l2_dir(root, namespace_hex)
        self.error: str | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            # a store that cannot write is a cache that always misses, not a crash of the engine
            self.error = f"cache.l2.path: cannot create {self.dir}: {e.strerror or e}"
            log.warning("%s; the L2 tier stores nothing", self.error)
        self.index = L2Index(self.dir) if self.error is None else None
        if self.index is not None:
            remove_stale_temps(self.dir)
            try:
                added, dropped = self.index.reconcile(self.chunk_bytes)
            except OSError as e:  # a read-only or full directory: the index stays as it is
                log.warning("L2: could not reconcile %s with its files: %s", self.dir, e)
            else:
                if added or dropped:
                    log.info("L2: %d unlisted chunk files listed, %d entries without a file dropped",
                             len(added), len(dropped))
        why = why_buffered(l1) if args.direct_io else None
        if why is not None:
            log.info("L2: chunk files are read buffered (cache.l2.direct_io needs 4096-aligned reads): %s", why)
        self.direct = args.direct_io and why is None  # loads open chunk files with O_DIRECT
        if self.direct and self.index is not None:
            # ask the filesystem now (reconcile created the lock file), so `direct` says from the start how
            # loads read; a missing file leaves it to the first load
            with contextlib.suppress(OSError):
                os.close(self._open_read(self.dir / LOCK))
        api = nixl_api(self.backend)
        name = agent_name or f"xrt-l2-{temp_tag()}"
        params = dict(args.backend_params)
        # one agent per role (stores, loads at admission, prefetches), so none queues behind another's transfer
        try:
            self._agents = {role: L2Agent(api, f"{name}-{role.lower()}", role, self.backend, params, l1)
                            for role in ROLES}
        except Exception as e:  # NIXL's binding errors (a GDS plugin without cuFile); the CLI asks first (preflight)
            raise ValueError(f"cache.l2.backend: {self.backend}: NIXL cannot start this backend here: "
                             f"{e or type(e).__name__}; use POSIX") from e
        self.stored = self.loaded = self.corrupt = self.late_transfers = 0
        self.last_store_failed = False  # the latest store's batch failed (L2Writer counts it)
        self._verify = ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="xrt-kv-verify")

    # ------------------------------------------------------------------ lookups

    def contains(self, key: bytes) -> bool:
        return self.holds([key])[0]

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored: one look at the index for all of them (a lookup asks for every chunk of
        a prompt)."""
        if self.index is None:
            return [False] * len(keys)
        entries = self._listed()
        return [k.hex() in entries for k in keys]

    def _listed(self) -> dict[str, list[float]]:
        """The index's entries (re-read when another process replaced the file) without ever waiting for this
        process's writer: it holds the lock across the index file's read-modify-write, which waits on the disk
        behind the chunk data being written back (lookups on the H200 machine stalled up to ~0.36 s there, with
        ~15 GB of stores in flight). Its entries are then at most one batch stale: a key published meanwhile is a
        miss this time, one evicted meanwhile a miss when loaded."""
        assert self.index is not None
        if self._index_lock.acquire(blocking=False):
            try:
                self.index.refresh()
            finally:
                self._index_lock.release()
        return self.index.entries

    def __len__(self) -> int:
        if self.index is None:
            return 0
        with self._index_lock:
            self.index.refresh()
            return len(self.index.entries)

    def _parallel(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """fn over items on the checksum threads; in this thread once the interpreter is shutting down (its
        executors refuse new work before atexit hooks run, and the manager's hook flushes the writer then)."""
        try:
            results = self._verify.map(fn, items)  # submits every item now: a refusal raises here
        except RuntimeError:
            return [fn(item) for item in items]
        return list(results)

    # ------------------------------------------------------------------ transfers

    def _open_read(self, path: Path) -> int:
        """A file opened for a load: with O_DIRECT while `direct`. A filesystem that refuses it (EINVAL)
        turns it off for this store from then on (logged by the refusal that finds it on)."""
        if self.direct:
            try:
                return os.open(path, os.O_RDONLY | O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                if self.direct:
                    self.direct = False
                    log.info("L2: %s does not support O_DIRECT; chunk files are read buffered", self.dir)
        return os.open(path, os.O_RDONLY)

    def _transfer(self, role: str, slots: Sequence[int], fds: Sequence[int], deadline: float | None = None,
                  on_late: Callable[[], None] | None = None) -> None:
        """One NIXL transfer through the role's agent: each slot of L1 <-> the whole of its file
        (`L2Agent.transfer`: L2Error unless DONE; with a deadline, L2Late once it passes, L2Busy while the agent
        finishes an earlier late one, `on_late` run once a late one ends)."""
        offsets = [self.l1.slot_offset(s) for s in slots]
        try:
            self._agents[role].transfer(offsets, fds, self.chunk_bytes, deadline, on_late)
        except L2Busy:
            raise
        except L2Late:
            self.late_transfers += 1
            raise

    def store(self, items: Sequence[tuple[bytes, int, int | None]]) -> list[bytes]:
        """Write chunks from L1 slots: (key, slot, crc) each (crc None: L1 computes it now), the slots
        referenced by the caller until this returns. Returns the keys published now; keys already stored are
        skipped (a no-op), and a failed batch publishes nothing."""
        self.last_store_failed = False
        index = self.index
        if index is None:
            return []
        with self._index_lock:
            index.refresh()
            todo = [(k, s, c) for k, s, c in dict((k, (k, s, c)) for k, s, c in items).values()
                    if k.hex() not in index.entries]
        # more than the limit at once would only evict part of this batch again
        todo = todo[: self.limit]
        crcs = self._parallel(lambda t: self.l1.checksum_of(t[0], t[1]) if t[2] is None else t[2], todo)
        todo = [(k, s, c) for (k, s, _), c in zip(todo, crcs, strict=True)]
        if not todo:
            return []
        tag = temp_tag()
        tmps: list[Path] = []
        renamed: list[Path] = []
        fds: list[int] = []
        try:
            for k, _, _ in todo:
                tmp = self.dir / f".{k.hex()}.{tag}{TEMP_SUFFIX}"
                fds.append(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
                tmps.append(tmp)
            self._transfer("WRITE", [s for _, s, _ in todo], fds)
            published: list[tuple[str, int]] = []
            for (k, _, crc), tmp in zip(todo, tmps, strict=True):
                os.replace(tmp, self.dir / data_name(k.hex(), crc))
                renamed.append(self.dir / data_name(k.hex(), crc))
                published.append((k.hex(), crc))
            with self._index_lock:
                index.update(add=published, limit=self.limit)
        except (OSError, L2Error) as e:
            log.warning("L2 store of %d chunks failed, nothing published: %s", len(todo), e)
            self.last_store_failed = True
            # the temp files, and the data files renamed before the index write failed (never listed). A key
            # another process had listed meanwhile under the same name is theirs: its file is left alone.
            with self._index_lock:
                with contextlib.suppress(OSError):
                    index.refresh(force=True)
                listed = set(index.entries)
            for path in [*tmps, *(r for r in renamed if r.name.split("-")[0] not in listed)]:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return []
        finally:
            for fd in fds:
                os.close(fd)
        self.stored += len(published)
        return [k for k, _, _ in todo]

    def load(self, items: Sequence[tuple[bytes, int]], deadline_s: float | None = None,
             on_late: Callable[[], None] | None = None, role: str = "READ") -> LoadResult:
        """Read chunks into L1 slots the caller reserved: (key, slot) each. Per item the chunk's crc32 where
        the slot now holds it, verified; None for a miss (not indexed, file gone, failed transfer, bad crc:
        the entry is dropped). The caller publishes the slots that loaded (with that crc) and aborts the
        others, except after a late load (`LoadResult.late`): its slots are still being written, and
        `on_late` runs (on another thread) once they are not; the caller aborts them there."""
        start = time.perf_counter()
        ok: list[int | None] = [None] * len(items)
        index = self.index
        if index is None or not items:
            return LoadResult(ok)
        listed = self._listed()
        entries = [listed.get(k.hex()) for k, _ in items]
        want: list[tuple[int, str, int, int]] = []  # (item, key hex, crc, fd)
        gone: list[str] = []
        late = False

        def close_files() -> None:
            for *_, fd in want:
                os.close(fd)

        def after_late() -> None:
            close_files()
            if on_late is not None:
                on_late()

        try:
            for i, ((k, _), entry) in enumerate(zip(items, entries, strict=True)):
                if entry is None:
                    continue
                crc = int(entry[0])
                try:
                    fd = self._open_read(self.dir / data_name(k.hex(), crc))
                except FileNotFoundError:
                    gone.append(k.hex())  # evicted by another process since the index was read
                    continue
                want.append((i, k.hex(), crc, fd))
            if want:
                deadline = None if deadline_s is None else start + deadline_s
                try:
                    self._transfer(role, [items[i][1] for i, _, _, _ in want], [fd for *_, fd in want],
                                   deadline, after_late)
                except L2Late as e:
                    late = True  # the files are closed by after_late: now (not started) or once it ends
                    if isinstance(e, L2Busy):
                        after_late()
                    log.info("L2 load abandoned: %s", e)
                    return LoadResult(ok, time.perf_counter() - start, late=True)
                except L2Error as e:
                    log.warning("L2 load of %d chunks failed: %s", len(want), e)
                    return LoadResult(ok, time.perf_counter() - start)
                crcs = self._parallel(lambda w: checksum(self.l1.slot_bytes(items[w[0]][1])), want)
                for (i, key_hex, crc, _), got in zip(want, crcs, strict=True):
                    if got == crc:
                        ok[i] = crc
                    else:
                        log.warning("L2 chunk %s failed its checksum: dropped", key_hex[:16])
                        self.corrupt += 1
                        gone.append(key_hex)
                        with contextlib.suppress(OSError):
                            os.unlink(self.dir / data_name(key_hex, crc))
                touched = [key_hex for (i, key_hex, _, _) in want if ok[i] is not None]
                for key_hex in touched:
                    index.touch(key_hex)
        finally:
            if not late:
                close_files()
            if gone:
                try:
                    with self._index_lock:
                        index.update(remove=gone)
                except OSError as e:  # the entries stay listed; the next load finds them bad again
                    log.warning("L2 index update failed: %s", e)
        self.loaded += sum(crc is not None for crc in ok)
        return LoadResult(ok, time.perf_counter() - start)

    def sample_keys(self, n: int) -> list[bytes]:
        """Up to n stored keys, the most recently used first (for a bandwidth probe)."""
        if self.index is None:
            return []
        with self._index_lock:
            self.index.refresh()
            recent = sorted(self.index.entries.items(), key=lambda kv: -kv[1][1])[:n]
        return [bytes.fromhex(k) for k, _ in recent]

    # ------------------------------------------------------------------ measurements

    def read_measurements(self) -> dict[str, Any]:
        """What an earlier process measured with this directory (l2_files.read_measurements), or {}."""
        return read_measurements(self.dir)

    def write_measurements(self, data: dict[str, Any]) -> None:
        """Saved for the next process (l2_files.write_measurements; failures only logged); nothing without a
        directory."""
        if self.error is None:
            write_measurements(self.dir, data)

    # ------------------------------------------------------------------ housekeeping

    def clear(self) -> None:
        """Remove this namespace's directory: other models' chunks under the same path stay."""
        with self._index_lock:
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.error is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                self.index = L2Index(self.dir)

    def close(self) -> None:
        for a in self._agents.values():
            a.close()  # a late transfer finishes first (its thread holds the lock)
        self._verify.shutdown(wait=True)
