"""L2's index of stored chunks: `index.json` in the namespace's directory, {key hex: [crc32, last use]}.

Existence comes from this index, not from asking NIXL (query_memory) or the filesystem per lookup: one stat
tells whether another process changed it, and a lookup is a dict probe. Every change is read-modify-write
under an exclusive flock on `.lock` (the current file is read, this process's additions and removals applied,
the result written to a temp name and renamed over `index.json`), so two processes on one directory never
lose each other's entries and a reader never sees a half-written index. A missing or unreadable index is
rebuilt from the data files' names (`<key hex>-<crc32 hex>.kv`: the name carries everything an entry needs,
so a rebuild loses only the use times)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

INDEX = "index.json"
LOCK = ".lock"
SUFFIX = ".kv"
VERSION = 1


def data_name(key_hex: str, crc: int) -> str:
    return f"{key_hex}-{crc:08x}{SUFFIX}"


def parse_data_name(name: str) -> tuple[str, int] | None:
    """(key hex, crc) of a data file's name, None for anything else (temp files, the index)."""
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    key_hex, _, crc = name[: -len(SUFFIX)].rpartition("-")
    try:
        return key_hex, int(crc, 16)
    except ValueError:
        return None


class L2Index:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.entries: dict[str, list[float]] = {}  # key hex -> [crc, last use (unix time)]
        self._seen: tuple[int, int] | None = None  # (mtime_ns, inode) of the index file last read
        self._touched: dict[str, float] = {}  # use times not written yet
        # guards _touched alone (held for dict work only): a load records a use without waiting for an index
        # write in progress, which holds the store's lock across file I/O
        self._touch_lock = threading.Lock()
        self.refresh(force=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.dir / LOCK, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.dir / INDEX)
        except OSError:  # missing, or the directory itself is gone: nothing to compare against
            return None
        return st.st_mtime_ns, st.st_ino

    def _read(self) -> dict[str, list[float]]:
        try:
            data = json.loads((self.dir / INDEX).read_text())
            if data.get("version") == VERSION and isinstance(data.get("entries"), dict):
                return {k: list(v) for k, v in data["entries"].items()}
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        return self._scan()

    def _data_files(self) -> Iterator[tuple[str, int, os.stat_result, str]]:
        """(key hex, crc, stat, path) of every data file in the directory (none when it cannot be read)."""
        with contextlib.suppress(OSError):
            for e in os.scandir(self.dir):
                parsed = parse_data_name(e.name)
                if parsed is not None:
                    yield parsed[0], parsed[1], e.stat(), e.path

    def _scan(self) -> dict[str, list[float]]:
        return {k: [crc, st.st_mtime] for k, crc, st, _ in self._data_files()}

    def refresh(self, force: bool = False) -> None:
        """Re-read the index if another process replaced it since (one stat when it did not)."""
        seen = self._stat()
        if force or seen != self._seen or seen is None:
            self.entries = self._read()
            self._seen = seen

    def touch(self, key_hex: str) -> None:
        """Record a use; written with the next update (a load should not cost an index write)."""
        with self._touch_lock:
            self._touched[key_hex] = time.time()

    def update(self, add: Iterable[tuple[str, int]] = (), remove: Iterable[str] = (),
               limit: int | None = None) -> list[str]:
        """Apply additions and removals to the index on disk, under the lock; with `limit`, then remove the
        least recently used entries beyond it (never one added now) and delete their files, still under the
        lock. Returns the evicted keys. A reader that opened one of those files before keeps reading it
        (unlinking leaves an open file readable); one that looks it up after finds it gone: a miss."""
        with self._locked():
            entries = self._read()
            now = time.time()
            with self._touch_lock:
                touched, self._touched = self._touched, {}
            for k, t in touched.items():
                if k in entries:
                    entries[k][1] = max(entries[k][1], t)
            added = set()
            for key_hex, crc in add:
                entries[key_hex] = [crc, now]
                added.add(key_hex)
            for key_hex in remove:
                entries.pop(key_hex, None)
            evicted: list[str] = []
            if limit is not None and len(entries) > limit:
                old = sorted((v[1], k) for k, v in entries.items() if k not in added)
                for _, k in old[: len(entries) - limit]:
                    evicted.append(k)
                    crc = int(entries.pop(k)[0])
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.dir / data_name(k, crc))
            self._write(entries)
        return evicted

    def _write(self, entries: dict[str, list[float]]) -> None:
        """Under the lock: the index replaced whole, or (a failed write, e.g. a full disk) left as it was with
        no temp file behind."""
        tmp = self.dir / f".{INDEX}.{os.getpid()}.tmp"
        try:
            tmp.write_text(json.dumps({"version": VERSION, "entries": entries}))
            os.replace(tmp, self.dir / INDEX)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self.entries = entries
        self._seen = self._stat()

    def reconcile(self, chunk_bytes: int) -> tuple[list[str], list[str]]:
        """At start-up, under the lock: list the whole data files the index misses (a store killed between
        its rename and its index update), delete data files of the wrong size, and drop entries whose file is
        gone. Returns (keys added, keys dropped)."""
        with self._locked():
            entries = self._read()
            on_disk: dict[str, tuple[int, float]] = {}
            for key_hex, crc, st, path in self._data_files():
                if st.st_size != chunk_bytes:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    continue
                on_disk[key_hex] = (crc, st.st_mtime)
            added = [k for k in on_disk if k not in entries or int(entries[k][0]) != on_disk[k][0]]
            dropped = [k for k in entries if k not in on_disk]
            if added or dropped:
                for k in dropped:
                    del entries[k]
                for k in added:
                    entries[k] = [on_disk[k][0], on_disk[k][1]]
                self._write(entries)
            else:
                self.entries = entries
                self._seen = self._stat()
        return added, dropped
