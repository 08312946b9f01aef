"""Reads for admissions: a request whose prefix continues into chunks L1 does not hold yet (L2 chunks, or chunks
being written into L1 right now) waits in the scheduler's reading state while this rank's `Reader` thread holds
its chunks in L1, in prefix order: a chunk in L1 is acquired, one being written is waited for, L2 runs are read in
batches of cache.l2.load_batch_mb (one NIXL transfer each) into reserved slots, verified and published, kept
referenced. The scheduler never waits on a disk: it polls (`ReadJob.done`) and admits the request once the read is
over, with the leading run of chunks held (`ReadJob.held`); the admission's load copies them up (agent.py).

A read stops at its first chunk that cannot be held (missing, bad checksum, L1 full of referenced chunks), at its
deadline (what recomputing its L2 tokens costs, rank 0's measured policy: a read may only shorten the request's
time to first token), or when the policy no longer finds the rest worth reading after a batch. Stopping early is
not an error: the request computes what was not held. A job cancelled meanwhile (the request aborted) releases
what it held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from xrt.kvstore.jobs import JobThread
from xrt.kvstore.l1 import L1Cache, L1Full
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.policy import LoadPolicy
from xrt.kvstore.prefetch import PREFETCH_WAIT_S
from xrt.kvstore.stats import L1, L2, TierStats
from xrt.log import get_logger

log = get_logger(__name__)


@dataclass
class ReadJob:
    """keys: this rank's chunk keys, in prefix order; deadline: perf_counter time past which nothing more is waited
    for (None: no limit). held: (slot, tier) of the leading chunks held in L1 so far, referenced. done: the read is
    over (held is final until taken)."""

    keys: list[bytes]
    deadline: float | None
    held: list[tuple[int, str]] = field(default_factory=list)
    done: bool = False
    cancelled: bool = False  # what the thread would still hold is released (aborted, or stopped at the deadline)
    stopped: bool = False  # settled at its deadline while the thread still read: held is final
    abandoned: bool = False  # counted in abandoned_loads (once, whoever stops it)
    started: float = field(default_factory=time.perf_counter)

    def left_s(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())


class Reader:
    def __init__(self, l1: L1Cache, l2: L2Store | None, stats: TierStats, load_batch: int, nbytes: int,
                 chunk_tokens: int, policy: LoadPolicy | None, measured: bool) -> None:
        """policy: rank 0's, told the bandwidth of each L2 batch (None: a worker's reader); measured: weigh the rest
        of a read again after each batch (cache.l2.load_policy=measured; else read until the deadline)."""
        self.l1, self.l2, self.stats = l1, l2, stats
        self.load_batch, self.nbytes, self.chunk_tokens, self.policy = load_batch, nbytes, chunk_tokens, policy
        self.measured = measured and policy is not None
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # a job ended
        self._thread = JobThread("xrt-kv-read", self._do, self._failed)

    def submit(self, job: ReadJob) -> None:
        if not self._thread.submit(job):
            self._end(job)  # nothing held: the request computes its prefix

    def wait(self, timeout_s: float) -> None:
        """Return once some job ends, or after timeout_s (an idle engine polling its reads)."""
        with self._ended:
            self._ended.wait(timeout_s)

    def stop(self, job: ReadJob) -> None:
        """The job's deadline passed with the thread still reading (a slow disk): `held` is final from now on, and
        what the thread still brings up is published in L1 but not held."""
        with self._lock:
            job.cancelled = job.stopped = True
        self._abandon(job)

    def _abandon(self, job: ReadJob) -> None:
        """The read stopped short on purpose (deadline, policy): counted once."""
        with self._lock:
            first, job.abandoned = not job.abandoned, True
        self.stats.abandoned_loads += first

    def cancel(self, job: ReadJob) -> None:
        """The job's request is gone: release what it holds now, and what it would still hold."""
        with self._lock:
            job.cancelled = True
            held, job.held = job.held, []
        for slot, _ in held:
            self.l1.release(slot)

    def _do(self, job: ReadJob) -> None:
        try:
            self._read(job)
        finally:
            self._end(job)

    @staticmethod
    def _failed(e: Exception) -> None:
        log.warning("KV tier read failed: %s", e)  # a shorter hit: the request computes the rest

    def _end(self, job: ReadJob) -> None:
        with self._ended:
            job.done = True
            self._ended.notify_all()

    def _hold(self, job: ReadJob, slot: int, tier: str) -> bool:
        """Add a held chunk; False (and released) when the job was cancelled meanwhile."""
        with self._lock:
            if not job.cancelled:
                job.held.append((slot, tier))
                return True
        self.l1.release(slot)
        return False

    def _read(self, job: ReadJob) -> None:
        keys, i = job.keys, 0
        while i < len(keys) and not job.cancelled:
            got = self.l1.acquire(keys[i])
            if got is None and self.l1.writing(keys[i]):
                left = job.left_s()
                got = self.l1.acquire_when_written(keys[i], PREFETCH_WAIT_S if left is None else left)
            if got is not None:
                if not self._hold(job, got[0], L1):
                    return
                i += 1
                continue
            if self.l2 is None or not self.l2.holds([keys[i]])[0]:
                self.stats.failed_loads += 1  # held when matched, gone since (evicted), or never on this rank
                return
            n = self._read_l2(job, i)
            if n == 0:
                return
            i += n

    def _read_l2(self, job: ReadJob, start: int) -> int:
        """Read the next batch of chunks from `start` that L1 lacks from L2 into held slots; how many leading ones
        are now held (0: stop here)."""
        assert self.l2 is not None
        if job.left_s() == 0.0:
            self._abandon(job)  # the deadline passed while earlier chunks were waited for
            return 0
        if job.held and self.measured:
            assert self.policy is not None
            left = len(job.keys) - start
            if not self.policy.worth_loading(left * self.chunk_tokens, left * self.nbytes):
                self._abandon(job)
                return 0
        fresh: list[tuple[bytes, int]] = []
        for key in job.keys[start : start + self.load_batch]:
            if self.l1.contains(key) or self.l1.writing(key):
                break  # held another way: the next round acquires it
            try:
                slot = self.l1.reserve(key)
            except L1Full:
                break
            if slot is None:
                break
            fresh.append((key, slot))
        if not fresh:
            return 0
        aborts: Callable[[], object] = lambda slots=[s for _, s in fresh]: [self.l1.abort(s) for s in slots]  # noqa: E731
        result = self.l2.load(fresh, job.left_s(), on_late=aborts)
        if result.late:
            self._abandon(job)
            return 0
        good = sum(crc is not None for crc in result.crcs)
        self.stats.loaded_bytes[L2] += good * self.nbytes
        self.stats.load_s[L2] += result.seconds
        self.stats.checksum_failures = self.l2.corrupt
        if good == len(fresh) and self.policy is not None:
            self.policy.observe_l2(good * self.nbytes, result.seconds)
        held, complete = 0, True
        for (_, slot), crc in zip(fresh, result.crcs, strict=True):
            if crc is None:
                self.l1.abort(slot)
                complete = False  # the rest is not contiguous with the prefix (a verified chunk still goes to L1)
                continue
            keep = complete and not job.cancelled
            self.l1.publish(slot, crc, keep=keep)  # the rest of the batch is published either way
            if keep and self._hold(job, slot, L2):
                held += 1
        if not complete:
            self.stats.failed_loads += 1
            return 0
        return held if not job.cancelled else 0

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted read is over, at most timeout_s; False when they were not by then."""
        return self._thread.flush(timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """flush (at most timeout_s), then stop the thread."""
        self._thread.close(timeout_s)
