"""What the KV tiers did, counted by the tier connector (connector.py), its reader (reads.py) and its L2 writer:
printed by `xrt run` at the end, recorded in `xrt bench` rows (`as_dict`, flat so two snapshots diff key by key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPU, L1, L2 = "gpu", "l1", "l2"
TIERS = (GPU, L1, L2)
# What a tensor-parallel worker rank's own tiers count (its stores, its L2 writer, its checksums), summed over
# those ranks into rank 0's `other_ranks` at each flush: rank 0 decides hits and loads for every rank, but only
# the workers see their own store failures and bad chunks.
RANK_COUNTERS = ("stored_l1", "stored_l2", "stored_bytes_l2", "dropped_l2", "store_errors", "writer_restarts",
                 "checksum_failures", "failed_loads", "prefetched_chunks")


def _per_tier() -> dict[str, int]:
    return dict.fromkeys(TIERS, 0)


@dataclass
class TierStats:
    """hit_tokens: prefix tokens each tier supplied at admission (what was actually loaded: a chunk that
    failed is not counted); computed_tokens: prompt tokens admitted with no tier holding them (prefilled).
    loaded_bytes / load_s: bytes moved up from L1 and L2 and the seconds the loads took (L2: read and
    verified). skipped_slow: L2 loads the policy did not start, estimated slower than recomputing;
    abandoned_loads: loads stopped part way (slower than estimated, or past their deadline).
    checksum_failures: L2 chunks whose bytes did not match their crc32 (a miss; the file is dropped).
    store_errors: L2 store batches that failed (nothing published); writer_restarts: times the L2 writer
    thread died and was started again; store_queue_max: the deepest the L2 store queue got.
    prefetched_chunks / prefetch_bytes / prefetch_s: L2 chunks read into L1 ahead of admission (prefetch.py)
    and the time the prefetch thread spent on them; prefetch_errors: prefetch jobs that failed. reads / read_wait_s:
    requests that waited in the scheduler's reading state for their prefix to be held in L1 (reads.py), and
    their time there in all (each at most what recomputing the prefix would have cost).
    l2_direct_io: 1 when L2 loads open the chunk files with O_DIRECT, 0 buffered (cache.l2.direct_io, l2.py;
    set by the L2 writer, which holds both). l2_off: why L2 stores nothing, if it does not (the writer sets it).
    other_ranks (parallel.tp > 1): RANK_COUNTERS of the other ranks'
    tiers, summed, as of the last flush (rank 0's own are the fields above)."""

    hit_tokens: dict[str, int] = field(default_factory=_per_tier)
    computed_tokens: int = 0
    lookups: int = 0
    loaded_bytes: dict[str, int] = field(default_factory=lambda: {L1: 0, L2: 0})
    load_s: dict[str, float] = field(default_factory=lambda: {L1: 0.0, L2: 0.0})
    stored_l1: int = 0
    stored_l2: int = 0
    stored_bytes_l2: int = 0
    store_s_l2: float = 0.0
    dropped_l2: int = 0  # chunks the L2 queue had no room for
    failed_loads: int = 0
    skipped_slow: int = 0
    abandoned_loads: int = 0
    checksum_failures: int = 0
    store_errors: int = 0
    writer_restarts: int = 0
    store_queue_max: int = 0
    prefetched_chunks: int = 0
    prefetch_bytes: int = 0
    prefetch_s: float = 0.0
    reads: int = 0
    read_wait_s: float = 0.0
    prefetch_errors: int = 0
    l2_direct_io: int = 0
    store_queue_now: int = 0  # the L2 writer's queue when the counters were last reported (not a count)
    l2_off: str = ""  # "L2 stored nothing: <why>" (an unusable cache.l2.path, failing stores), for summary()
    other_ranks: dict[str, float] | None = None

    def counters(self) -> list[float]:
        """RANK_COUNTERS of these stats, in order (what a worker rank reports)."""
        return [float(getattr(self, name)) for name in RANK_COUNTERS]

    def bandwidth(self, tier: str) -> float | None:
        """Bytes/s of this tier's loads, None before any."""
        s = self.load_s.get(tier, 0.0)
        return self.loaded_bytes[tier] / s if s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"hit_tokens_{t}": n for t, n in self.hit_tokens.items()}
        for t in (L1, L2):
            out[f"loaded_bytes_{t}"] = self.loaded_bytes[t]
            out[f"load_s_{t}"] = self.load_s[t]
        out.update(
            computed_tokens=self.computed_tokens, lookups=self.lookups, stored_chunks_l1=self.stored_l1,
            stored_chunks_l2=self.stored_l2, stored_bytes_l2=self.stored_bytes_l2, store_s_l2=self.store_s_l2,
            dropped_l2=self.dropped_l2, failed_loads=self.failed_loads, skipped_slow=self.skipped_slow,
            abandoned_loads=self.abandoned_loads, checksum_failures=self.checksum_failures,
            store_errors=self.store_errors, writer_restarts=self.writer_restarts,
            store_queue_max=self.store_queue_max, prefetched_chunks=self.prefetched_chunks,
            prefetch_bytes=self.prefetch_bytes, prefetch_s=self.prefetch_s, reads=self.reads,
            read_wait_s=self.read_wait_s,
            prefetch_errors=self.prefetch_errors, l2_direct_io=self.l2_direct_io,
        )
        for name, value in (self.other_ranks or {}).items():
            out[f"other_ranks_{name}"] = value
        return out

    def summary(self) -> str:
        """Two lines for `xrt run`: where prefixes came from, and what moved between the tiers (a third with the
        other tensor-parallel ranks' counters, once a flush brought them)."""
        hits = ", ".join(f"{t} {n}" for t, n in self.hit_tokens.items())

        def moved(t: str) -> str:
            bw = self.bandwidth(t)
            rate = f" at {bw / 1e9:.2f} GB/s" if bw is not None else ""
            return f"{t} {self.loaded_bytes[t] / 1e6:.1f} MB{rate}"

        prefetch_rate = (f" at {self.prefetch_bytes / self.prefetch_s / 1e9:.2f} GB/s"
                         if self.prefetch_s > 0 else "")
        write = (f", {self.stored_bytes_l2 / self.store_s_l2 / 1e9:.2f} GB/s"
                 if self.store_s_l2 > 0 else "")
        return (
            f"kv tiers: prefix tokens cached {hits}, computed {self.computed_tokens} ({self.lookups} lookups) | "
            f"loaded {moved(L1)}, {moved(L2)}\n"
            f"kv tiers: chunks stored l1 {self.stored_l1}, l2 {self.stored_l2}{write} (queue max "
            f"{self.store_queue_max}, now {self.store_queue_now}, dropped {self.dropped_l2}, store errors "
            f"{self.store_errors}, writer restarts {self.writer_restarts}) | L2 loads skipped as slower "
            f"{self.skipped_slow}, abandoned {self.abandoned_loads}, failed {self.failed_loads}, checksum "
            f"failures {self.checksum_failures} | prefetched {self.prefetched_chunks} chunks"
            f"{prefetch_rate} | {self.reads} requests waited {self.read_wait_s * 1e3:.0f} ms for reads"
            + (self._other_ranks_line() if self.other_ranks is not None else "")
            + (f"\nkv tiers: {self.l2_off}" if self.l2_off else "")
        )

    def _other_ranks_line(self) -> str:
        o = {k: int(v) for k, v in (self.other_ranks or {}).items()}
        return (
            f"\nkv tiers, other ranks: chunks stored l1 {o['stored_l1']}, l2 {o['stored_l2']} (dropped "
            f"{o['dropped_l2']}, store errors {o['store_errors']}, writer restarts {o['writer_restarts']}) | "
            f"loads failed {o['failed_loads']}, checksum failures {o['checksum_failures']} | prefetched "
            f"{o['prefetched_chunks']} chunks"
        )
