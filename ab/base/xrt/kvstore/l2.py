"""L2: KV chunks in files, moved to and from L1's buffer by a NIXL agent (`cache.l2`).

One file per chunk, `<path>/xrt-kv-<namespace>/<key hex>-<crc32 hex>.kv`, written under a temp name and
renamed once its transfer is done. Chosen over preallocated slab files: a name derived from the key needs no
allocation table, a rename is atomic (a reader sees the whole chunk or nothing; two processes writing one key
write the same name, and the second rename replaces identical bytes), a restart finds everything by name, and
clearing or evicting is unlinking. The price is one open/register per chunk per transfer, small next to a
chunk's bytes (a 256-token chunk of Qwen3-0.6B is 28 MiB). `size_gb` bounds one namespace's files.

The L1 buffer is registered with the agent once. A batch of chunks is one NIXL transfer (one descriptor per
chunk on each side), posted and then polled with `check_xfer_state` until DONE or ERR; the poll spins briefly
and then sleeps with a growing interval (NIXL's Python API has no blocking wait). A key is published (renamed
and added to the index) only after its batch reported DONE; on any failure the batch's temp files are removed
and nothing is published. Loads verify the crc32 in the name against the bytes read (on a few threads: zlib
releases the GIL); a mismatch is a miss and the entry and file are dropped. Existence comes from the index
(index.py), never from query_memory.

Loads open the chunk files with O_DIRECT (`cache.l2.direct_io`, on by default) when the transfer allows it:
L1's buffer starts on 4096 bytes (l1.py) and the chunk size is a multiple of 4096, so every slot offset and
length is too (decided once per store; otherwise buffered, logged). Reads then bypass the page cache, which
L1 already is, and run at the disk's direct rate: on the H200 machine (NIXL 1.5.1 POSIX, 48 Qwen3-8B chunks
of 37.7 MB, page cache dropped) 1.89-1.93 GB/s against 1.29-1.36 buffered, the issue 13 target being 70% of
the directory's dd-like O_DIRECT probe (xrt/bench/disk.py). A filesystem that refuses O_DIRECT (EINVAL:
tmpfs before Linux 6.6) is found at start-up, or at the first load, and read buffered from then on. Writes
stay buffered: they run in the background, where nobody waits for them. A chunk still in the page cache is
read from the disk too (the kernel writes dirty pages back first); a chunk written recently is usually in L1.

A load may carry a deadline (policy.py): past it the caller stops waiting and recomputes. The transfer cannot
be taken back from NIXL while it runs, so a late transfer is handed to a thread that waits for it, then frees
its slots and files; until then the read agent is busy and later loads with a deadline miss at once instead
of queueing behind it.

Threads: the L2 writer thread stores, the prefetch thread loads ahead of admission, and the scheduler's
thread looks up and loads. Each role has its own agent (each registers the L1 buffer), so a load never queues
behind a store's or a prefetch's transfer. The index lock is held for dict work and index file I/O, never
across a transfer; lookups and loads read the index without waiting for it (`_listed`). NIXL agents are made
without their own locking (NIXL_THREAD_SYNC_NONE, the default without a listener thread), so each agent has
a lock too."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from xrt.config import L2Args, L2Backend
from xrt.kvstore.chunk import checksum
from xrt.kvstore.index import LOCK, L2Index, data_name
from xrt.kvstore.l1 import ALIGN, L1Cache
from xrt.kvstore.nixl_api import nixl_api
from xrt.log import get_logger
from xrt.units import GB

log = get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R")
DIR_PREFIX = "xrt-kv-"
# Spin this long before sleeping between polls: a POSIX batch of a few chunks is often done within it.
SPIN_S = 200e-6
MAX_POLL_SLEEP_S = 2e-3
TEMP_SUFFIX = ".tmp"
# what a process measured here, for the next one (policy.py)
MEASUREMENTS = "measurements.json"
# a temp file this old belongs to a store that died (a live one renames within a transfer's time)
STALE_TEMP_S = 3600.0
# 0 where the platform has no O_DIRECT (not Linux): reads are buffered there
O_DIRECT: int = getattr(os, "O_DIRECT", 0)


# the agents' roles: WRITE stores, READ loads at admission, PREFETCH loads ahead of admission (prefetch.py)
ROLES = ("WRITE", "READ", "PREFETCH")
# threads verifying loaded chunks' checksums (zlib.crc32 releases the GIL: they run in parallel)
VERIFY_THREADS = min(8, os.cpu_count() or 1)


class L2Error(RuntimeError):
    """A transfer that did not complete (ERR state, or NIXL raised)."""


class L2Late(L2Error):
    """A transfer still running at its deadline: left to a thread that frees its resources when it ends."""


class L2Busy(L2Late):
    """A transfer with a deadline not started: the agent is still finishing a late one."""


@dataclass(frozen=True)
class LoadResult:
    """crcs[i]: item i's crc32 where its slot now holds it, verified, or None for a miss. late: the transfer
    passed its deadline (or the read agent was still busy with a late one): every item is a miss.
    seconds: the load's wall time, read and verify."""

    crcs: list[int | None]
    seconds: float = 0.0
    late: bool = False


