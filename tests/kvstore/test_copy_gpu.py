"""GPU pages <-> pinned L1 slots on the side stream (xrt/kvstore/copy.py), and L2 through NIXL from a pinned
L1. Written on a CPU machine and not run there: the first GPU run checks it (tests/README.md: --gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvstore_support import LAYOUT, key

from xrt.config import L2Args
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.nixl_api import NixlUnavailable

# (store_programs, load_programs): the copy kernel both ways with a few programs, DMA both ways, the defaults
COPIES = [(3, 3), (0, 0), (16, 0)]


@pytest.mark.parametrize(("store", "load"), COPIES)
def test_gather_scatter_on_the_side_stream(device: torch.device, tmp_path: Path, store: int, load: int) -> None:
    kv = torch.randn((LAYOUT.kv.num_layers, 12, 2, 4, 2, 8), device=device).to(LAYOUT.kv.dtype)
    l1 = L1Cache(LAYOUT, 4 * LAYOUT.nbytes)
    assert l1.buffer.is_pinned()
    copier = ChunkCopier(kv, store_programs=store, load_programs=load)
    slot = l1.reserve(key(0))
    # the compute stream writes page 5 just before the gather: the side stream must see it
    kv[:, 5].fill_(3.0)
    done = copier.gather([5, 2], l1.slot_view(slot))
    assert isinstance(done, torch.cuda.Event)
    done.synchronize()
    l1.publish(slot)
    view = l1.slot_view(slot)
    assert torch.equal(view[:, 0], kv[:, 5].cpu()) and torch.equal(view[:, 1], kv[:, 2].cpu())

    try:
        l2 = L2Store(L2Args(), tmp_path, "ab" * 32, l1)
    except NixlUnavailable as e:  # the L1 half above has run; the L2 half needs a NIXL wheel installed
        pytest.skip(str(e))
    assert l2.store([(key(0), slot, None)]) == [key(0)]
    other = l1.reserve(key(1))
    assert l2.load([(key(0), other)]).crcs[0] is not None
    l1.publish(other)
    before = kv.clone()
    done = copier.scatter_chunks([(l1.slot_view(other), [0, 11], "")])
    torch.cuda.current_stream(device).wait_event(done)
    assert torch.equal(kv[:, 0], before[:, 5]) and torch.equal(kv[:, 11], before[:, 2])
    assert torch.equal(kv[:, 1:11], before[:, 1:11])
    l2.close()


def test_copies_go_through_the_cuda_runtime(device: torch.device) -> None:
    """torch's own libcudart is found and used for the strided copies (not the per-layer tensor fallback)."""
    from xrt.kvstore.memcpy import CudaCopy

    kv = torch.zeros((LAYOUT.kv.num_layers, 4, 2, 4, 2, 8), device=device, dtype=LAYOUT.kv.dtype)
    copier = ChunkCopier(kv)
    assert isinstance(copier._copy, CudaCopy) and copier._copy.max_pitch > 0


@pytest.mark.parametrize("load", [0, 5])
def test_a_load_records_each_layer_groups_arrival(device: torch.device, load: int) -> None:
    """scatter_chunks over several chunks (runs, scattered pages, a skipped prefix) equals index_copy_; each
    layer gets its group's event in the arrivals (the same events a graph captures its waits on)."""
    import random

    from xrt.kvcache.device import KVArrivals, KVLayout
    from xrt.kvstore.chunk import ChunkLayout

    layout = ChunkLayout(KVLayout(num_layers=7, page_size=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16), 64)
    pages_total = 64
    kv = torch.randn((7, pages_total, 2, 16, 8, 128), device=device).to(torch.bfloat16)
    want = kv.clone()
    arrivals = KVArrivals(7, device, groups=3)
    copier = ChunkCopier(kv, arrivals, load_programs=load)
    l1 = L1Cache(layout, 3 * layout.nbytes)
    rng = random.Random(0)
    free = list(range(pages_total))
    rng.shuffle(free)
    chunks = []
    for i, skip in enumerate([0, 1, 0]):
        slot = l1.reserve(key(i))
        l1.slot_view(slot).copy_(torch.randn(layout.shape).to(torch.bfloat16))
        n = layout.pages_per_chunk - skip
        pages = sorted(free[:n]) if i != 2 else free[:n]
        free = free[n:]
        view = l1.slot_view(slot)[:, skip:]
        want.index_copy_(1, torch.tensor(pages, device=device), view.to(device))
        chunks.append((view, pages, "l1"))
    done = copier.scatter_chunks(chunks)
    ready = arrivals.take()
    assert ready is not None and arrivals.take() is None
    assert ready == arrivals.graph_waits() and len({id(e) for e in ready}) == 3  # layers 0-1, 2-4, 5-6
    assert ready[0] is ready[1] and ready[2] is ready[3] is ready[4] and ready[5] is ready[6]
    done.synchronize()
    assert torch.equal(kv, want)


@pytest.mark.parametrize("programs", [0, 8])
def test_a_pitch_past_the_devices_largest_copies_row_by_row(device: torch.device, programs: int) -> None:
    """A KV cache of more than 2 GiB a layer (the device's largest cudaMemcpy2D pitch): rows one by one (DMA);
    the copy kernel's int64 row offsets reach past 2**31 words."""
    pages = (2 << 30) // (2 * 16 * 8 * 128 * 2) + 8  # just over 2 GiB a layer, bf16 pages of 64 KiB
    kv = torch.zeros((2, pages, 2, 16, 8, 128), device=device, dtype=torch.bfloat16)
    copier = ChunkCopier(kv, store_programs=programs, load_programs=programs)
    assert kv.stride(0) * 2 > copier._copy.max_pitch  # type: ignore[union-attr]
    slot = torch.randn((2, 3, 2, 16, 8, 128)).to(torch.bfloat16).pin_memory()
    ids = [pages - 3, pages - 2, pages - 1]
    copier.scatter_chunks([(slot, ids, "")]).synchronize()
    assert torch.equal(kv[:, pages - 3 :].cpu(), slot)
    back = torch.zeros_like(slot).pin_memory()
    copier.gather(ids, back).synchronize()
    assert torch.equal(back, slot)
    del kv
    torch.cuda.empty_cache()


def test_a_gather_leaves_the_steps_read_back_alone(device: torch.device) -> None:
    """Gathers write pinned slots with the bounded copy kernel (cache.l1.store_programs, 16): a small read-back on the
    compute stream queued after 32 of them completes before they do (a DMA gather would hold it until the last
    one), and the bytes are right."""
    import time

    kv = torch.randn((28, 1024, 2, 16, 8, 128), device=device).to(torch.bfloat16)
    buf = torch.empty((32, 28, 16, 2, 16, 8, 128), dtype=torch.bfloat16, pin_memory=True)
    copier = ChunkCopier(kv)
    x = torch.ones(4, device=device)
    assert (x * 2).sum().item() == 8.0  # its kernels loaded before the timed read-back (a first load syncs)
    copier.gather(list(range(16)), buf[0]).synchronize()  # and the gather's
    torch.cuda.synchronize()
    dones = [copier.gather(list(range(i * 16, (i + 1) * 16)), buf[i]) for i in range(32)]
    t0 = time.perf_counter()
    assert (x * 2).sum().item() == 8.0
    read_back = time.perf_counter() - t0
    assert not dones[-1].query(), f"the gathers finished within the read-back's {read_back * 1e3:.2f} ms"
    dones[-1].synchronize()
    for i in (0, 17, 31):
        assert torch.equal(buf[i].to(device), kv[:, i * 16 : (i + 1) * 16])
