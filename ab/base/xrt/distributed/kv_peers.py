"""`KVPeers`: rank 0's side of the KV tiers under tensor parallelism (xrt/kvstore/peers.py's `TierPeers`). Each
operation is one message on the step channel, sent through `TPRunner.send_then` so it is ordered with the
steps and fails like them (a dead worker is a `WorkerFailed`; an error leaves the ranks out of step, and the
runner refuses further calls). The agreements are `min_over_ranks` over the CPU (gloo) group, on the host:
never inside a CUDA graph, and in message order on every rank (a worker runs each collective as it handles
the message that asks for it).

The scheduler may look the same prompt up several times before it admits it (each step, while it waits for
pages): a lookup identical to the previous one, with no store or load sent since, reuses its agreement. The
agreement is only the admission's estimate: the load's own agreement is what counts, so a stale one (another
rank's L2 lost a file meanwhile) costs a recompute, never a wrong token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xrt.distributed.kv_wire import encode_kv_load, encode_kv_lookup, encode_kv_store
from xrt.distributed.wire import Kind
from xrt.kvstore.peers import LoadChunk, StoreChunk
from xrt.kvstore.stats import RANK_COUNTERS
from xrt.ops.collectives import min_over_ranks, sum_over_ranks

if TYPE_CHECKING:
    from xrt.distributed.driver import TPRunner


class KVPeers:
    def __init__(self, runner: TPRunner) -> None:
        self._runner = runner
        self._last: tuple[tuple[bytes, ...], int] | None = None  # the previous lookup's keys and agreement

    def store(self, chunks: Sequence[StoreChunk]) -> None:
        self._last = None
        self._runner.send_then(Kind.KV_STORE, encode_kv_store(chunks), lambda: None)

    def lookup(self, keys: Sequence[bytes]) -> int:
        asked = tuple(keys)
        if self._last is not None and self._last[0] == asked:
            return self._last[1]
        n = self._runner.send_then(Kind.KV_LOOKUP, encode_kv_lookup(keys), lambda: min_over_ranks(len(keys)))
        self._last = (asked, n)
        return n

    def prefetch(self, keys: Sequence[bytes]) -> None:
        # what each rank holds is unchanged (a prefetched chunk was in its L2): the last lookup's agreement stands
        self._runner.send_then(Kind.KV_PREFETCH, encode_kv_lookup(keys), lambda: None)

    def load(self, chunks: Sequence[LoadChunk], local: Callable[[], int], deadline_s: float | None = None) -> int:
        self._last = None
        # sent first: the other ranks load while rank 0 runs its own load
        return self._runner.send_then(Kind.KV_LOAD, encode_kv_load(chunks, deadline_s),
                                      lambda: min_over_ranks(local()))

    def flush(self) -> list[float] | None:
        if self._runner.closed:
            return None  # the workers flushed their writers when they shut down
        # the workers' counters summed, each sent once that rank has flushed: the collective is the barrier too
        # (rank 0 adds zeros: its own are its manager's)
        zeros = [0.0] * len(RANK_COUNTERS)
        return self._runner.send_then(Kind.KV_FLUSH, None, lambda: sum_over_ranks(zeros))