class _Agent:
    """One NIXL agent with the L1 buffer registered, and the lock its callers take."""

    def __init__(self, api: Any, name: str, backend: str, params: dict[str, str], l1: L1Cache) -> None:
        self.lock = threading.Lock()
        self.backend = backend
        self.agent = api.nixl_agent(name, api.nixl_agent_config(backends=[]))
        self.agent.create_backend(backend, params)
        buf = l1.buffer
        self.dev = max(buf.get_device(), 0)
        self.mem = "VRAM" if buf.is_cuda else "DRAM"
        self.base = buf.data_ptr()
        self.reg: Any = self.agent.register_memory([(self.base, buf.numel(), self.dev, "")], self.mem,
                                                   backends=[backend])

    def close(self) -> None:
        with self.lock:
            if self.reg is not None:
                self.agent.deregister_memory(self.reg, backends=[self.backend])
                self.reg = None


def remove_stale_temps(directory: Path) -> list[str]:
    """Delete temp files of stores that will never finish: their process (pid in the name) is gone, or they
    are older than STALE_TEMP_S (another host's process, sharing the directory). Returns the names removed."""
    removed = []
    now = time.time()
    with contextlib.suppress(OSError):
        for e in os.scandir(directory):
            if not (e.name.startswith(".") and e.name.endswith(TEMP_SUFFIX)):
                continue
            try:
                pid = int(e.name[: -len(TEMP_SUFFIX)].rsplit(".", 1)[1].split("-")[0])
                os.kill(pid, 0)
                alive = True
            except (ValueError, IndexError, ProcessLookupError):
                alive = False
            except PermissionError:  # another user's live process
                alive = True
            try:
                if not alive or now - e.stat().st_mtime > STALE_TEMP_S:
                    os.unlink(e.path)
                    removed.append(e.name)
            except FileNotFoundError:
                pass
    return removed


def l2_dir(root: str | Path, namespace_hex: str) -> Path:
    return Path(root) / f"{DIR_PREFIX}{namespace_hex[:32]}"


def why_buffered(l1: L1Cache) -> str | None:
    """Why reads into this L1 cannot be O_DIRECT (buffer, offsets and lengths on ALIGN), None when they can.
    A slot's offset is a multiple of the chunk size, so the buffer's base and the chunk size decide it."""
    if not O_DIRECT:
        return "the platform has no O_DIRECT"
    if l1.buffer.data_ptr() % ALIGN:
        return f"the L1 buffer does not start on {ALIGN} bytes"
    if l1.layout.nbytes % ALIGN:
        return f"a chunk is {l1.layout.nbytes} bytes, not a multiple of {ALIGN}"
    return None


