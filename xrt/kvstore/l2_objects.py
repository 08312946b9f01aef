"""L2 in object storage (`cache.l2.backend=OBJ`): one S3 object per chunk, moved to and from L1's buffer by NIXL
OBJ agents, with the same interface as the file store (l2.py's `L2Store`) so the writer, reader and prefetcher
use either.

Objects are named as the files are: `<cache.l2.path>/xrt-kv-<namespace>/<key hex>-<crc32 hex>.kv` in the bucket
of `cache.l2.backend_params` (cache.l2.path is the key prefix here, empty for none). An S3 PUT is atomic (a
reader sees the whole object or none), so there is no temp name: NIXL writes the final name, and a key is
published (listed by this store) only after its batch's transfer reported DONE. A batch that failed publishes
nothing; its objects that did land are whole and carry their crc32, so they are left for a later listing rather
than deleted (another process may have written the same name). Loads verify the crc32 of the bytes read against
the name's, as files are (l2.py); a mismatch is a miss and the object is deleted.

What exists comes from the store itself: one listing under the namespace's prefix at start-up (boto3, obj_client.py;
NIXL neither lists nor deletes, and its query_memory is not used), then this store's own records. A second
process, or machine, on the same bucket finds the first one's chunks at its start. A chunk another process
evicts meanwhile is a failed batch for this one: the batch's objects are then asked for (HEAD) and the missing
ones dropped. `size_gb` bounds the chunks this store knows of; the least recently used beyond it are deleted,
only ever under this namespace's prefix.

An endpoint that does not answer at start-up turns L2 off with one line (`error`), and the requests are served
from L1 and recomputation; one that goes away later makes transfers fail: loads fall back to recomputing and
stores count as failed, publishing nothing. AWS's SDK retries a failed connection for ~25 s per transfer in its
default (legacy) retry mode; AWS_RETRY_MODE=standard and AWS_MAX_ATTEMPTS=1 make it fail at once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xrt.config import L2Args
from xrt.kvstore.chunk import checksum
from xrt.kvstore.index import data_name, parse_data_name
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import VERIFY_THREADS, LoadResult
from xrt.kvstore.l2_files import DIR_PREFIX, MEASUREMENTS, temp_tag
from xrt.kvstore.l2_transfer import ROLES, L2Agent, L2Busy, L2Error, L2Late
from xrt.kvstore.nixl_api import nixl_api
from xrt.kvstore.obj_client import (
    bucket_of,
    delete_objects,
    describe,
    exists,
    get_json,
    list_objects,
    probe,
    put_json,
    s3_client,
)
from xrt.log import get_logger
from xrt.units import GB

log = get_logger(__name__)


def namespace_prefix(root: str, namespace_hex: str) -> str:
    """The key prefix of one namespace's objects: the file store's directory name under cache.l2.path."""
    root = root.strip("/")
    return f"{root + '/' if root else ''}{DIR_PREFIX}{namespace_hex[:32]}/"


class ObjStore:
    direct = False  # the writer's stats ask how loads read; O_DIRECT is a file store's

    def __init__(self, args: L2Args, root: str, namespace_hex: str, l1: L1Cache,
                 agent_name: str | None = None) -> None:
        self._lock = threading.Lock()  # guards `entries`; never held across a transfer or a request
        self.l1 = l1
        self.backend = "OBJ"
        self.chunk_bytes = l1.layout.nbytes
        self.limit = max(1, int(args.size_gb * GB) // self.chunk_bytes)
        self.params = dict(args.backend_params)
        self.bucket = bucket_of(self.params)
        self.prefix = namespace_prefix(root, namespace_hex)
        self.entries: dict[str, list[float]] = {}  # key hex -> [crc, last use (unix time)]
        self.stored = self.loaded = self.corrupt = self.late_transfers = 0
        self.last_store_failed = False
        self.error: str | None = None
        self._agents: dict[str, L2Agent] = {}
        self._verify = ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="xrt-kv-verify")
        found = probe(self.params, self.prefix)
        if found is not None:
            # L2 off: every lookup misses and nothing is stored; the requests are served without it
            self.error = f"cache.l2.backend_params: {found[1]}"
            log.warning("%s; the L2 tier stores nothing", self.error)
            return
        self.client = s3_client(self.params)
        try:
            self._list()
        except Exception as e:  # noqa: BLE001  the endpoint went away between the probe and the listing
            self.error = f"cache.l2.backend_params: OBJ: listing {self.prefix} failed: {describe(e)}"
            log.warning("%s; the L2 tier stores nothing", self.error)
            return
        api = nixl_api("OBJ")
        name = agent_name or f"xrt-l2-{temp_tag()}"
        try:
            self._agents = {role: L2Agent(api, f"{name}-{role.lower()}", role, "OBJ", self.params, l1)
                            for role in ROLES}
        except Exception as e:  # NIXL's binding errors: nixl-cu13's OBJ plugin without libcuobjclient
            raise ValueError(f"cache.l2.backend: OBJ: NIXL cannot start this backend here: {e or type(e).__name__}; "
                             "pip install --no-deps nixl-cu12==1.5.1 (its OBJ plugin needs no CUDA library)") from e

    def _list(self) -> None:
        """The namespace's chunks from one listing; objects of the wrong size (a chunk cannot be) deleted."""
        wrong: list[str] = []
        for key, size, modified in list_objects(self.client, self.bucket, self.prefix):
            parsed = parse_data_name(key[len(self.prefix):])
            if parsed is None or "/" in parsed[0]:
                continue
            if size != self.chunk_bytes:
                wrong.append(key)
                continue
            self.entries[parsed[0]] = [parsed[1], modified]
        if wrong:
            self._delete(wrong)
        if self.entries:
            log.info("L2: %d chunks listed under s3://%s/%s", len(self.entries), self.bucket, self.prefix)

    def _name(self, key_hex: str, crc: int) -> str:
        return f"{self.prefix}{data_name(key_hex, crc)}"

    def _delete(self, names: list[str]) -> None:
        try:
            delete_objects(self.client, self.bucket, names)
        except Exception as e:  # noqa: BLE001  left behind: a later listing finds them again (and checks them)
            log.warning("L2: deleting %d objects failed: %s", len(names), describe(e))

    # ------------------------------------------------------------------ lookups

    def contains(self, key: bytes) -> bool:
        return self.holds([key])[0]

    def holds(self, keys: Sequence[bytes]) -> list[bool]:
        with self._lock:
            return [k.hex() in self.entries for k in keys]

    def __len__(self) -> int:
        with self._lock:
            return len(self.entries)

    def sample_keys(self, n: int) -> list[bytes]:
        """Up to n stored keys, the most recently used first (for a bandwidth probe)."""
        with self._lock:
            recent = sorted(self.entries.items(), key=lambda kv: -kv[1][1])[:n]
        return [bytes.fromhex(k) for k, _ in recent]

    def _parallel(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """fn over items on the checksum threads (in this thread once the interpreter is shutting down)."""
        try:
            return list(self._verify.map(fn, items))
        except RuntimeError:
            return [fn(item) for item in items]

    def _transfer(self, role: str, slots: Sequence[int], names: Sequence[str], deadline: float | None = None,
                  on_late: Callable[[], None] | None = None) -> None:
        offsets = [self.l1.slot_offset(s) for s in slots]
        try:
            self._agents[role].transfer(offsets, names, self.chunk_bytes, deadline, on_late)
        except L2Busy:
            raise
        except L2Late:
            self.late_transfers += 1
            raise

    # ------------------------------------------------------------------ stores

    def store(self, items: Sequence[tuple[bytes, int, int | None]]) -> list[bytes]:
        """Write chunks from L1 slots: (key, slot, crc) each (crc None: computed now). Returns the keys
        published now; keys listed already are skipped, and a failed batch publishes nothing."""
        self.last_store_failed = False
        if self.error is not None:
            return []
        with self._lock:
            todo = [(k, s, c) for k, s, c in dict((k, (k, s, c)) for k, s, c in items).values()
                    if k.hex() not in self.entries]
        todo = todo[: self.limit]  # more than the limit at once would only evict part of this batch again
        crcs = self._parallel(lambda t: self.l1.checksum_of(t[0], t[1]) if t[2] is None else t[2], todo)
        todo = [(k, s, c) for (k, s, _), c in zip(todo, crcs, strict=True)]
        if not todo:
            return []
        try:
            self._transfer("WRITE", [s for _, s, _ in todo], [self._name(k.hex(), c) for k, _, c in todo])
        except L2Error as e:
            log.warning("L2 store of %d chunks failed, nothing published: %s", len(todo), e)
            self.last_store_failed = True
            return []
        now = time.time()
        with self._lock:
            for k, _, c in todo:
                self.entries[k.hex()] = [c, now]
            added = {k.hex() for k, _, _ in todo}
            evict: list[str] = []
            if len(self.entries) > self.limit:
                old = sorted((v[1], k) for k, v in self.entries.items() if k not in added)
                for _, k in old[: len(self.entries) - self.limit]:
                    evict.append(self._name(k, int(self.entries.pop(k)[0])))
        if evict:
            self._delete(evict)
        self.stored += len(todo)
        return [k for k, _, _ in todo]

    # ------------------------------------------------------------------ loads

    def load(self, items: Sequence[tuple[bytes, int]], deadline_s: float | None = None,
             on_late: Callable[[], None] | None = None, role: str = "READ") -> LoadResult:
        """Read chunks into L1 slots the caller reserved: (key, slot) each; per item its verified crc32, or
        None for a miss (as L2Store.load, late loads included)."""
        start = time.perf_counter()
        ok: list[int | None] = [None] * len(items)
        if self.error is not None or not items:
            return LoadResult(ok)
        with self._lock:
            want = [(i, k.hex(), int(self.entries[k.hex()][0])) for i, (k, _) in enumerate(items)
                    if k.hex() in self.entries]
        if not want:
            return LoadResult(ok)
        deadline = None if deadline_s is None else start + deadline_s
        try:
            self._transfer(role, [items[i][1] for i, _, _ in want], [self._name(h, c) for _, h, c in want],
                           deadline, on_late)
        except L2Late as e:
            if isinstance(e, L2Busy) and on_late is not None:
                on_late()  # nothing started: the slots are the caller's again now
            log.info("L2 load abandoned: %s", e)
            return LoadResult(ok, time.perf_counter() - start, late=True)
        except L2Error as e:
            log.warning("L2 load of %d chunks failed: %s", len(want), e)
            self._drop_missing(want)
            return LoadResult(ok, time.perf_counter() - start)
        got = self._parallel(lambda w: checksum(self.l1.slot_bytes(items[w[0]][1])), want)
        bad: list[str] = []
        now = time.time()
        with self._lock:
            for (i, key_hex, crc), actual in zip(want, got, strict=True):
                if actual == crc:
                    ok[i] = crc
                    if key_hex in self.entries:
                        self.entries[key_hex][1] = now
                    continue
                log.warning("L2 chunk %s failed its checksum: dropped", key_hex[:16])
                self.corrupt += 1
                self.entries.pop(key_hex, None)
                bad.append(self._name(key_hex, crc))
        if bad:
            self._delete(bad)
        self.loaded += sum(crc is not None for crc in ok)
        return LoadResult(ok, time.perf_counter() - start)

    def _drop_missing(self, want: Sequence[tuple[int, str, int]]) -> None:
        """After a failed batch: the entries whose object is gone (evicted by another process) are dropped, so
        they do not fail the next batch too. The first object the store cannot tell about (the endpoint is
        down) ends the asking: each HEAD then costs the SDK's retries, and the entries stay."""
        gone: list[str] = []
        for _, h, c in want:
            there = exists(self.client, self.bucket, self._name(h, c))
            if there is None:
                break
            if not there:
                gone.append(h)
        if gone:
            with self._lock:
                for h in gone:
                    self.entries.pop(h, None)

    # ------------------------------------------------------------------ measurements

    def read_measurements(self) -> dict[str, Any]:
        """What an earlier process measured with this namespace (policy.py), or {}."""
        if self.error is not None:
            return {}
        return get_json(self.client, self.bucket, self.prefix + MEASUREMENTS)

    def write_measurements(self, data: dict[str, Any]) -> None:
        """Saved for the next process as one small object; failures only logged."""
        if self.error is not None:
            return
        try:
            put_json(self.client, self.bucket, self.prefix + MEASUREMENTS, data)
        except Exception as e:  # noqa: BLE001  costs the next process a first measurement, nothing else
            log.warning("L2: could not save the measurements: %s", describe(e))

    # ------------------------------------------------------------------ housekeeping

    def clear(self) -> None:
        """Delete this namespace's objects: other namespaces under the same bucket stay."""
        if self.error is not None:
            return
        with self._lock:
            self.entries = {}
        with contextlib.suppress(Exception):
            self._delete([k for k, _, _ in list_objects(self.client, self.bucket, self.prefix)])

    def close(self) -> None:
        for a in self._agents.values():
            a.close()  # a late transfer finishes first (its thread holds the lock)
        self._verify.shutdown(wait=True)
