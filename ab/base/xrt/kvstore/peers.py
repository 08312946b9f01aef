"""What the tiered manager on rank 0 needs from the other tensor-parallel ranks (`parallel.tp` > 1): each rank
holds its own shard of every chunk's KV in its own L1 and L2 (`shard.py`), so rank 0 mirrors its tier
operations to them and agrees with them on how much of a prefix every rank has. Implemented over the step
channel by `xrt.distributed.kv_peers.KVPeers`; None at tp=1. Keys are rank 0's: each rank derives its own
from them (`shard.rank_key`).

A chunk travels as (rank 0's key, its page ids); a load also says how many of its leading pages the GPU hit
shares already (those are not overwritten). Every method is one message, in order with the steps; `lookup`,
`load` and `flush` also end in one collective over the ranks, so no rank ever goes ahead of another; `store`
and `prefetch` need none."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

StoreChunk = tuple[bytes, Sequence[int]]  # (key, page ids)
LoadChunk = tuple[bytes, Sequence[int], int]  # (key, page ids, leading pages to skip)


class TierPeers(Protocol):
    def store(self, chunks: Sequence[StoreChunk]) -> None:
        """Every other rank gathers these chunks' pages into its L1 (and queues them for its L2) unless it
        holds them already."""
        ...

    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading keys every rank holds in its L1 or L2 (rank 0 holds all of `keys`)."""
        ...

    def prefetch(self, keys: Sequence[bytes]) -> None:
        """Every other rank starts reading, in the background, the leading run of these chunks that its L2 holds
        and its L1 does not (a queued request's prefix; prefetch.py)."""
        ...

    def load(self, chunks: Sequence[LoadChunk], local: Callable[[], int], deadline_s: float | None = None) -> int:
        """The other ranks load the chunks into their pages while rank 0 runs `local` (its own load, returning
        how many leading chunks it loaded); returns the leading chunks every rank loaded. deadline_s: how long
        each of their L2 read batches may take (rank 0's policy), past which that rank stops loading there."""
        ...

    def flush(self) -> list[float] | None:
        """Returns once every other rank's L2 writer has written what it was given: their RANK_COUNTERS (stats.py)
        summed, or None when the ranks are gone (they flushed as they shut down)."""
        ...
