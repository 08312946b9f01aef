"""`KVPeers`: rank 0's side of the KV tiers under tensor parallelism (xrt/kvstore/peers.py's `TierPeers`). Each
operation is one message on the step channel, sent through `TPRunner.send_then` so it is ordered with the
steps and fails like them (a dead worker is a `WorkerFailed`; an error leaves the ranks out of step, and the
runner refuses further calls). The agreements are `min_over_ranks` over the CPU (gloo) group, on the host:
never inside a CUDA graph, and in message order on every rank (a worker runs each collective as it handles
the message that asks for it).

Rank 0 matches prompts against its own tiers only (no message, no collective: a match has no side effect); the
load's agreement is what counts, so a chunk another rank lacks costs a recompute, never a wrong token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import numpy as np

from xrt.distributed.kv_wire import encode_kv_keys, encode_kv_load, encode_kv_store
from xrt.distributed.wire import Kind
from xrt.kvstore.peers import LoadChunk, StoreChunk
from xrt.kvstore.stats import RANK_COUNTERS
from xrt.ops.collectives import min_over_ranks, sum_over_ranks
from xrt.ops.parallel_state import TPState

T = TypeVar("T")


class StepSender(Protocol):
    """What KVPeers needs of rank 0's runner (`TPRunner`): its messages, in order with the steps."""

    tp_state: TPState

    @property
    def closed(self) -> bool: ...

    def send_then(self, kind: Kind, payload: np.ndarray | None, then: Callable[[], T]) -> T: ...


class KVPeers:
    def __init__(self, runner: StepSender) -> None:
        self._runner = runner
        self._tp = runner.tp_state  # the agreements' group

    def store(self, chunks: Sequence[StoreChunk]) -> None:
        self._runner.send_then(Kind.KV_STORE, encode_kv_store(chunks), lambda: None)

    def prefetch(self, keys: Sequence[bytes]) -> None:
        self._runner.send_then(Kind.KV_PREFETCH, encode_kv_keys(keys), lambda: None)

    def load(self, chunks: Sequence[LoadChunk], local: Callable[[], int], deadline_s: float | None = None) -> int:
        # sent first: the other ranks load while rank 0 runs its own load
        return self._runner.send_then(Kind.KV_LOAD, encode_kv_load(chunks, deadline_s),
                                      lambda: min_over_ranks(local(), self._tp))

    def flush(self) -> list[float] | None:
        if self._runner.closed:
            return None  # the workers flushed their writers when they shut down
        # the workers' counters summed, each sent once that rank has flushed: the collective is the barrier too
        # (rank 0 adds zeros: its own are its manager's)
        zeros = [0.0] * len(RANK_COUNTERS)
        return self._runner.send_then(Kind.KV_FLUSH, None, lambda: sum_over_ranks(zeros, self._tp))
