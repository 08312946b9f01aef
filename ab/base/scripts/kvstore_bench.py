"""Measure the KV tiers on this machine: crc32, GPU/CPU pages <-> L1 copies, L1 <-> L2 (NIXL) stores and loads.

    PYTHONPATH=. python scripts/kvstore_bench.py [--chunks 16] [--dir /tmp/kvbench] [--backend GDS]
        [--backend-param use_uring=true] [--load-batch 8] [--drop-cache] [--buffered]

Chunks have the Qwen3-0.6B shape (28 layers, 8 KV heads, head_dim 128, bf16, 256 tokens: 28 MiB each). L2
loads read with O_DIRECT (cache.l2.direct_io; where the filesystem takes it), from the disk, once the kernel
has written the stores' dirty pages back: right after the stores that writeback is in the load's time
(`--drop-cache` syncs first). With `--buffered` loads right after stores read from the page cache;
`--drop-cache` syncs and drops the chunk files from it first (posix_fadvise DONTNEED: no root needed) to time
the disk."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from xrt.config import L2Args, L2Backend
from xrt.kvcache.device import KVLayout
from xrt.kvstore.chunk import ChunkLayout, checksum
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4, help="chunks per NIXL transfer")
    ap.add_argument("--dir", default="")
    ap.add_argument("--backend-param", action="append", default=[])
    ap.add_argument("--drop-cache", action="store_true")
    ap.add_argument("--buffered", action="store_true", help="cache.l2.direct_io=false: loads through the page cache")
    ap.add_argument("--backend", default="POSIX", choices=[b.value for b in L2Backend])
    ap.add_argument("--load-batch", type=int, default=0, help="chunks per load transfer (0: --batch)")
    a = ap.parse_args()
    kv = KVLayout(num_layers=28, page_size=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    layout = ChunkLayout(kv, 256)
    n, nb = a.chunks, layout.nbytes
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pages = torch.randn((kv.num_layers, n * layout.pages_per_chunk, 2, 16, 8, 128), device=device).to(kv.dtype)
    l1 = L1Cache(layout, n * nb)
    copier = ChunkCopier(pages)
    print(f"chunk {nb / 2**20:.1f} MiB x {n}, device {device}")

    slot0 = l1.slot_bytes(0)
    t = time.perf_counter()
    for _ in range(3):
        checksum(slot0)
    print("crc32 (zlib):", gbps(3 * nb, time.perf_counter() - t))

    ids = [list(range(i * layout.pages_per_chunk, (i + 1) * layout.pages_per_chunk)) for i in range(n)]
    slots = [l1.reserve(i.to_bytes(32, "little")) for i in range(n)]
    for which in ("gather pages -> L1", "scatter L1 -> pages"):
        t = time.perf_counter()
        for s, p in zip(slots, ids, strict=True):
            ev = copier.gather(p, l1.slot_view(s)) if which.startswith("gather") else copier.scatter(l1.slot_view(s), p)
            if ev is not None:
                ev.synchronize()
        print(f"{which}:", gbps(n * nb, time.perf_counter() - t))
    t = time.perf_counter()
    for s in slots:
        l1.publish(s)
    crcs = [l1.checksum_of(i.to_bytes(32, "little"), s) for i, s in enumerate(slots)]
    print("crc32 of each chunk:", gbps(n * nb, time.perf_counter() - t))

    root = a.dir or tempfile.mkdtemp(prefix="kvbench-")
    params = dict(p.split("=", 1) for p in a.backend_param)
    args = L2Args(path=root, backend=L2Backend(a.backend), backend_params=params, size_gb=1e3,
                  direct_io=not a.buffered)
    l2 = L2Store(args, root, "be" * 32, l1)
    l2.clear()
    items = [(i.to_bytes(32, "little"), s, c) for i, (s, c) in enumerate(zip(slots, crcs, strict=True))]
    t = time.perf_counter()
    for b in range(0, n, a.batch):
        assert len(l2.store(items[b : b + a.batch])) == len(items[b : b + a.batch])
    print(f"L2 store ({a.batch}/transfer, {params or 'defaults'}):", gbps(n * nb, time.perf_counter() - t))
    if a.drop_cache:
        os.sync()
        for f in l2.dir.glob("*.kv"):
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    t = time.perf_counter()
    lb = a.load_batch or a.batch
    for b in range(0, n, lb):
        assert None not in l2.load([(k, s) for k, s, _ in items[b : b + lb]]).crcs
    how = "O_DIRECT" if l2.direct else "cold" if a.drop_cache else "page cache"
    print(f"L2 load + crc check ({how}):", gbps(n * nb, time.perf_counter() - t))
    l2.clear()
    l2.close()


if __name__ == "__main__":
    main()