class L2Store:
    def __init__(self, args: L2Args, root: str | Path, namespace_hex: str, l1: L1Cache,
                 agent_name: str | None = None) -> None:
        if args.backend is L2Backend.OBJ:
            # OBJ transfers address objects (OBJ_SEG descriptors keyed by name), not files: this store's
            # file naming, renames and index do not apply; it needs its own store class.
            raise NotImplementedError("cache.l2.backend=OBJ: the object-store L2 is not built yet; use POSIX or GDS")
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
        api = nixl_api()
        name = agent_name or f"xrt-l2-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        params = dict(args.backend_params)
        # one agent per role (stores, loads at admission, prefetches), so none queues behind another's transfer
        self._agents = {role: _Agent(api, f"{name}-{role.lower()}", self.backend, params, l1) for role in ROLES}
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
        """One NIXL transfer: each slot of L1 <-> the whole of its file. Raises L2Error unless DONE. With a
        deadline (a perf_counter time), raises L2Late once it passes, or at once when the agent is still busy
        with an earlier late transfer; `on_late` then runs on the thread that waits the transfer out, after
        its NIXL resources are released."""
        a = self._agents[role]
        op = "WRITE" if role == "WRITE" else "READ"
        if deadline is None:
            a.lock.acquire()
        elif not a.lock.acquire(blocking=False):
            raise L2Busy(f"NIXL {self.backend} {op}: the agent is still finishing a late transfer")
        handed_off = False
        try:
            handed_off = self._transfer_with(a, op, slots, fds, deadline, on_late)
        finally:
            if not handed_off:
                a.lock.release()
        if handed_off:
            raise L2Late(f"NIXL {self.backend} {op} of {len(fds)} chunks not done by its deadline")

    def _transfer_with(self, a: _Agent, op: str, slots: Sequence[int], fds: Sequence[int],
                       deadline: float | None = None, on_late: Callable[[], None] | None = None) -> bool:
        """The transfer, a.lock held. True when it passed its deadline: a thread now owns it, its
        resources and the lock (`_finish_late`)."""
        n, agent = self.chunk_bytes, a.agent
        file_reg = agent.register_memory([(0, n, fd, "") for fd in fds], "FILE", backends=[self.backend])
        handle = None
        late = False
        try:
            local = agent.get_xfer_descs([(a.base + self.l1.slot_offset(s), n, a.dev) for s in slots], a.mem)
            remote = agent.get_xfer_descs([(0, n, fd) for fd in fds], "FILE")
            handle = agent.initialize_xfer(op, local, remote, agent.name, backends=[self.backend])
            state = agent.transfer(handle)
            start, pause = time.perf_counter(), 20e-6
            while state == "PROC":
                now = time.perf_counter()
                if deadline is not None and now > deadline:
                    late = True
                    self.late_transfers += 1
                    self._finish_late(a, handle, file_reg, on_late)
                    return True
                if now - start > SPIN_S:
                    time.sleep(pause)
                    pause = min(2 * pause, MAX_POLL_SLEEP_S)
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise L2Error(f"NIXL {self.backend} {op} of {len(fds)} chunks ended in state {state}")
        except L2Error:
            raise
        except Exception as e:  # NIXL raises its own nixl*Error types from the bindings
            raise L2Error(f"NIXL {self.backend} {op} of {len(fds)} chunks failed: {e}") from e
        finally:
            if not late:
                if handle is not None:
                    handle.release()
                agent.deregister_memory(file_reg, backends=[self.backend])
        return False

    def _finish_late(self, a: _Agent, handle: Any, file_reg: Any, on_late: Callable[[], None] | None) -> None:
        """Wait out a transfer past its deadline on a thread, then release it, run on_late (the caller's
        cleanup: its files and slots) and the agent's lock."""

        def wait() -> None:
            try:
                while a.agent.check_xfer_state(handle) == "PROC":
                    time.sleep(MAX_POLL_SLEEP_S)
            except Exception as e:  # noqa: BLE001  logged: the cleanup below must still run
                log.warning("L2: a late %s transfer failed while finishing: %s", self.backend, e)
            finally:
                with contextlib.suppress(Exception):
                    handle.release()
                with contextlib.suppress(Exception):
                    a.agent.deregister_memory(file_reg, backends=[self.backend])
                try:
                    if on_late is not None:
                        on_late()
                finally:
                    a.lock.release()

        threading.Thread(target=wait, name="xrt-kv-l2-late", daemon=True).start()

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
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
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
        """What an earlier process measured with this directory (policy.py: prefill rates per device, the L2
        read bandwidth), or {} when nothing (or something unreadable) is there."""
        try:
            data = json.loads((self.dir / MEASUREMENTS).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_measurements(self, data: dict[str, Any]) -> None:
        """Written to a temp name and renamed (a reader sees the old file or the new one); failures are only
        logged: they cost the next process a first measurement, nothing else."""
        if self.error is not None:
            return
        tmp = self.dir / f".{MEASUREMENTS}.{os.getpid()}-{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
        try:
            tmp.write_text(json.dumps(data, sort_keys=True))
            os.replace(tmp, self.dir / MEASUREMENTS)
        except OSError as e:
            log.warning("L2: could not save the measurements: %s", e)
            with contextlib.suppress(OSError):
                tmp.unlink()

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
            with a.lock:  # a late transfer finishes first (its thread holds the lock)
                pass
            a.close()
        self._verify.shutdown(wait=True)
