"""L1: one host buffer of `cache.l1.size_gb` carved into chunk slots, LRU over the published chunks.

The buffer is pinned when CUDA is present (so GPU <-> L1 copies run asynchronously and NIXL can register it
once) and plain memory on CPU (pinning needs a CUDA driver). A slot being written (`reserve` .. `publish` /
`abort`) or read (`acquire` .. `release`) has a reference, and eviction only takes published slots with none,
so a transfer in flight never sees its bytes reused. Each published chunk keeps its crc32 (chunk.checksum)
once known: given at publish when it came from L2 (verified there), else computed on first use by
`checksum_of` (the L2 writer thread asks, so the scheduler's thread never spends the ~10 ms a 28 MiB chunk
costs, and cache=l1 alone never computes one).
The buffer starts on a 4096-byte boundary (ALIGN), so L2 can read into its slots with O_DIRECT (l2.py).
Thread-safe: the storing thread and the scheduler's thread share it."""

from __future__ import annotations

import threading
from collections import OrderedDict

import attrs
import torch

from xrt.kvstore.chunk import ChunkLayout, checksum

# O_DIRECT wants the buffer, file offsets and lengths on the device's logical block size; 4096 covers every
# disk in use (512 or 4096). Pinned memory (cudaHostAlloc) is page-aligned; plain torch.empty only 64-byte.
ALIGN = 4096


@attrs.define
class _Entry:
    slot: int
    crc: int | None


class L1Full(RuntimeError):
    """Every slot is referenced: nothing can be evicted for a new chunk."""


def aligned_empty(nbytes: int, pin: bool) -> torch.Tensor:
    """nbytes of uint8 host memory starting on an ALIGN boundary: a slice of ALIGN more bytes (the slice keeps
    the whole allocation alive)."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    skip = -raw.data_ptr() % ALIGN
    return raw[skip : skip + nbytes]


class L1Cache:
    def __init__(self, layout: ChunkLayout, size_bytes: int, pin: bool | None = None) -> None:
        self.layout = layout
        self.num_slots = size_bytes // layout.nbytes
        if self.num_slots < 1:
            raise ValueError(f"cache.l1.size_gb holds no chunk: one chunk is {layout.nbytes} bytes "
                             f"({layout.chunk_tokens} tokens), the size is {size_bytes} bytes")
        pin = torch.cuda.is_available() if pin is None else pin
        self.buffer = aligned_empty(self.num_slots * layout.nbytes, pin)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a write ended (published or aborted)
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # published, least recently used first
        self._writing: dict[int, bytes] = {}  # slot -> key reserved for it, not yet visible
        self._refs = [0] * self.num_slots
        self._free = list(range(self.num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.evictions = 0

    # ------------------------------------------------------------------ slots

    def slot_bytes(self, slot: int) -> torch.Tensor:
        n = self.layout.nbytes
        return self.buffer[slot * n : (slot + 1) * n]

    def slot_view(self, slot: int) -> torch.Tensor:
        """The slot as the chunk's tensor (layout shape and the KV dtype), sharing the buffer's memory."""
        return self.slot_bytes(slot).view(self.layout.kv.dtype).view(self.layout.shape)

    def slot_offset(self, slot: int) -> int:
        return slot * self.layout.nbytes

    # ------------------------------------------------------------------ writing

    def reserve(self, key: bytes) -> int | None:
        """A slot to write `key` into, referenced; None when `key` is already stored or being written (storing
        it again is a no-op). Evicts the least recently used unreferenced chunk when no slot is free; raises
        L1Full when every slot is referenced."""
        with self._lock:
            if key in self._entries or key in self._writing.values():
                return None
            slot = self._free.pop() if self._free else self._evict_one()
            self._refs[slot] = 1
            self._writing[slot] = key
            return slot

    def publish(self, slot: int, crc: int | None = None, keep: bool = False) -> None:
        """The chunk written to `slot` becomes visible (most recently used), with its crc32 when the caller
        knows it (a load from L2 verified it). keep: the writer's reference becomes a reader's, released with
        `release` (a load that copies the chunk up next: no other thread's reserve can evict it meanwhile)."""
        with self._lock:
            key = self._writing.pop(slot)
            self._entries[key] = _Entry(slot, crc)
            if not keep:
                self._refs[slot] -= 1
            self._changed.notify_all()

    def checksum_of(self, key: bytes, slot: int) -> int:
        """The crc32 of a published chunk the caller holds referenced (acquire), computed once. zlib releases
        the GIL over large buffers, so computing it in a background thread does not stall the others."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.slot == slot and entry.crc is not None:
                return entry.crc
        crc = checksum(self.slot_bytes(slot))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.slot == slot:
                entry.crc = crc
        return crc

    def abort(self, slot: int) -> None:
        """A write that failed: the slot is free again and nothing is published."""
        with self._lock:
            del self._writing[slot]
            self._refs[slot] = 0
            self._free.append(slot)
            self._changed.notify_all()

    def _evict_one(self) -> int:
        for key, entry in self._entries.items():
            if self._refs[entry.slot] == 0:
                del self._entries[key]
                self.evictions += 1
                return entry.slot
        raise L1Full(f"all {self.num_slots} L1 slots are being read or written")

    # ------------------------------------------------------------------ reading

    def contains(self, key: bytes) -> bool:
        with self._lock:
            return key in self._entries

    def writing(self, key: bytes) -> bool:
        """Whether `key` is being written into a slot now (a gather or a prefetch in flight)."""
        with self._lock:
            return key in self._writing.values()

    def acquire_when_written(self, key: bytes, timeout_s: float) -> tuple[int, int | None] | None:
        """`acquire`, waiting up to timeout_s for a write of `key` in flight to end; None when it is not
        there by then (the write failed, or is still running: the caller recomputes)."""
        with self._changed:
            self._changed.wait_for(lambda: key in self._entries or key not in self._writing.values(), timeout_s)
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self._refs[entry.slot] += 1
            return entry.slot, entry.crc

    def acquire(self, key: bytes) -> tuple[int, int | None] | None:
        """(slot, crc or None when not computed yet) of a published chunk, referenced until `release`
        (eviction leaves it alone) and made most recently used; None on a miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self._refs[entry.slot] += 1
            return entry.slot, entry.crc

    def release(self, slot: int) -> None:
        with self._lock:
            if self._refs[slot] <= 0:
                raise RuntimeError(f"L1 slot {slot} released more often than acquired")
            self._refs[slot] -= 1

    def drop(self, key: bytes) -> bool:
        """Forget a chunk whose bytes turned out bad; False when absent or still referenced (a reader holds it)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self._refs[entry.slot]:
                return False
            del self._entries[key]
            self._free.append(entry.slot)
            return True

    # ------------------------------------------------------------------ whole chunks

    def put(self, key: bytes, chunk: torch.Tensor) -> bool:
        """Copy a chunk in (layout shape and dtype); False when it was there already."""
        slot = self.reserve(key)
        if slot is None:
            return False
        try:
            self.slot_view(slot).copy_(chunk)
        except BaseException:
            self.abort(slot)
            raise
        self.publish(slot)
        return True

    def get(self, key: bytes, out: torch.Tensor) -> bool:
        """Copy a chunk out into `out`; False on a miss."""
        got = self.acquire(key)
        if got is None:
            return False
        try:
            out.copy_(self.slot_view(got[0]))
        finally:
            self.release(got[0])
        return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
