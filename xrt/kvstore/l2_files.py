"""What an L2 directory holds besides its index (index.py) and chunk files: its name per namespace, temp files
(stale ones removed), the measurements file a process leaves for the next (policy.py), and whether chunk
files can be read with O_DIRECT.

Loads open the chunk files with O_DIRECT (`cache.l2.direct_io`, on by default) when the transfer allows it:
L1's buffer starts on 4096 bytes (l1.py) and the chunk size is a multiple of 4096, so every slot offset and
length is too (decided once per store; otherwise buffered, logged). Reads then bypass the page cache, which
L1 already is, and run at the disk's direct rate: on the H200 machine (NIXL 1.5.1 POSIX, 48 Qwen3-8B chunks
of 37.7 MB, page cache dropped) 1.89-1.93 GB/s against 1.29-1.36 buffered, the issue 13 target being 70% of
the directory's dd-like O_DIRECT probe (xrt/bench/disk.py). A filesystem that refuses O_DIRECT (EINVAL:
tmpfs before Linux 6.6) is found at start-up, or at the first load, and read buffered from then on (l2.py).
Writes stay buffered: they run in the background, where nobody waits for them. A chunk still in the page
cache is read from the disk too (the kernel writes dirty pages back first); a chunk written recently is
usually in L1."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from xrt.kvstore.l1 import ALIGN, L1Cache
from xrt.log import get_logger

log = get_logger(__name__)
DIR_PREFIX = "xrt-kv-"
TEMP_SUFFIX = ".tmp"
# what a process measured here, for the next one (policy.py)
MEASUREMENTS = "measurements.json"
# a temp file this old belongs to a store that died (a live one renames within a transfer's time)
STALE_TEMP_S = 3600.0
# 0 where the platform has no O_DIRECT (not Linux): reads are buffered there
O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def l2_dir(root: str | Path, namespace_hex: str) -> Path:
    return Path(root) / f"{DIR_PREFIX}{namespace_hex[:32]}"


def temp_tag() -> str:
    """What makes a temp name this process's own: its pid (remove_stale_temps reads it back) and a random
    part."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


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


def read_measurements(directory: Path) -> dict[str, Any]:
    """What an earlier process measured with this directory (policy.py: prefill rates per device, the L2
    read bandwidth), or {} when nothing (or something unreadable) is there."""
    try:
        data = json.loads((directory / MEASUREMENTS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_measurements(directory: Path, data: dict[str, Any]) -> None:
    """Written to a temp name and renamed (a reader sees the old file or the new one); failures are only
    logged: they cost the next process a first measurement, nothing else."""
    tmp = directory / f".{MEASUREMENTS}.{temp_tag()}{TEMP_SUFFIX}"
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, directory / MEASUREMENTS)
    except OSError as e:
        log.warning("L2: could not save the measurements: %s", e)
        with contextlib.suppress(OSError):
            tmp.unlink()
