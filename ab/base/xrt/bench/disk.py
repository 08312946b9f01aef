"""The file system under the L2 tier: dropping files from the OS page cache (so an L2 load after a restart reads
the device, not memory), checking that it worked (mincore over a mapping of each file), and a `dd`-like probe of
the directory's sequential write and read bandwidth (one stream, 16 MiB blocks, O_DIRECT where the file system
takes it), the ceiling an L2 load's bandwidth is read against."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import time
from pathlib import Path
from typing import Any

BLOCK = 16 << 20  # bytes per read / write call of the probe
PROBE_FILE = "disk-probe.bin"


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def resident_fraction(path: Path) -> float | None:
    """Fraction of the file's pages in the page cache (mincore); None where that cannot be asked."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    try:
        libc = _libc()
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    page = mmap.PAGESIZE
    pages = -(-size // page)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def drop_from_page_cache(paths: list[Path]) -> dict[str, Any]:
    """fsync each file (dirty pages cannot be dropped) and posix_fadvise(DONTNEED) it; then how much of the bytes is
    still resident. status: "dropped" (none resident), "partly" (some are: e.g. tmpfs, whose pages are the
    storage), "unchecked" (dropped, residency unknown), "unsupported" (no posix_fadvise here) or "failed: why"."""
    if not hasattr(os, "posix_fadvise"):
        return {"status": "unsupported", "files": len(paths), "resident": None}
    total = resident = 0.0
    known = True
    try:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        for p in paths:
            size = p.stat().st_size
            frac = resident_fraction(p)
            known = known and frac is not None
            total += size
            resident += size * (frac or 0.0)
    except OSError as e:
        return {"status": f"failed: {e.strerror or e}", "files": len(paths), "resident": None}
    frac = resident / total if total else 0.0
    if not known:
        status = "unchecked"
    else:
        status = "dropped" if frac == 0 else "partly"
    return {"status": status, "files": len(paths), "resident": frac if known else None}


def drop_directory(directory: Path) -> dict[str, Any]:
    """drop_from_page_cache for every file under directory."""
    return drop_from_page_cache(sorted(p for p in directory.rglob("*") if p.is_file()))


def _open(path: Path, flags: int) -> tuple[int, bool, str | None]:
    """(fd, direct, why not direct): O_DIRECT first, buffered when the file system refuses it."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct, 0o644), True, None
        except OSError as e:
            why = f"O_DIRECT refused ({e.strerror or e})"
    else:
        why = "no O_DIRECT on this platform"
    return os.open(path, flags, 0o644), False, why


def _write(path: Path, size: int, buf: mmap.mmap) -> tuple[float, bool, str | None]:
    fd, direct, why = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        start = time.perf_counter()
        left = size
        try:
            while left > 0:
                left -= os.write(fd, buf)
        except OSError as e:  # O_DIRECT open accepted, the write refused (some file systems): buffered instead
            if not direct:
                raise
            os.close(fd)
            fd, direct, why = os.open(path, os.O_WRONLY | os.O_TRUNC), False, f"O_DIRECT write refused ({e})"
            start, left = time.perf_counter(), size
            while left > 0:
                left -= os.write(fd, buf)
        os.fsync(fd)
        return time.perf_counter() - start, direct, why
    finally:
        os.close(fd)


def _read(path: Path, buf: mmap.mmap) -> tuple[float, int, bool, str | None]:
    fd, direct, why = _open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        total = 0
        try:
            while n := os.readv(fd, [buf]):
                total += n
        except OSError as e:
            if not direct:
                raise
            os.close(fd)
            fd, direct, why = os.open(path, os.O_RDONLY), False, f"O_DIRECT read refused ({e})"
            start, total = time.perf_counter(), 0
            while n := os.readv(fd, [buf]):
                total += n
        return time.perf_counter() - start, total, direct, why
    finally:
        os.close(fd)


def probe_disk(directory: Path, size_mb: int) -> dict[str, Any]:
    """Sequential write then read bandwidth of a size_mb file in directory (deleted after): written from a
    page-aligned 16 MiB buffer of random bytes and fsynced, dropped from the page cache, read back in 16 MiB blocks.
    GB/s are decimal; `*_mode` says O_DIRECT or buffered (and why)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / PROBE_FILE
    blocks = max(1, -(-size_mb * 1_000_000 // BLOCK))
    size = blocks * BLOCK
    buf = mmap.mmap(-1, BLOCK)  # anonymous, page-aligned: what O_DIRECT needs
    try:
        buf.write(os.urandom(BLOCK))  # random bytes: a compressing file system must not shrink the probe
        write_s, w_direct, w_why = _write(path, size, buf)
        drop = drop_from_page_cache([path])
        read_s, got, r_direct, r_why = _read(path, buf)
    finally:
        buf.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if got != size:
        raise RuntimeError(f"{path}: read {got} bytes back, wrote {size}")
    return {
        "disk_probe_bytes": size,
        "disk_write_gbps": size / write_s / 1e9,
        "disk_read_gbps": size / read_s / 1e9,
        "disk_write_mode": "O_DIRECT" if w_direct else f"buffered + fsync: {w_why}",
        "disk_read_mode": "O_DIRECT" if r_direct else f"buffered: {r_why}; page cache {drop['status']}",
    }
