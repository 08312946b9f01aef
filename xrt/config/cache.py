"""The KV cache's sections of the schema: `cache.*` (`CacheArgs`: the paged GPU cache) and the tiers below it
(`KVTiers`, `cache.l1`: `L1Args`, `cache.l2`: `L2Args`, `L2Backend`, `L2LoadPolicy`)."""

from __future__ import annotations

import enum

import attrs

from xrt.config.limits import INT32_MAX
from xrt.config.problems import Problems
from xrt.reflect import field, ge, gt, in_range, le, power_of_two


class KVTiers(enum.Enum):
    """Where KV chunks live besides the GPU pages (the conf/cache group sets it)."""

    GPU = "gpu"
    L1 = "l1"
    L1_L2 = "l1_l2"


class L2Backend(enum.Enum):
    """NIXL backends L2 can store through: files (POSIX; GDS and GDS_MT for GPUDirect Storage) or S3 objects
    (OBJ: xrt/kvstore/l2_objects.py)."""

    POSIX = "POSIX"
    GDS = "GDS"
    GDS_MT = "GDS_MT"
    OBJ = "OBJ"


class L2LoadPolicy(enum.Enum):
    """When a prefix found in L2 is loaded rather than recomputed."""

    MEASURED = "measured"  # only when loading is measured faster than recomputing; slow loads abandoned
    ALWAYS = "always"  # whatever L2 holds, however long it takes (tests, and measuring the tier itself)


@attrs.define
class L1Args:
    size_gb: float = field(4.0, help="L1 KV tier: host memory (pinned on CUDA) for KV chunks", unit="GB",
                           validator=gt(0))
    store_programs: int = field(
        16, help="thread blocks of the copy kernel that stores chunks GPU -> L1 on CUDA (few: the model keeps the "
        "other SMs); 0: DMA copies, which queue ahead of the steps' own token read-backs", validator=[ge(0), le(4096)]
    )
    load_programs: int = field(
        0, help="thread blocks of the copy kernel that loads chunks L1 -> GPU on CUDA; 0: DMA copies on the copy "
        "engine", validator=[ge(0), le(4096)]
    )


@attrs.define
class L2Args:
    path: str = field("", help="L2 KV tier: directory of the chunk files; empty: <XRT_CACHE_DIR>/kv. With "
                      "backend=OBJ: the key prefix of the chunk objects in the bucket (empty: none)")
    backend: L2Backend = field(
        L2Backend.POSIX, help="NIXL backend L2 transfers through: POSIX files; GDS, GDS_MT: GPUDirect Storage (needs "
        "cuFile on the machine, checked before loading); OBJ: S3 objects (bucket, endpoint and credentials in "
        "backend_params or the AWS environment variables; the store is probed before loading)"
    )
    backend_params: dict[str, str] = field(
        factory=dict, help="passed to the NIXL backend as its init parameters, untouched (e.g. POSIX use_uring: "
        "true; OBJ bucket, endpoint_override, scheme, region, access_key, secret_key, use_virtual_addressing); a key "
        "the backend does not list is refused before loading"
    )
    size_gb: float = field(64.0, help="most bytes of chunk files per model namespace (LRU beyond)", unit="GB",
                           validator=gt(0))
    load_policy: L2LoadPolicy = field(
        L2LoadPolicy.MEASURED,
        help="measured: load a prefix from L2 only when the measured L2 bandwidth beats the measured prefill "
        "rate, abandoning a load that turns out slower (TTFT never worse than recomputing); always: load it",
    )
    load_batch_mb: int = field(256, help="bytes of chunks per L2 read transfer: after each, a slow load can stop",
                               unit="MB", validator=[ge(1), le(2**20)])
    prefetch: bool = field(True, help="read a queued request's L2 prefix into L1 in the background before it is "
                           "admitted (overlapping other requests' compute); with tensor parallelism every rank its own "
                           "shard")
    direct_io: bool = field(True, help="read chunk files with O_DIRECT when the chunk size and L1's slots are "
                            "4096-aligned (else, and where the filesystem refuses it, buffered): reads bypass the "
                            "page cache, which L1 already is, and run at the disk's direct rate (~1.4x buffered on "
                            "the H200 machine); writes stay buffered")
    flush_timeout_s: float = field(60.0, help="longest an engine's close (or the exit of a process that did not close "
                                   "it) waits for the L2 writer to store what is queued; what is left is dropped",
                                   unit="s", validator=gt(0))


@attrs.define
class CacheArgs:
    page_size: int = field(16, help="tokens per KV page", unit="tokens", validator=[power_of_two(), le(2**30)])
    max_memory_utilization: float = field(
        0.9,
        help="fraction of total GPU memory the process may use; KV gets what is left after weights and activations",
        validator=in_range(0.0, 1.0, lo_open=True),
    )
    kv_size_gb: float = field(0.25, help="KV cache size on CPU (GPU sizes from max_memory_utilization)", unit="GB",
                              validator=gt(0))
    num_pages: int = field(
        0, help="explicit number of KV pages; 0: derive from memory", validator=[ge(0), le(INT32_MAX)]
    )
    max_pages_over_need: float = field(
        4.0,
        help="when the KV cache is sized from GPU memory (max_memory_utilization): at most this many times the "
        "pages scheduler.max_num_seqs sequences of model.max_model_len tokens fill. Pages beyond what running "
        "sequences use only hold prefix-cache entries, and millions of them (a tiny model on a large GPU) take "
        "seconds to allocate and zero; 0: no cap. num_pages and kv_size_gb are never capped",
        validator=ge(0),
    )
    prefix_caching: bool = field(True, help="reuse KV pages of identical prompt prefixes")
    tiers: KVTiers = field(KVTiers.GPU, help="KV tiers below the GPU pages: gpu (none), l1 (host memory), "
                           "l1_l2 (and storage through NIXL); needs prefix_caching")
    chunk_tokens: int = field(
        256, help="tokens per KV chunk, the unit the L1/L2 tiers store and key (a multiple of page_size)",
        unit="tokens", validator=[ge(1), le(2**20)]
    )
    l1: L1Args = field(factory=L1Args, help="L1 KV tier (cache=l1, l1_l2)")
    l2: L2Args = field(factory=L2Args, help="L2 KV tier through NIXL (cache=l1_l2)")

    def check(self) -> Problems:
        out: Problems = []
        if self.chunk_tokens % self.page_size:
            out.append(("chunk_tokens",
                        f"must be a multiple of cache.page_size={self.page_size}, got {self.chunk_tokens}"))
        if self.tiers is not KVTiers.GPU and not self.prefix_caching:
            out.append(("prefix_caching", f"cache.tiers={self.tiers.value} stores and finds prefixes: must be true"))
        return out
